#!/bin/sh
# Integration tests: real nginx processes on loopback ports (stories260K).
# Prints "N passed, N failed" and exits non-zero on a failure. Skips (passes)
# with a message when nginx, the Lua module or ../shared is absent.
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
MODEL=${TINYLOOP_TEST_MODEL:-${TINYLOOP_SHARED:-$ROOT/../shared}/models/stories260K.gguf}
skip() { echo "integration: skipped ($1)"; echo "0 passed, 0 failed"; exit 0; }
command -v nginx >/dev/null 2>&1 || skip "nginx not installed: sh tools/deps.sh"
[ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ] || skip "libnginx-mod-http-lua not installed"
command -v luajit >/dev/null 2>&1 || skip "luajit not installed"
luajit -e 'require "posix.sys.socket"; require "cjson"' 2>/dev/null || skip "lua-posix / lua-cjson missing"
[ -f "$MODEL" ] || skip "no $MODEL"
[ -f build/libtinyloop.so ] || { echo "integration: build/libtinyloop.so missing (make all)"; echo "0 passed, 1 failed"; exit 1; }
passed=0; failed=0
for t in tests/integration/test_*.lua; do
    echo "== $t"
    out=$(timeout 600 luajit "$t" 2>&1); rc=$?
    echo "$out"
    line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
    if [ -n "$line" ]; then
        passed=$((passed + $(echo "$line" | cut -d' ' -f1)))
        failed=$((failed + $(echo "$line" | cut -d' ' -f3)))
    fi
    if [ $rc -ne 0 ] && { [ -z "$line" ] || [ "$(echo "$line" | cut -d' ' -f3)" = 0 ]; }; then
        echo "FAIL $t exited with $rc"; failed=$((failed + 1))
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
