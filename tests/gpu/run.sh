#!/bin/sh
# tests/gpu/run.sh - the one script a machine with an NVIDIA GPU runs
# (under 8 minutes on an H200): builds the library, the CUDA plugin and
# the GPU tests; runs the tests (make test-cuda's binaries: every op
# against the CPU, device sampling against engine/sampler.c, the plugin's
# forward against the CPU engine, greedy/cache/batch equivalence through
# the engine, and the KV tiers through the plugin's kv_io); then
# benchmarks the engine on the GPU and prints a summary:
#   - decode tokens/s at batch 1, 16 and 64, through tl_batch_forward and
#     through requests (device sampling), on a 1.1B-parameter llama-shaped
#     model (Q8_0 and F16) and a stories110M-shaped one;
#   - prefill tokens/s (1,024-token prompt);
#   - TTFT of a 1,536-token prefix + 32 tokens, miss vs hit;
#   - the decode step's achieved weight bandwidth as a fraction of the
#     card's peak (TL_GPU_PEAK_GBS, default 4800 for the H200);
#   - decode tokens/s with CUDA graphs (the default) over without
#     (TINYLOOP_CUDA_GRAPHS=0), at batch 1 and 16: whether they pay off.
# Logs go to build/gpu-*.log. Exit status 0 when every test passed.
# Where the project cannot be built (no PCRE2 headers), it runs the
# binaries that `make gpu-bundle` made on another machine (same CUDA major
# version) and that were copied here, paths as it prints them.
set -u
cd "$(dirname "$0")/../.." || exit 1
command -v nvcc >/dev/null 2>&1 || PATH="$PATH:/usr/local/cuda/bin"
export PATH
mkdir -p build/bench
peak=${TL_GPU_PEAK_GBS:-4800}
jobs=$(nproc 2>/dev/null || echo 2)
t0=$(date +%s)
echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"

tests="build/tests/test_cuda_ops build/tests/test_cuda_graph build/tests/test_cuda_sample build/tests/test_cuda_forward build/tests/test_cuda_e2e build/tests/test_cuda_tiers"
# A machine without the PCRE2 headers (or TL_GPU_NO_BUILD=1) runs binaries
# built elsewhere with `make gpu-bundle` and carried here.
if [ "${TL_GPU_NO_BUILD:-0}" = 1 ] ||
    ! printf '#include <pcre2.h>\n' | cc -DPCRE2_CODE_UNIT_WIDTH=8 -E -x c - >/dev/null 2>&1; then
    echo "== prebuilt binaries (make gpu-bundle)"
    for f in bin/tinyloop bin/tl-gen-model build/libtinyloop-cuda.so $tests; do
        [ -x "$f" ] || [ -f "$f" ] || { echo "missing $f: run make gpu-bundle where the project builds and carry its paths"; echo "0 passed, 1 failed"; exit 1; }
    done
else
    echo "== build (make -j$jobs all cuda + GPU tests)"
    if ! make -j"$jobs" all cuda $tests >build/gpu-build.log 2>&1; then
        tail -n 40 build/gpu-build.log
        echo "BUILD FAILED (see build/gpu-build.log)"
        echo "0 passed, 1 failed"
        exit 1
    fi
fi
[ -d ../shared ] || { [ -d build/shared ] && export TINYLOOP_SHARED=build/shared; }
# cuBLAS where the plugin's rpath (the build machine's toolkit) may not point:
# this machine's toolkit, or the wheel a Python stack ships it in.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    "$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null)"; do
    [ -n "$d" ] && ls "$d"/libcublas.so* >/dev/null 2>&1 && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH
t1=$(date +%s)
echo "build: $((t1 - t0)) s"

