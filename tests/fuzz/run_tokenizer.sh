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
ARTIFACTS=$OUT/artifacts_tokenizer
LOG=$OUT/fuzz_tokenizer.log
SHARED=${TINYLOOP_SHARED:-$ROOT/../shared}

export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
export TINYLOOP_SHARED="$SHARED"

mkdir -p "$CORPUS" "$ARTIFACTS"
rm -f "$ARTIFACTS"/*

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

"$BIN" -max_total_time="$SECS" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$ARTIFACTS/" "$CORPUS" >"$LOG" 2>&1
rc=$?

runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOG" | tail -n 1)
found=$(ls "$ARTIFACTS" 2>/dev/null | head -n 1)
if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
    echo "fuzz_tokenizer: FOUND a problem (exit $rc, artifact ${found:-none}); see $LOG"
    exit 1
fi
echo "fuzz_tokenizer: OK, ${runs:-?} runs in ${SECS}s, nothing found, corpus $(ls "$CORPUS" | wc -l) files"
