#!/bin/sh
# nginx_prefix.sh - prepares an nginx prefix (-p) for a tinyloop engine so its
# workers can read the Lua code, the library and the files the server opens,
# from any checkout. Used by serve.sh (`make serve`) and the integration tests
# (tests/integration/lib.lua start()).
#
#   sh tools/nginx_prefix.sh ROOT PREFIX [NAME=PATH ...]
#
# ROOT is the checkout (or an installed tree with lua/ and build/), PREFIX an
# existing directory; NAME=PATH are the files given to the server through the
# environment (TINYLOOP_MODEL=..., policy files). Prints on stdout, one a line:
#   user NAME GROUP   add "user NAME GROUP;" to nginx.conf (only ever as root)
#   NAME=PATH         the path to give the server for each NAME=PATH argument
# and says on stderr what it chose when that is not the plain case.
#
# Why: nginx started by root runs its workers as `nobody`, which cannot read a
# checkout under a mode 0700 directory (/root/tinyloop, a `mktemp -d` clone)
# and answers 500 "module 'tinyloop.server' not found". Workers never run as
# root unless asked; as root the first of these that works is taken:
#   1. nobody reads everything        -> symlinks to ROOT/lua and ROOT/build
#   2. the checkout's owner (not root) reads everything -> "user OWNER GROUP"
#   3. otherwise a staged copy: lua/ and build/libtinyloop*.so copied into
#      PREFIX, and each unreadable file hard-linked (or copied) into
#      PREFIX/files/NAME/ with mode 0644; edits to the originals (policy hot reload)
#      are then not seen.
# TINYLOOP_WORKER_USER=NAME (e.g. root) skips the choice: "user NAME GROUP"
# with symlinks, for a private checkout whose policies must hot-reload.
set -eu
[ $# -ge 2 ] || { echo "usage: nginx_prefix.sh ROOT PREFIX [NAME=PATH ...]" >&2; exit 2; }
ROOT=$1
PREFIX=$2
shift 2
[ -d "$PREFIX" ] || { echo "nginx_prefix.sh: prefix is not a directory: $PREFIX" >&2; exit 2; }
[ -f "$ROOT/lua/tinyloop/server.lua" ] || { echo "nginx_prefix.sh: no lua/tinyloop/server.lua under $ROOT" >&2; exit 2; }
mkdir -p "$PREFIX/logs" "$PREFIX/tmp"
chmod 755 "$PREFIX"

link_tree() {
    ln -sfn "$ROOT/lua" "$PREFIX/lua"
    ln -sfn "$ROOT/build" "$PREFIX/build"
}

echo_args() {
    for a in "$@"; do
        echo "$a"
    done
}

# Not root: the workers run as this user, who reads its own checkout.
if [ "$(id -u)" != 0 ]; then
    link_tree
    echo_args "$@"
    exit 0
fi

if [ -n "${TINYLOOP_WORKER_USER:-}" ]; then
    g=$(id -gn "$TINYLOOP_WORKER_USER") || { echo "nginx_prefix.sh: TINYLOOP_WORKER_USER: no user '$TINYLOOP_WORKER_USER'" >&2; exit 2; }
    link_tree
    echo "user $TINYLOOP_WORKER_USER $g"
    echo_args "$@"
    exit 0
fi

# can_read USER PATH...: every PATH readable by USER (with its groups).
# (sh has no locals: the loop variable must not be one the callers use.)
can_read() {
    cr_user=$1
    shift
    for cr_path in "$@"; do
        setpriv --reuid="$cr_user" --regid="$(id -g "$cr_user")" --init-groups -- test -r "$cr_path" 2>/dev/null \
            || return 1
    done
}

# The files the workers open, one a line: the code, the library, the arguments.
nl='
'
need="$ROOT/lua/tinyloop/server.lua$nl$PREFIX/."
[ -f "$ROOT/build/libtinyloop.so" ] && need="$need$nl$ROOT/build/libtinyloop.so"
for a in "$@"; do
    p=${a#*=}
    [ -e "$p" ] && need="$need$nl$p"
done
IFS=$nl

# shellcheck disable=SC2086  # $need splits at newlines only
if id nobody >/dev/null 2>&1 && can_read nobody $need; then
    link_tree
    echo_args "$@"
    exit 0
fi

owner=$(stat -c %U "$ROOT")
# shellcheck disable=SC2086
if [ "$owner" != root ] && [ "$owner" != UNKNOWN ] && can_read "$owner" $need; then
    link_tree
    echo "nginx_prefix.sh: nobody cannot read $ROOT; workers run as its owner $owner" >&2
    echo "user $owner $(id -gn "$owner")"
    echo_args "$@"
    exit 0
fi

echo "nginx_prefix.sh: nobody cannot read $ROOT; serving a copy of lua/ and build/ from $PREFIX" \
    "(TINYLOOP_WORKER_USER=root serves the checkout itself)" >&2
rm -rf "$PREFIX/lua" "$PREFIX/build"
cp -R "$ROOT/lua" "$PREFIX/lua"
mkdir -p "$PREFIX/build"
for so in "$ROOT"/build/libtinyloop*.so; do
    [ -f "$so" ] && cp "$so" "$PREFIX/build/"
done
chmod -R a+rX "$PREFIX/lua" "$PREFIX/build"
for a in "$@"; do
    name=${a%%=*}
    p=${a#*=}
    if [ ! -e "$p" ] || can_read nobody "$p"; then
        echo "$a"
        continue
    fi
    case "$p" in
    "$ROOT"/lua/*)
        echo "$name=$PREFIX/lua/${p#"$ROOT"/lua/}"
        continue ;;
    esac
    # One folder per variable keeps the file's name (the model's id is its basename).
    mkdir -p "$PREFIX/files/$name"
    chmod 755 "$PREFIX/files" "$PREFIX/files/$name"
    dst="$PREFIX/files/$name/$(basename "$p")"
    # A hard link costs nothing for a large model, but keeps the file's own
    # mode: it must be readable by others, else a copy.
    if ! { ln "$p" "$dst" 2>/dev/null && can_read nobody "$dst"; }; then
        rm -f "$dst"
        echo "nginx_prefix.sh: copying $p ($(du -h "$p" | cut -f1)) to $dst" >&2
        cp "$p" "$dst"
        chmod 644 "$dst"
    fi
    echo "$name=$dst"
done
