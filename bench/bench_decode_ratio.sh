#!/usr/bin/env bash
# bench/bench_decode_ratio.sh WORK [ROUNDS] — issue 4's headline ratio: the read rate during
# miss-bound decode over doctor's O_DIRECT bandwidth, each decode run right after a doctor run
# of the same drive folder (this VM's disk swings 1-8 GB/s over an evening, so a denominator
# measured once at the start says little about a run half an hour later). Timing only.
#
# Needs the 12 GB k3-mini store of bench_store.sh in WORK/s1 (made here if missing, ~25 GB); with
# PRESET=k3-wide, a 12 GB k3-wide store in WORK/w1 instead (K3's own 17.5 MB experts, 8 layers).
# Each round: doctor --drives WORK/s1 (saves its best rate on a temporary file, and the best of
# random reads of the store's own pack there, cold model data; --stats divides by both), then
# decode of 16 tokens after an 8-token prompt at
#   4G: the spine resident, experts streaming through a cache of ~1/8 of them (k3-wide: ~1/7)
#   2G: the expert working set, 13 of 24 layer spines resident, the other 11 streamed (k3-wide:
#       the layer spines that do not fit stream too)
# The figure is --stats' "decode: drive 0 read R GB/s (Q of doctor's D GB/s) (P of the C GB/s
# doctor read the store's pack at) (U of the S GB/s doctor sustained)" line: bytes read after the
# first token over the time after it, so the prompt's reads do not count.
# Last, the same two decodes through an emulated drive of a fixed 1200 MB/s and 100 us (below
# this VM disk's cold-data rate, so the emulation, not the disk, sets the pace): the share of a
# drive of known, steady speed that decode keeps busy, apart from the VM disk's own swings.
set -euo pipefail
W=${1:-/tmp/deltafin-bench}
ROUNDS=${2:-3}
B=${DELTAFIN:-./deltafin}
mkdir -p "$W"
PRESET=${PRESET:-k3-mini}
case $PRESET in
  k3-mini) HF=$W/k3mini S=$W/s1 ;;
  k3-wide) HF=$W/k3wide S=$W/w1 ;;
  *) echo "bench_decode_ratio: PRESET is k3-mini or k3-wide" >&2; exit 2 ;;
esac
[ -f "$HF/model.safetensors" ] || $B synth --preset "$PRESET" --size-gb 12 --out "$HF"
[ -f "$S/manifest.json" ] || $B prepare --model "$HF" --out "$S"
echo "== $PRESET store $S"
echo "== machine"; nproc; free -g | head -2; date -u
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r"
  $B doctor --drives "$S" --size 4G | grep -E "^\| /"
  for b in 4G 2G; do
    echo "-- --ram-budget $b"
    $B run --model "$S" --tokens 1,2,3,4,5,6,7,8 --max-new 16 --print-ids --ram-budget $b --stats 2>&1 |
      grep -E '^\[stats\] (generated|store|spine|experts|decode)'
  done
done
echo "== emulated drive 1200 MB/s, 100 us"
for b in 4G 2G; do
  echo "-- --ram-budget $b"
  $B run --model "$S" --tokens 1,2,3,4,5,6,7,8 --max-new 16 --print-ids --ram-budget $b --stats \
    --emulate-drives 1200:100 2>&1 | grep -E '^\[stats\] (generated|decode)'
done
