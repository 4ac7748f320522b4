#!/bin/sh
# Fuzzes the spilled KV block format: sh tests/fuzz/run_kv_file.sh BINARY SECONDS
# Seeds build/fuzz/corpus_kv_file with small valid block files the binary
# writes itself, then runs libFuzzer (see libfuzz.sh).
set -u
BIN=${1:?usage: sh tests/fuzz/run_kv_file.sh BINARY SECONDS}
SECS=${2:-60}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CORPUS=$ROOT/build/fuzz/corpus_kv_file
mkdir -p "$CORPUS"
if ! TL_FUZZ_WRITE_SEEDS="$CORPUS" "$BIN" -runs=0 >/dev/null 2>&1; then
    echo "fuzz_kv_file: FAILED to write seeds with $BIN"
    exit 2
fi
. "$ROOT/tests/fuzz/libfuzz.sh"
fuzz_run fuzz_kv_file "$BIN" "$SECS" "$CORPUS" 8192
