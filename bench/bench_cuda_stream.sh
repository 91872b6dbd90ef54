#!/usr/bin/env bash
# bench/bench_cuda_stream.sh DELTAFIN WORKDIR RAM VRAM [NEW] [CPU_RAM] — streaming decode on the GPU
# from the machine's disk, with a VRAM budget below the model: WORKDIR/kw (a `synth --preset
# k3-wide`, made by bench_cuda.sh or here) is laid out as a DFSP store on WORKDIR/drv (`prepare`,
# read with O_DIRECT), `doctor` measures that drive's O_DIRECT rate and leaves its tuning there (the
# request size and depth the store then reads with, as after a user's `doctor`), then `run --device
# cuda --ram-budget RAM --vram-budget VRAM` decodes NEW tokens (default 32) after a 16-token prompt
# with --stats (the store's read rate is its bytes over the run), and the same run on the CPU
# (--ram-budget CPU_RAM, default RAM) gives the same ids. The GPU keeps the layer spines in VRAM and
# lets them go from RAM, so RAM holds that many more experts: 4G and 3G cache every expert of the
# 6 GB model between the two (bench/results/cuda.md, 2026-12-06, twelfth session), and a RAM below
# the CPU's spines makes the GPU stream.
set -euo pipefail
bin=${1:?usage: bench/bench_cuda_stream.sh DELTAFIN WORKDIR RAM VRAM [NEW] [CPU_RAM]}
work=${2:?}
ram=${3:?}
vram=${4:?}
new=${5:-32}
cpu_ram=${6:-$ram}
mkdir -p "$work"
[ -f "$work/kw/config.json" ] || "$bin" synth --preset k3-wide --size-gb 6 --out "$work/kw" >/dev/null
mkdir -p "$work/drv"
[ -f "$work/st/manifest.json" ] || { echo "== prepare"; "$bin" prepare --model "$work/kw" --out "$work/st" --drives "$work/drv" | tail -n 2; }
echo "== doctor"
"$bin" doctor --drives "$work/drv" | head -n 14
ids=$(seq 1 16 | awk '{ printf "%s%d", (NR > 1 ? "," : ""), ($1 * 7919) % 32000 + 1 }')
for dev in cuda cpu; do
  extra=() budget=$cpu_ram
  [ "$dev" = cuda ] && extra=(--vram-budget "$vram") budget=$ram
  echo "== run --device $dev --ram-budget $budget ${extra[*]}"
  "$bin" run --model "$work/st" --device "$dev" --ram-budget "$budget" "${extra[@]}" --tokens "$ids" --max-new "$new" \
    --draft none --print-ids --stats >"$work/sids-$dev" 2>"$work/sstats-$dev" || { cat "$work/sstats-$dev"; exit 1; }
  grep -v '^model:' "$work/sstats-$dev" || true
done
if cmp -s "$work/sids-cuda" "$work/sids-cpu"; then echo "generated ids: the same on both devices"; else
  echo "generated ids DIFFER:"; cat "$work/sids-cuda" "$work/sids-cpu"; exit 1; fi
