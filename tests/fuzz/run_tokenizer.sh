#!/bin/sh
# Fuzzes tokenize/detokenize of every shared vocab:
#   sh tests/fuzz/run_tokenizer.sh BINARY SECONDS
#
# Seeds build/fuzz/corpus_tokenizer with llama.cpp's vocab test strings
# (../shared/vocab/*.inp) and a few hostile byte strings, runs libFuzzer for
# SECONDS and exits non-zero when it finds a crash, leak, timeout or OOM.
# Prints one result line; the full log stays in build/fuzz/fuzz_tokenizer.log.
set -u

BIN=${1:?usage: sh tests/fuzz/run_tokenizer.sh BINARY SECONDS}
SECS=${2:-60}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/build/fuzz
CORPUS=$OUT/corpus_tokenizer
SHARED=${TINYLOOP_SHARED:-$ROOT/../shared}

export TINYLOOP_SHARED="$SHARED"

mkdir -p "$CORPUS"

# One seed per test string (the .inp separator is "\n__ggml_vocab_test__\n").
for inp in "$SHARED"/vocab/*.inp; do
    [ -f "$inp" ] || continue
    base=$(basename "$inp" .gguf.inp)
    awk -v dir="$CORPUS" -v base="$base" '
        BEGIN { n = 0; buf = ""; first = 1 }
        $0 == "__ggml_vocab_test__" { f = dir "/" base "-" n; printf "%s", buf > f; close(f); n++; buf = ""; first = 1; next }
        { buf = first ? $0 : buf "\n" $0; first = 0 }
    ' "$inp"
done
printf 'ab\377\303(x\355\240\200y\300\257z\360\237' >"$CORPUS/invalid-utf8"
printf '<|endoftext|><s></s><|im_start|>  \t\n\n   x' >"$CORPUS/specials"

. "$ROOT/tests/fuzz/libfuzz.sh"
fuzz_run fuzz_tokenizer "$BIN" "$SECS" "$CORPUS" 4096
