#!/bin/sh
# Runs the cache-equivalence tests (cached == uncached, batch == alone,
# pools, beams, resume handles, the engine thread, admission, growth and
# the random-operation property test) again with both KV tiers under the
# arena, chosen through the environment a user sets: a 64 KiB host tier
# (so blocks also overflow to disk) and a fresh disk directory. Every
# evicted prefix then spills and every later match may restore it; each
# equivalence must still hold exactly.
# TL_KV_TEST_DIR: the test binaries (build/tests, or build/tests-asan).
dir=${TL_KV_TEST_DIR:-build/tests}
here=$(dirname "$0")
bins="test_model test_cache test_cache_prop test_window_trim test_gemma test_engine test_beam test_admission test_growth test_resume_sched
      test_engine_msgs test_kv_modes"
paths=""
for b in $bins; do [ -x "$dir/$b" ] && paths="$paths $dir/$b"; done
kv_dir=$(mktemp -d "${TMPDIR:-/tmp}/tl_kv_tiers.XXXXXX") || exit 1
trap 'rm -rf "$kv_dir"' EXIT INT TERM
echo "-- KV tiers from the environment: TINYLOOP_KV_HOST_MEM=64K TINYLOOP_KV_DIR=$kv_dir"
out=$(TINYLOOP_KV_HOST_MEM=64K TINYLOOP_KV_DIR=$kv_dir sh "$here/run.sh" "$dir" $paths 2>&1)
printf '%s\n' "$out" | grep -E '^== |FAIL' | sed "s/^/  /"
line=$(printf '%s\n' "$out" | tail -n 1)
p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}
case "$p$f" in *[!0-9]*|"") p=0; f=1; echo "  no summary" ;; esac
echo "$p passed, $f failed"
[ "$f" = 0 ]
