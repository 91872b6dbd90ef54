#!/bin/sh
# bench_peer_prefill.sh — prompt throughput of deltafin against llama.cpp's llama-bench on the
# same BF16 weights (bench/peer_qwen3.py writes both files), alternated round by round.
# usage: bench/bench_peer_prefill.sh LLAMA_BENCH ROUNDS THREADS DIR... > LOG
#   LLAMA_BENCH: llama.cpp's llama-bench (built as bench/results/engine.md says, in an ignored
#   folder); THREADS: e.g. "1 2"; each DIR holds config.json, model.safetensors and model.gguf.
# One line per run: "deltafin|llama.cpp DIR threads T pp512 TOK/S". Timing only; never a test.
set -e
LB=$1 R=$2 TH=$3
shift 3
D=${DELTAFIN:-./deltafin}
# 512 prompt ids, the same for every run (llama-bench draws its own random ids; with random
# weights the content does not change the work)
IDS=$(awk 'BEGIN { s = 7; for (i = 0; i < 512; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), 100 + s % 30000 } }')
echo "# $(date -u +%FT%TZ) $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2), deltafin $(git rev-parse --short HEAD)"
for r in $(seq 1 "$R"); do
    for dir in "$@"; do
        for t in $TH; do
            s=$($D run --model "$dir" --threads "$t" --tokens "$IDS" --max-new 1 --print-ids --stats 2>&1 >/dev/null |
                sed -n 's/.*prompt 512 tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p')
            echo "deltafin $dir threads $t pp512 $s"
            l=$("$LB" -m "$dir/model.gguf" -p 512 -n 0 -t "$t" -r 1 -o csv 2>/dev/null | tail -1 |
                awk -F, '{ gsub(/"/, ""); print $(NF - 1) }')
            echo "llama.cpp $dir threads $t pp512 $l"
        done
    done
done