# Each test binary, bounded; --bench adds the kernel timings (BENCH lines).
total_p=0; total_f=0
for t in $tests; do
    name=$(basename "$t")
    log=build/gpu-$name.log
    timeout "${TL_GPU_TEST_TIMEOUT:-240}" "$t" --bench >"$log" 2>&1
    rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    grep -E '^(device|SKIP|FAIL|  )' "$log" | head -n 40
    if [ -z "$line" ]; then
        tail -n 20 "$log"
        [ "$rc" = 124 ] && echo "TIMEOUT"
        line="0 passed, 1 failed"
    fi
    p=${line%% passed*}; f=${line##*passed, }; f=${f%% failed*}
    [ "$rc" != 0 ] && [ "$f" = 0 ] && f=1
    echo "== $name: $p passed, $f failed ($log)"
    total_p=$((total_p + p)); total_f=$((total_f + f))
done
t2=$(date +%s)

if grep -q '^SKIP: no CUDA device' build/gpu-test_cuda_ops.log; then
    echo "== no CUDA device: benchmarks skipped"
    echo "$total_p passed, $total_f failed"
    [ "$total_f" = 0 ]
    exit
fi
echo "== engine benchmarks on the GPU"
gen() { # file type dim layers heads kv_heads ff
    [ -f "$1" ] || ./bin/tl-gen-model "$1" --type "$2" --vocab 32000 --dim "$3" --layers "$4" --heads "$5" \
        --kv-heads "$6" --ff "$7" --ctx 4096 >/dev/null
}
big_q8=build/bench/llama1b-q8_0.gguf; big_f16=build/bench/llama1b-f16.gguf
small=build/bench/stories110M-q8_0.gguf
gen $big_q8 q8_0 2048 16 16 8 5632 && gen $big_f16 f16 2048 16 16 8 5632 && gen $small q8_0 768 12 12 12 2048
blog=build/gpu-bench.log
: >"$blog"
export TINYLOOP_BACKEND=cuda
for b in 16 64; do
    timeout 150 ./bin/tinyloop bench -m $big_q8 -m $big_f16 -m $small --batch $b -n 64 --prompt-len 1024 >>"$blog" 2>&1 ||
        echo "bench --batch $b failed (exit $?)" >>"$blog"
done
timeout 120 ./bin/tinyloop bench cache -m $small --max-seq-len 2048 >>"$blog" 2>&1 || echo "bench cache failed (exit $?)" >>"$blog"
nglog=build/gpu-bench-nographs.log
TINYLOOP_CUDA_GRAPHS=0 timeout 120 ./bin/tinyloop bench -m $big_q8 -m $small --batch 16 -n 64 --prompt-len 1024 >"$nglog" 2>&1 ||
    echo "bench without graphs failed (exit $?)" >>"$nglog"
unset TINYLOOP_BACKEND
t3=$(date +%s)

echo "== summary"
grep -hE '^BENCH' build/gpu-test_cuda_*.log
grep -vE '^  radix' "$blog"
# decode bandwidth: "(X GB/s of weights)" at batch 1 over the peak
grep -oE '^[^ ]+ .*decode +[0-9.]+ tok/s \([0-9.]+ GB/s' "$blog" | awk -v peak="$peak" '{
    n = split($0, a, " "); gbs = a[n - 1]; sub(/^\(/, "", gbs); name = a[1]
    printf "decode bandwidth %-28s %7.1f GB/s = %4.1f%% of %d GB/s\n", name, gbs, 100 * gbs / peak, peak }'
# CUDA graphs: "decode X tok/s" (batch 1) and "batch16 decode Y tok/s", with over without
for m in $big_q8 $small; do
    n=$(basename "$m")
    pick() { grep -E "^$n .*batch16 decode" "$1" | head -n 1 |
        sed -nE 's/.* decode +([0-9.]+) tok\/s .*batch16 decode +([0-9.]+) tok\/s.*/\1 \2/p'; }
    echo "$n $(pick "$blog") $(pick "$nglog")" | awk 'NF == 5 && $4 > 0 && $5 > 0 {
        printf "CUDA graphs %-28s decode b1 %8.1f vs %8.1f tok/s = %.2fx, b16 %8.1f vs %8.1f = %.2fx\n",
            $1, $2, $4, $2 / $4, $3, $5, $3 / $5 }
        NF != 5 { printf "CUDA graphs %-28s no figures (see the bench logs)\n", $1 }'
done
echo "elapsed: build $((t1 - t0)) s, tests $((t2 - t1)) s, benchmarks $((t3 - t2)) s, total $((t3 - t0)) s"
echo "$total_p passed, $total_f failed"
[ "$total_f" = 0 ]
