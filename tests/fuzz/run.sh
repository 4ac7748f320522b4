#!/bin/sh
# Fuzzes the GGUF reader: sh tests/fuzz/run.sh BINARY SECONDS
#
# Seeds build/fuzz/corpus (the shared stories260K model when present, plus
# synthetic files the binary writes itself), runs libFuzzer for SECONDS and
# exits non-zero when it finds a crash, leak, timeout or OOM. Prints one
# result line; the full log stays in build/fuzz/fuzz.log.
set -u

BIN=${1:?usage: sh tests/fuzz/run.sh BINARY SECONDS}
SECS=${2:-60}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/build/fuzz
CORPUS=$OUT/corpus
MODEL=$ROOT/../shared/models/stories260K.gguf

mkdir -p "$CORPUS"

if [ -f "$MODEL" ]; then
    cp "$MODEL" "$CORPUS/stories260K.gguf"
    chmod u+w "$CORPUS/stories260K.gguf"
    export TL_FUZZ_MODEL="$MODEL"
fi
if ! TL_FUZZ_WRITE_SEEDS="$CORPUS" "$BIN" -runs=0 >/dev/null 2>&1; then
    echo "fuzz_gguf: FAILED to write seeds with $BIN"
    exit 2
fi
unset TL_FUZZ_MODEL

# max_len covers the 1.2 MB model (libFuzzer would otherwise cap inputs at 1 MB).
. "$ROOT/tests/fuzz/libfuzz.sh"
fuzz_run fuzz_gguf "$BIN" "$SECS" "$CORPUS" 1300000
