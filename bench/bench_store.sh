#!/usr/bin/env bash
# bench/bench_store.sh WORK — the weight store's benchmarks (issue 4). Timing only.
#
# Needs ~65 GB free in WORK. Builds (once) a 12 GB k3-mini synthetic model and DFSP stores, then:
#   1. doctor: the drive's O_DIRECT bandwidth (the denominator)
#   2. decode on a model ~3x the RAM budget, prefetch off/on, and `bench io` (no compute)
#   3. the same model through plain mmap with the page cache limited to the same budget by a
#      memory cgroup (how llama.cpp streams), when cgroup v1 memory is writable (root)
#   2b. the trained default model streamed through a small cache: router lookahead, off vs on
#   4. emulated drives 1..4 of equal speed: the throughput ladder (bench io), each layer read
#      cold (prefetch off) and with the next layer's experts hinted (prefetch on)
#   5. two mirrors of unequal speed vs the faster drive alone (bench io)
set -euo pipefail
W=${1:-/tmp/deltafin-bench}
B=${DELTAFIN:-./deltafin}
mkdir -p "$W"
echo "== machine"; nproc; free -g | head -2
[ -f "$W/k3mini/model.safetensors" ] || $B synth --preset k3-mini --size-gb 12 --out "$W/k3mini"
[ -f "$W/s1/manifest.json" ] || $B prepare --model "$W/k3mini" --out "$W/s1"
# doctor measures the folder the 12 GB store's pack lives in, so --stats below prints each run's
# read rate as a fraction of doctor's best (and the store reads with the tuning doctor chose)
echo "== 1. doctor"; $B doctor --drives "$W/s1" --size 8G --verbose
P=1,2,3,4,5,6,7,8
echo "== 2. decode, 12 GB model, --ram-budget 4G"
for pf in off on; do
  echo "-- prefetch $pf"; $B run --model "$W/s1" --tokens $P --max-new 16 --print-ids --ram-budget 4G --prefetch $pf --stats 2>&1 | grep -v '^[0-9]'
done
echo "-- bench io (no compute)"; $B bench io --model "$W/s1" --ram-budget 4G --tokens 16 2>&1

echo "== 2b. trained default model (models/default) as a DFSP store, --ram-budget 10M (~1/3 of its experts)"
rm -rf "$W/def"; $B prepare --model models/default --out "$W/def" >/dev/null
for pf in off on; do
  echo "-- prefetch $pf"; $B run --model "$W/def" --prompt "def fibonacci(n):" --max-new 64 --ram-budget 10M --prefetch $pf --stats 2>&1 | grep -E '^\[stats\] (generated|experts|prefetch)'
done

CG=/sys/fs/cgroup/memory/deltafin-bench
if [ -w /sys/fs/cgroup/memory ] && mkdir -p "$CG" 2>/dev/null; then
  echo "== 3. cgroup memory limit 4.5G: plain mmap vs the store"
  echo $((4608 * 1024 * 1024)) > "$CG/memory.limit_in_bytes"
  sync; echo 1 > /proc/sys/vm/drop_caches || true
  sh -c "echo \$\$ > $CG/cgroup.procs; exec $B run --model $W/s1 --tokens $P --max-new 16 --print-ids --stats" 2>&1 | grep -E 'decode|weights|prompt'
  sh -c "echo \$\$ > $CG/cgroup.procs; exec $B run --model $W/s1 --tokens $P --max-new 16 --print-ids --ram-budget 4G --prefetch off --stats" 2>&1 | grep -E 'decode|prompt|experts:'
  rmdir "$CG" 2>/dev/null || true
fi

echo "== 4. emulated drives of 800 MB/s, 100 us: the ladder (bench io, 5.3 GB model, every expert read)"
for n in 1 2 3 4; do
  if [ ! -f "$W/L$n/store/manifest.json" ]; then
    [ -f "$W/k3m4/model.safetensors" ] || $B synth --preset k3-mini --size-gb 4 --out "$W/k3m4"
    d=""; for i in $(seq 0 $((n - 1))); do mkdir -p "$W/L$n/d$i"; d="$d,$W/L$n/d$i"; done
    $B prepare --model "$W/k3m4" --out "$W/L$n/store" --drives "${d#,}"
  fi
  emu=$(printf '800:100,%.0s' $(seq 1 $n)); emu=${emu%,}
  for pf in off on; do
    echo "-- $n drive(s), prefetch $pf"; $B bench io --model "$W/L$n/store" --ram-budget 3.2G --tokens 8 --emulate-drives "$emu" --drive-gbs $(echo "0.8 * $n" | bc -l) --prefetch $pf 2>&1 | grep -E '^bench io'
  done
done

echo "== 5. two mirrors, 1200 and 400 MB/s, vs the 1200 MB/s drive alone"
if [ ! -f "$W/M/store/manifest.json" ]; then
  mkdir -p "$W/M/d0" "$W/M/d1"
  $B prepare --model "$W/k3m4" --out "$W/M/store" --drives "$W/M/d0,$W/M/d1" --mirrors 2
fi
$B bench io --model "$W/M/store" --ram-budget 3.2G --tokens 8 --emulate-drives 1200:100,400:100 --drive-gbs 1.6 2>&1 | grep -E '^bench io|drive [01]'
$B bench io --model "$W/L1/store" --ram-budget 3.2G --tokens 8 --emulate-drives 1200:100 --drive-gbs 1.2 2>&1 | grep -E '^bench io'
