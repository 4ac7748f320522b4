#!/bin/sh
# Runs the cache-equivalence tests (cached == uncached, batch == alone,
# looped == unrolled, pools, beams, resume handles, the engine thread,
# admission, growth, local layers dropping KV behind their window) again
# in every lossy KV mode, chosen through the environment variables a user
# sets (read when each model opens). Within a mode every equivalence must
# hold exactly; tests that compare with llama.cpp's tokens or size arenas
# in f16 blocks pin f16 themselves.
# TL_KV_TEST_DIR: the test binaries (build/tests, or build/tests-asan).
dir=${TL_KV_TEST_DIR:-build/tests}
here=$(dirname "$0")
bins="test_model test_kv_modes test_window_trim test_resume_sched test_cache test_engine test_beam test_pool_fixes
      test_admission test_growth test_backend test_engine_msgs"
total_p=0; total_f=0
for mode in TINYLOOP_KV_INT8=1 TINYLOOP_KV_INT4=1 TINYLOOP_KV_H_MODE=1 TINYLOOP_KV_INT8=1,TINYLOOP_KV_H_MODE=1 \
            TINYLOOP_KV_INT4=1,TINYLOOP_KV_H_MODE=1; do
    paths=""
    for b in $bins; do [ -x "$dir/$b" ] && paths="$paths $dir/$b"; done
    echo "-- KV mode from the environment: $mode"
    out=$(env $(echo "$mode" | tr , ' ') sh "$here/run.sh" "$dir" $paths 2>&1)
    printf '%s\n' "$out" | grep -E '^== |FAIL' | sed "s/^/  /"
    line=$(printf '%s\n' "$out" | tail -n 1)
    p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}
    case "$p$f" in *[!0-9]*|"") p=0; f=1; echo "  no summary for $mode" ;; esac
    total_p=$((total_p + p)); total_f=$((total_f + f))
done
echo "$total_p passed, $total_f failed"
[ "$total_f" = 0 ]
