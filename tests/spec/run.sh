#!/bin/sh
# Runs the Busted specs under LuaJIT and the Lua examples, then prints one
# line "N passed, N failed" (busted successes -> passed, failures + errors
# -> failed; each example is one test that passes when it exits 0).
# Exits non-zero when anything failed. Run from anywhere; needs `make`.
cd "$(dirname "$0")/../.." || exit 1
export LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;$PWD/tests/spec/?.lua;;"
if [ ! -f lua/tinyloop/cdef.lua ] || [ engine/tinyloop.h -nt lua/tinyloop/cdef.lua ]; then
    luajit bindings/gen_cdef.lua engine/tinyloop.h lua/tinyloop/cdef.lua || exit 1
fi

# Every spec's helpers.tmpdir() lies under this one directory, removed on exit.
TL_SPEC_TMP=$(mktemp -d "${TMPDIR:-/tmp}/tinyloop-spec.XXXXXX") || exit 1
export TL_SPEC_TMP
trap 'rm -rf "$TL_SPEC_TMP"' EXIT
trap 'exit 130' INT TERM

out=$(busted --lua=luajit -o utfTerminal tests/spec 2>&1); rc=$?
printf '%s\n' "$out" | grep -v -E '^[0-9]+ success(es)? / '
line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ success(es)? / [0-9]+ failures? / [0-9]+ errors? / [0-9]+ pending' | tail -n 1)
if [ -z "$line" ]; then
    echo "== busted: no summary (exit $rc)"
    passed=0; failed=1
else
    passed=$(echo "$line" | sed -E 's/^([0-9]+) success.*/\1/')
    f=$(echo "$line" | sed -E 's/.* ([0-9]+) failures? .*/\1/')
    e=$(echo "$line" | sed -E 's/.* ([0-9]+) errors? .*/\1/')
    pend=$(echo "$line" | sed -E 's/.* ([0-9]+) pending.*/\1/')
    failed=$((f + e))
    if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then failed=1; echo "== busted: exit $rc"; fi
    echo "== busted: $passed passed, $failed failed, $pend pending/skipped"
fi

model=${TINYLOOP_SHARED:-../shared}/models/stories260K.gguf
for ex in examples/*.lua; do
    [ -e "$ex" ] || continue
    if [ ! -f "$model" ]; then
        echo "== $ex: SKIP ($model not found)"
        continue
    fi
    if exout=$(luajit "$ex" "$model" 2>&1); then
        echo "== $ex: ok"
        passed=$((passed + 1))
    else
        printf '%s\n' "$exout" | tail -n 20
        echo "== $ex: FAIL"
        failed=$((failed + 1))
    fi
done

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
