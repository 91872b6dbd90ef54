#!/usr/bin/env bash
# bench/bench_cuda.sh DELTAFIN BENCH_CUDA WORKDIR [PROMPT] [NEW] [SIZE_GB] — issue 21's figures on a machine
# with an NVIDIA GPU, each against a limit measured in the same run:
#   1. bench_cuda (build/cuda/bench_cuda, make cuda-compile): GEMV at T = 1 .. 8 against the HBM
#      copy bandwidth, and T = 16 .. 512 against the fp32 FMA peak, BF16 and MXFP4 at K3's shapes;
#   2. whole passes of `synth --preset k3-wide` (K3's layer kinds and 17.5 MB MXFP4 experts, every
#      weight resident): a PROMPT-token prompt (default 128) and NEW decoded tokens (default 32),
#      `run --device cuda` then `run --device cpu` on every core, with --stats (time to first
#      token, decode tokens/s), and the generated ids of both (they must be the same). SIZE_GB
#      (synth --size-gb) sets the checkpoint's size through its number of experts.
# DELTAFIN must be a CUDA build (make CUDA=1 BUILD=build-cuda build-cuda/deltafin).
set -euo pipefail
bin=${1:?usage: bench/bench_cuda.sh DELTAFIN BENCH_CUDA WORKDIR [PROMPT] [NEW] [SIZE_GB]}
bench=${2:?}
work=${3:?}
prompt=${4:-128}
new=${5:-32}
size=${6:+--size-gb $6}
mkdir -p "$work"
echo "== bench_cuda"
"$bench" --iters 20
[ -f "$work/kw/config.json" ] || { echo "== synth k3-wide"; time "$bin" synth --preset k3-wide $size --out "$work/kw" >/dev/null; }
du -sh "$work/kw"
ids=$(seq 1 "$prompt" | awk '{ printf "%s%d", (NR > 1 ? "," : ""), ($1 * 7919) % 32000 + 1 }')
for dev in cuda cpu; do
  echo "== run --device $dev, $prompt-token prompt, $new new tokens"
  "$bin" run --model "$work/kw" --device "$dev" --tokens "$ids" --max-new "$new" --draft none --print-ids --stats \
    >"$work/ids-$dev" 2>"$work/stats-$dev" || { cat "$work/stats-$dev"; exit 1; }
  grep -v '^model:' "$work/stats-$dev" || true
done
if cmp -s "$work/ids-cuda" "$work/ids-cpu"; then echo "generated ids: the same on both devices"; else
  echo "generated ids DIFFER:"; cat "$work/ids-cuda" "$work/ids-cpu"; exit 1; fi
