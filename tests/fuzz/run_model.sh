#!/bin/sh
# Fuzzes model opening: sh tests/fuzz/run_model.sh BINARY SECONDS
# Seeds build/fuzz/corpus_model with tiny synthetic models the binary writes
# itself, then runs libFuzzer (see libfuzz.sh).
set -u
BIN=${1:?usage: sh tests/fuzz/run_model.sh BINARY SECONDS}
SECS=${2:-60}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CORPUS=$ROOT/build/fuzz/corpus_model
mkdir -p "$CORPUS"
if ! TL_FUZZ_WRITE_SEEDS="$CORPUS" "$BIN" -runs=0 >/dev/null 2>&1; then
    echo "fuzz_model: FAILED to write seeds with $BIN"
    exit 2
fi
. "$ROOT/tests/fuzz/libfuzz.sh"
fuzz_run fuzz_model "$BIN" "$SECS" "$CORPUS" 65536
