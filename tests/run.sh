#!/bin/sh
# Runs test binaries and scripts, shows their output, and adds up their
# summary lines ("N passed, N failed") into one final line. A suite that
# crashes or prints no summary counts as one failure.
#
# Binaries run TL_TEST_JOBS at a time (default: the CPU count, at most 4):
# they name their temporary files by pid, and CI's time limit is tight.
# Scripts (*.sh) run afterwards one at a time: they hold loopback ports and
# run their own binaries through this runner, in lanes of their own.
dir=$1; shift
total_p=0; total_f=0
jobs=${TL_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
case "$jobs" in ''|*[!0-9]*|0) jobs=1 ;; esac
[ "$jobs" -gt 4 ] && jobs=4
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tl_run.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# report NAME OUTPUT_FILE EXIT_STATUS SECONDS: prints the suite's failures and
# its summary, and adds its counts to the totals.
report() {
    name=$1; out=$2; rc=$3; secs=$4
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out" | tail -n 1)
    if [ -z "$line" ]; then
        tail -n 30 "$out"
        echo "== $name: no summary (exit $rc, ${secs} s)"
        total_f=$((total_f + 1)); return
    fi
    p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}
    grep -vE '^[0-9]+ passed, [0-9]+ failed' "$out" | grep -E -A 6 'FAIL|SKIP|ERROR|runtime error|Sanitizer|Failure →|Error →' | head -n 60
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then f=1; echo "== $name: exit $rc"; fi
    echo "== $name: $p passed, $f failed (${secs} s)"
    total_p=$((total_p + p)); total_f=$((total_f + f))
}

# run_one OUT_PREFIX COMMAND: runs a suite, its output to OUT_PREFIX.out and
# "exit-status seconds" to OUT_PREFIX.rc.
run_one='t0=$(date +%s); "$2" >"$1.out" 2>&1; echo "$? $(( $(date +%s) - t0 ))" >"$1.rc"'

n=0
for t in "$@"; do
    case "$t" in *.sh) ;; *) n=$((n + 1)); printf '%s %s\n' "$tmp/$n" "$t" ;; esac
done | xargs -P "$jobs" -L 1 sh -c "$run_one" sh
n=0
for t in "$@"; do
    case "$t" in *.sh) continue ;; esac
    n=$((n + 1))
    rc=1; secs=0
    [ -f "$tmp/$n.rc" ] && read -r rc secs <"$tmp/$n.rc"
    report "$(basename "$t")" "$tmp/$n.out" "$rc" "$secs"
done
for t in "$@"; do
    case "$t" in *.sh) ;; *) continue ;; esac
    sh -c "$run_one" sh "$tmp/script" "$t"
    read -r rc secs <"$tmp/script.rc"
    report "$(basename "$t")" "$tmp/script.out" "$rc" "$secs"
done
echo "$total_p passed, $total_f failed"
[ "$total_f" = 0 ]
