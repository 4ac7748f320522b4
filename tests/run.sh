#!/bin/sh
# Runs test binaries, shows their output, and adds up their summary lines
# ("N passed, N failed") into one final line. A binary that crashes or
# prints no summary counts as one failure.
dir=$1; shift
total_p=0; total_f=0
for t in "$@"; do
    name=$(basename "$t")
    t0=$(date +%s)
    out=$("$t" 2>&1); rc=$?
    secs=$(( $(date +%s) - t0 ))
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -z "$line" ]; then
        printf '%s\n' "$out" | tail -n 30
        echo "== $name: no summary (exit $rc, ${secs} s)"
        total_f=$((total_f + 1)); continue
    fi
    p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}
    printf '%s\n' "$out" | grep -vE '^[0-9]+ passed, [0-9]+ failed' | grep -E -A 6 'FAIL|SKIP|ERROR|runtime error|Sanitizer|Failure →|Error →' | head -n 60
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then f=1; echo "== $name: exit $rc"; fi
    echo "== $name: $p passed, $f failed (${secs} s)"
    total_p=$((total_p + p)); total_f=$((total_f + f))
done
echo "$total_p passed, $total_f failed"
[ "$total_f" = 0 ]
