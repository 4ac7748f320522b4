#!/bin/sh
# make bench-plot: a PNG of tokens/s by model (weight type), for prefill,
# single-sequence decode and batched decode, from one `tinyloop bench` run.
#   sh tools/bench_plot.sh OUT.png MODEL...   (BENCH_LOG=file reads a saved run)
# Needs gnuplot (Debian gnuplot-nox); installs it as root, else says how.
set -eu
out=${1:?usage: bench_plot.sh OUT.png MODEL...}; shift
if ! command -v gnuplot >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox >/dev/null
    else
        echo "bench-plot: gnuplot missing; run as root:  apt-get install -y gnuplot-nox" >&2
        exit 1
    fi
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
log=${BENCH_LOG:-}
if [ -z "$log" ]; then
    log=$dir/bench.log
    args=""
    for m in "$@"; do args="$args -m $m"; done
    # shellcheck disable=SC2086
    ./bin/tinyloop bench $args | tee "$log"
fi
# The main line of each model: "NAME SIZE MiB prefill(N) X tok/s ... decode Y tok/s ... batch8 decode Z tok/s".
awk '/ prefill\([0-9]+\) / && / decode / {
    name = $1; sub(/\.gguf$/, "", name); sub(/^stories110M-/, "110M ", name)
    p = d = b = 0
    for (i = 1; i < NF; i++) {
        if ($i ~ /^prefill\(/) p = $(i + 1)
        else if ($i == "decode" && $(i - 1) != "batch8" && d == 0) d = $(i + 1)
        else if ($i == "decode" && $(i - 1) == "batch8") b = $(i + 1)
    }
    printf "\"%s\" %s %s %s\n", name, p, d, b
}' "$log" > "$dir/data"
[ -s "$dir/data" ] || { echo "bench-plot: no benchmark lines in $log" >&2; exit 1; }
gnuplot <<GP
set terminal png size 1000,560
set output "$out"
set title "tinyloop: tokens/s by model and weight type ($(date -u +%Y-%m-%d), $(nproc) cores)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set ylabel "tokens/s (log scale)"
set grid ytics
set key top right
set xtics rotate by -20
plot "$dir/data" using 2:xtic(1) title "prefill", "" using 3 title "decode, batch 1", "" using 4 title "decode, batch 8"
GP
echo "bench-plot: wrote $out"
