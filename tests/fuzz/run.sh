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
ARTIFACTS=$OUT/artifacts
LOG=$OUT/fuzz.log
MODEL=$ROOT/../shared/models/stories260K.gguf

# The Makefile builds with recoverable UBSan; make any report fatal so it counts.
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

mkdir -p "$CORPUS" "$ARTIFACTS"
rm -f "$ARTIFACTS"/*

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
"$BIN" -max_total_time="$SECS" -max_len=1300000 -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$ARTIFACTS/" "$CORPUS" >"$LOG" 2>&1
rc=$?

runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOG" | tail -n 1)
found=$(ls "$ARTIFACTS" 2>/dev/null | head -n 1)
if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
    echo "fuzz_gguf: FOUND a problem (exit $rc, artifact ${found:-none}); see $LOG"
    exit 1
fi
echo "fuzz_gguf: OK, ${runs:-?} runs in ${SECS}s, nothing found, corpus $(ls "$CORPUS" | wc -l) files"
