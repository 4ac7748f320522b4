#!/bin/sh
# Installs the Debian packages tinyloop's build and tests need, when run as
# root; otherwise prints the one apt-get line to run. Quiet when all present.
PKGS="gcc make libc6-dev clang libclang-rt-14-dev libpcre2-dev python3 python3-pip luajit2 lua-busted lua-cjson lua-check lua-readline tmux"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    echo "tinyloop: installing missing packages:$missing"
    export DEBIAN_FRONTEND=noninteractive
    (apt-get update -qq && apt-get install -y -qq $missing) >/dev/null || {
        echo "tinyloop: apt-get install failed for:$missing" >&2
        exit 1
    }
else
    echo "tinyloop: missing packages; run as root:  apt-get install -y$missing" >&2
    exit 1
fi
