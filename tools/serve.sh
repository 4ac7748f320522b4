#!/bin/sh
# serve.sh - one tinyloop engine instance in the foreground on localhost
# (examples/nginx.conf under a temporary prefix). `make serve`; any GGUF via MODEL=.
#   MODEL=../shared/models/stories260K.gguf PORT=8080 sh tools/serve.sh
# KV_TYPE=q8 (or TINYLOOP_KV_TYPE) picks the KV cache mode (lua/README.md).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEFAULT_MODEL="${TINYLOOP_MODELS:-$HOME/.cache/tinyloop/models}/gemma-3-270m-q4_k_m.gguf"
MODEL=${MODEL:-$DEFAULT_MODEL}
PORT=${PORT:-8080}
if [ "$MODEL" = "$DEFAULT_MODEL" ] && [ ! -f "$MODEL" ]; then
    sh "$ROOT/tools/fetch_model.sh" >/dev/null
fi
[ -f "$MODEL" ] || { echo "serve.sh: model not found: $MODEL" >&2; exit 1; }
command -v nginx >/dev/null || { echo "serve.sh: nginx not installed (sh tools/deps.sh)" >&2; exit 1; }
MODEL=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")
PREFIX=$(mktemp -d "${TMPDIR:-/tmp}/tinyloop-serve.XXXXXX")
trap 'rm -rf "$PREFIX"' EXIT INT TERM
# Workers started by root run as nobody: nginx_prefix.sh makes the checkout,
# the model and the tenant files readable to them (or picks the owner).
set -- "TINYLOOP_MODEL=$MODEL"
for v in TINYLOOP_TENANTS TINYLOOP_TENANTS_POLICY; do
    eval "p=\${$v:-}"
    [ -n "$p" ] && set -- "$@" "$v=$(cd "$(dirname "$p")" && pwd)/$(basename "$p")"
done
SETUP=$(sh "$ROOT/tools/nginx_prefix.sh" "$ROOT" "$PREFIX" "$@")
while IFS= read -r line; do
    case $line in TINYLOOP_*=*) export "$line" ;; esac
done <<EOF
$SETUP
EOF
{ echo "$SETUP" | sed -n 's/^user \(.*\)$/user \1;/p'
  sed -e "s/127\.0\.0\.1:8080/127.0.0.1:$PORT/" -e 's/^daemon on;/daemon off;/' \
    -e 's#^error_log logs/error.log warn;#error_log stderr warn;#' "$ROOT/examples/nginx.conf"
} > "$PREFIX/nginx.conf"
export TINYLOOP_MAX_SEQ_LEN="${MAX_SEQ_LEN:-}"
export TINYLOOP_INSTANCE="${INSTANCE:-serve}"
export TINYLOOP_KV_TYPE="${KV_TYPE:-${TINYLOOP_KV_TYPE:-}}"
URL="http://127.0.0.1:$PORT"
echo "tinyloop serving $MODEL at $URL (Ctrl-C stops)"
echo "  curl -s $URL/v1/chat/completions -H 'Content-Type: application/json' -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}],\"max_tokens\":64}'"
echo "  curl -sN $URL/v1/completions -d '{\"prompt\":\"Once upon a time\",\"max_tokens\":64,\"stream\":true}'"
nginx -p "$PREFIX" -c "$PREFIX/nginx.conf" &
NGINX=$!
trap 'kill -QUIT $NGINX 2>/dev/null; wait $NGINX 2>/dev/null; rm -rf "$PREFIX"; exit 0' INT TERM
wait $NGINX
