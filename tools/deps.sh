#!/bin/sh
# Installs the Debian packages tinyloop's build and tests need, when run as
# root; otherwise prints the one apt-get line to run. Quiet when all present.
#   sh tools/deps.sh           install what is missing (root), else print the line
#   sh tools/deps.sh --check   never install: print the line and fail if missing
CHECK_ONLY=""
[ "${1:-}" = "--check" ] && CHECK_ONLY=1
PKGS="gcc g++ make libc6-dev clang libclang-rt-14-dev libpcre2-dev python3 python3-pip luajit2 lua-busted lua-cjson lua-check lua-readline pkg-config tmux nginx libnginx-mod-http-lua lua-resty-core lua-posix"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ -z "$CHECK_ONLY" ] && [ "$(id -u)" = 0 ]; then
    echo "tinyloop: installing missing packages:$missing"
    export DEBIAN_FRONTEND=noninteractive
    # Packages such as nginx start their service on install; the tests run
    # their own instances, so keep services from starting (exit 101 = deny).
    tmp_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && tmp_policy=1
    fi
    (apt-get update -qq && apt-get install -y -qq $missing) >/dev/null
    rc=$?
    [ -n "$tmp_policy" ] && rm -f /usr/sbin/policy-rc.d
    if [ $rc != 0 ]; then
        echo "tinyloop: apt-get install failed for:$missing" >&2
        exit 1
    fi
else
    if [ -n "$CHECK_ONLY" ]; then
        echo "tinyloop: missing packages; install them (make deps as root) or run:  apt-get install -y$missing" >&2
    else
        echo "tinyloop: missing packages; run as root:  apt-get install -y$missing" >&2
    fi
    exit 1
fi
