# libfuzz.sh - sourced by the fuzz runners: fuzz_run NAME BINARY SECONDS
# CORPUS MAX_LEN runs libFuzzer over CORPUS for SECONDS, then prints one
# result line and returns non-zero when it found a crash, leak, timeout or
# OOM (the full log stays in build/fuzz/NAME.log).
fuzz_run() {
    name=$1; bin=$2; secs=$3; corpus=$4; max_len=$5
    out=$(dirname "$corpus")
    artifacts=$out/artifacts_$name
    log=$out/$name.log
    mkdir -p "$artifacts"
    rm -f "$artifacts"/*
    # The Makefile builds with recoverable UBSan; make any report fatal so it counts.
    UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}" \
        "$bin" -max_total_time="$secs" -max_len="$max_len" -rss_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    found=$(ls "$artifacts" 2>/dev/null | head -n 1)
    if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
        echo "$name: FOUND a problem (exit $rc, artifact ${found:-none}); see $log"
        return 1
    fi
    echo "$name: OK, ${runs:-?} runs in ${secs}s, nothing found, corpus $(ls "$corpus" | wc -l) files"
}
