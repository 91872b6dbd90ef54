#!/usr/bin/env bash
# bench/bench_spine_int8.sh WORK [MODEL_DIR...] — what `prepare --spine int8` costs and saves.
#
# 1. Logit error: for each model folder (default: the bundled default model and the oracle cases
#    under build/testdata/oracle that `make test` unpacks), an int8 store is prepared in WORK and
#    both are run with `eval` over the same 16 tokens; printed: the relative L2 error of all
#    logits, of the first position's, and at how many of the 16 positions the argmax agrees.
# 2. Memory: with the 12 GB k3-mini of bench_store.sh (WORK/k3mini, made if missing), the int8
#    store's spine against the as-released store's (WORK/s1), and 16 decoded tokens of each at
#    --ram-budget 4G: the bytes the int8 spine frees go to expert slots.
# Timing only where it says tok/s; nothing here is a pass/fail test (tests/test_store.c is).
set -euo pipefail
W=${1:-/tmp/deltafin-bench}
shift || true
B=${DELTAFIN:-./deltafin}
mkdir -p "$W"
T=3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3
if [ $# -eq 0 ]; then
  set -- models/default build/testdata/oracle/{kimi_k3-a,kimi_k3-b,kimi_linear-a,deepseek_v3-a,kimi_k2-int4,qwen3-a,qwen3_moe-a}
fi
echo "| model | int8 matrices | their bytes as released -> int8 | logit rel. L2 (16 positions) | first position | argmax equal |"
echo "|---|---|---|---|---|---|"
for m in "$@"; do
  [ -f "$m/config.json" ] || { echo "skip $m (no config.json)" >&2; continue; }
  q="$W/int8-$(basename "$m")"
  rm -rf "$q"
  line=$($B prepare --model "$m" --out "$q" --spine int8 | grep "spine int8")
  $B eval --model "$m" --tokens $T --logits-out "$W/a.f32"
  $B eval --model "$q" --tokens $T --logits-out "$W/b.f32"
  python3 - "$W/a.f32" "$W/b.f32" "$m" "$line" <<'EOF'
import array, math, re, sys
a = array.array('f', open(sys.argv[1], 'rb').read())
b = array.array('f', open(sys.argv[2], 'rb').read())
T = 16; V = len(a) // T
def rel(x, y): return math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)) / sum(p * p for p in x))
agree = sum(max(range(V), key=a[t*V:(t+1)*V].__getitem__) == max(range(V), key=b[t*V:(t+1)*V].__getitem__)
            for t in range(T))
m = re.search(r"(\d+) matrices, ([\d.]+) GB as released -> ([\d.]+) GB", sys.argv[4])
print("| %s | %s | %s -> %s GB | %.4f | %.4f | %d/%d |" % (sys.argv[3], m.group(1), m.group(2), m.group(3),
      rel(a, b), rel(a[:V], b[:V]), agree, T))
EOF
done
echo
echo "== k3-mini, --ram-budget 4G: as released vs --spine int8"
[ -f "$W/k3mini/model.safetensors" ] || $B synth --preset k3-mini --size-gb 12 --out "$W/k3mini"
[ -f "$W/s1/manifest.json" ] || $B prepare --model "$W/k3mini" --out "$W/s1"
[ -f "$W/s1-int8/manifest.json" ] || $B prepare --model "$W/k3mini" --out "$W/s1-int8" --spine int8
for s in s1 s1-int8; do
  echo "-- $s"
  $B run --model "$W/$s" --tokens 1,2,3,4,5,6,7,8 --max-new 16 --print-ids --ram-budget 4G --stats 2>&1 |
    grep -E '^\[stats\] (generated|store|experts|decode)'
done
