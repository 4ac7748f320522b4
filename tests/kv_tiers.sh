#!/bin/sh
# Runs the cache-equivalence tests (cached == uncached, batch == alone,
# pools, beams, resume handles, the engine thread, admission, growth and
# the random-operation property test) again with both KV tiers under the
# arena, chosen through the environment a user sets: a 64 KiB host tier
# (so blocks also overflow to disk) and a fresh disk directory per binary.
# Every evicted prefix then spills and every later match may restore it;
# each equivalence must still hold exactly.
# TL_KV_TEST_DIR: the test binaries (build/tests, or build/tests-asan).
dir=${TL_KV_TEST_DIR:-build/tests}
here=$(dirname "$0")
bins="test_gemma test_model test_kv_modes test_window_trim test_cache test_cache_prop test_engine test_beam test_admission
      test_growth test_resume_sched test_engine_msgs"
kv_dir=$(mktemp -d "${TMPDIR:-/tmp}/tl_kv_tiers.XXXXXX") || exit 1
trap 'rm -rf "$kv_dir"' EXIT INT TERM
# The runner runs binaries side by side: each gets a disk tier of its own
# (a wrapper named like it sets the directory), so no binary finds another's
# spilled blocks and every count a test checks stays its own.
abs=$(cd "$dir" && pwd)
mkdir "$kv_dir/bin"
paths=""
for b in $bins; do
    [ -x "$dir/$b" ] || continue
    mkdir "$kv_dir/$b"
    printf '#!/bin/sh\nTINYLOOP_KV_DIR="%s" exec "%s"\n' "$kv_dir/$b" "$abs/$b" >"$kv_dir/bin/$b"
    chmod +x "$kv_dir/bin/$b"
    paths="$paths $kv_dir/bin/$b"
done
echo "-- KV tiers from the environment: TINYLOOP_KV_HOST_MEM=64K TINYLOOP_KV_DIR=$kv_dir/<test>"
out=$(TINYLOOP_KV_HOST_MEM=64K sh "$here/run.sh" "$dir" $paths 2>&1)
printf '%s\n' "$out" | grep -E '^== |FAIL' | sed "s/^/  /"
line=$(printf '%s\n' "$out" | tail -n 1)
p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}
case "$p$f" in *[!0-9]*|"") p=0; f=1; echo "  no summary" ;; esac
echo "$p passed, $f failed"
[ "$f" = 0 ]
