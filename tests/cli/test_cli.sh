#!/bin/sh
# CLI checks: greedy generation through bin/tinyloop reproduces llama.cpp's
# reference ids for every prompt, with f16 and f32 KV; tokenize/info work;
# bad input gives a clear message and a non-zero exit.
cd "$(dirname "$0")/../.."
BIN=./bin/tinyloop
SHARED=${TINYLOOP_SHARED:-../shared}
MODEL=$SHARED/models/stories260K.gguf
REF=$SHARED/ref/stories260K_greedy.json
pass=0; fail=0
check() { # check "sentence" command-status
    if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $1"; fi
}
if [ ! -f "$MODEL" ] || [ ! -f "$REF" ]; then
    echo "SKIP CLI reference tests: $MODEL not found"
else
    # one line per case: prompt<TAB>prompt ids<TAB>gen ids
    python3 - "$REF" > /tmp/tl_cli_ref.$$ <<'PY'
import json, sys
for c in json.load(open(sys.argv[1])):
    print("\t".join([c["prompt"], " ".join(map(str, c["prompt_ids"])), " ".join(map(str, c["gen_ids"]))]))
PY
    while IFS="$(printf '\t')" read -r prompt pids gids; do
        for kv in f16 f32; do
            out=$($BIN generate -m "$MODEL" -p "$prompt" -n 48 --kv $kv --ids)
            got_p=$(printf '%s\n' "$out" | sed -n 1p); got_g=$(printf '%s\n' "$out" | sed -n 2p)
            [ "$got_p" = "$pids" ] && [ "$got_g" = "$gids" ]
            check "CLI generate '$prompt' (--kv $kv) equals the reference ids" $?
        done
        got=$($BIN tokenize -m "$MODEL" -p "$prompt" --ids)
        [ "$got" = "$pids" ]
        check "CLI tokenize '$prompt' prints the reference ids" $?
    done < /tmp/tl_cli_ref.$$
    rm -f /tmp/tl_cli_ref.$$
    text=$($BIN generate -m "$MODEL" -p "Once upon a time" -n 48)
    case "$text" in "Once upon a time, there was a little girl named Lily."*) r=0 ;; *) r=1 ;; esac
    check "CLI generate prints text by default" $r
    $BIN info "$MODEL" | grep -q "arch          llama"
    check "CLI info names the architecture" $?
    err=$($BIN generate -m "$MODEL" -p "Once upon a time" -n 200 2>&1); r=$?
    [ $r != 0 ] && printf '%s' "$err" | grep -q "exceeds max_seq_len 128"
    check "CLI reports prompt + max_tokens past max_seq_len" $?
    $BIN generate -m "$MODEL" -p "Once upon a time" -n 200 --max-seq-len 512 --ids >/dev/null
    check "CLI --max-seq-len 512 lifts the file's 128" $?
    err=$($BIN generate -m "$MODEL" -p "Once" -n 2 --repack fast 2>&1); r=$?
    [ $r != 0 ] && printf '%s' "$err" | grep -q 'repack: expected "on", "off" or "bf16", got "fast"'
    check "CLI --repack fast is refused, naming the value and the choices" $?
    # the main line anchor-compare.sh reads (prefill, then the first
    # "decode N tok/s": llama-bench's tg, from an empty context) and the
    # phase lines of the prefill, the decode after it and the batch
    out=$($BIN bench -m "$MODEL" -t 1 -n 8 --prompt-len 32 --batch 4 2>&1); r=$?
    line=$(printf '%s\n' "$out" | tail -n 1)
    [ $r = 0 ] && printf '%s' "$line" | grep -qE 'prefill\(32\) +[0-9.]+ tok/s .* decode +[0-9.]+ tok/s \([0-9.]+ GB/s of weights; after the prompt [0-9.]+ tok/s\) +batch4 decode' &&
        [ "$(printf '%s\n' "$out" | grep -cE 'phases of (one prefill\(32\)|8 decode steps after it|decode steps of 4 sequences): +matmul')" = 3 ] &&
        printf '%s\n' "$out" | grep -qE 'batch bound: prefill\(32\) [0-9.]+ tok/s / one sequence [0-9.]+ tok/s = [0-9.]+x; at the prefill.s multiply-add rate with a logits row a sequence [0-9.]+x; batch4 reached [0-9.]+x of that$'
    check "CLI bench prints prefill, decode from empty and after the prompt, batch, three phase lines and the batch bound" $?
    out=$($BIN bench cache -m "$MODEL" -t 1 2>&1); r=$?
    [ $r = 0 ] && ! printf '%s' "$out" | grep -q "exceeds" && printf '%s' "$out" | grep -q "multi-turn chat, 8 conversations x 3 turns"
    check "CLI bench cache sizes its chat to a 128-token model (no errors, 3 turns)" $?
    err=$($BIN bench cache -m "$MODEL" -t 1 --max-seq-len 64 2>&1); r=$?
    [ $r != 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && printf '%s' "$err" | grep -q "max_seq_len 64 .* too short"
    check "CLI bench cache fails with one message for a model too short for it" $?
    out=$($BIN bench kv -m "$MODEL" --only mem 2>&1); r=$?
    [ $r = 0 ] && [ "$(printf '%s\n' "$out" | grep -cE '^  (f16|f32|q8|q4|q8,f16|h|h:q8) +[0-9]+ +[0-9]+ ')" = 7 ] &&
        printf '%s' "$out" | grep -qE '^  q8 +400 +655 '
    check "CLI bench kv --only mem prints bytes/token and 256 MiB sequences for the 7 modes (q8: 400, 655)" $?
    out=$($BIN bench kv -m "$MODEL" --only quality -n 4 --ppl-chunks 1 --ppl-score 16 2>&1); r=$?
    [ $r = 0 ] && printf '%s' "$out" | grep -qE '^  q8 +[0-9]+\.[0-9]{3} +[01]\.[0-9]{4} '
    check "CLI bench kv --only quality prints q8's perplexity and its ratio to f16" $?
    # auto backend on a machine with no NVIDIA device node: the CUDA plugin
    # (a ~600 MB library) is not even loaded; LD_DEBUG=files names each dlopen
    if [ -f build/libtinyloop-cuda.so ] && ! ls /dev/nvidiactl /dev/nvidia0 /dev/dxg >/dev/null 2>&1; then
        out=$(env -u TINYLOOP_BACKEND -u TINYLOOP_CUDA_LIB LD_DEBUG=files $BIN generate -m "$MODEL" -p "Once" -n 2 2>&1); r=$?
        [ $r = 0 ] && ! printf '%s' "$out" | grep -q "libtinyloop-cuda"
        check "CLI with no NVIDIA device node does not load the CUDA plugin" $?
    fi
fi
err=$($BIN generate -m /nonexistent.gguf -p x 2>&1); r=$?
[ $r != 0 ] && printf '%s' "$err" | grep -q "/nonexistent.gguf"
check "CLI names a missing model file" $?
err=$($BIN generate -m x -p y -n abc 2>&1); r=$?
[ $r != 0 ] && printf '%s' "$err" | grep -q "expects an integer, got 'abc'"
check "CLI rejects a non-integer -n" $?
err=$($BIN bench kv --only nothing 2>&1); r=$?
[ $r = 2 ] && printf '%s' "$err" | grep -q "only takes mem, quality, speed"
check "CLI bench kv rejects an unknown --only section" $?
echo "$pass passed, $fail failed"
[ $fail = 0 ]
