#!/usr/bin/env bash
# bench/bench_cuda_ab.sh A_DELTAFIN B_DELTAFIN WORKDIR [ROUNDS] [PROMPT] [NEW] — two CUDA builds
# alternated on whole passes of `synth --preset k3-wide --size-gb 6` (K3's layer kinds, 17.5 MB MXFP4
# experts, every weight in VRAM): each round runs A then B, `run --device cuda` with a PROMPT-token
# prompt (default 16) and NEW decoded tokens (default 64), --stats' prompt and decode lines, and
# checks that both builds generated the same ids. Timing only (bench/results/cuda.md).
set -euo pipefail
a=${1:?usage: bench/bench_cuda_ab.sh A_DELTAFIN B_DELTAFIN WORKDIR [ROUNDS] [PROMPT] [NEW]}
b=${2:?}
work=${3:?}
rounds=${4:-2}
prompt=${5:-16}
new=${6:-64}
mkdir -p "$work"
[ -f "$work/kw/config.json" ] || "$a" synth --preset k3-wide --size-gb 6 --out "$work/kw" >/dev/null
ids=$(seq 1 "$prompt" | awk '{ printf "%s%d", (NR > 1 ? "," : ""), ($1 * 7919) % 32000 + 1 }')
for r in $(seq 1 "$rounds"); do
  for side in A B; do
    bin=$a; [ $side = B ] && bin=$b
    "$bin" run --model "$work/kw" --device cuda --tokens "$ids" --max-new "$new" --draft none --print-ids --stats \
      >"$work/ids-$side" 2>"$work/stats-$side" || { cat "$work/stats-$side"; exit 1; }
    echo "round $r $side: $(grep -E 'prompt .* tokens in|generated .* tokens, decode' "$work/stats-$side" | tr '\n' ' ')"
  done
  cmp -s "$work/ids-A" "$work/ids-B" || { echo "generated ids DIFFER"; exit 1; }
done
echo "generated ids: the same for both builds"
