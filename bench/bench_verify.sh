#!/usr/bin/env bash
# bench/bench_verify.sh WORK [ROUNDS] — the cost of verifying a store at its first open: the
# 5.3 GB k3-mini store of WORK/s4 (made here if missing), everything mapped (no --ram-budget), so
# every blob is hashed before use. Each round, with the page cache dropped before each read
# (needs root; without it the figures are warm, and the script says so):
#   doctor --drives WORK/s4 --no-save: the drive's best O_DIRECT rate (a file doctor just wrote)
#     and its random reads of the store's own pack (cold model data);
#   dd iflag=direct bs=8M of the pack: one sequential O_DIRECT pass over the same bytes;
#   eval --stats: the "[stats] verified ..." line (blobs, bytes, seconds, GB/s).
# The figure is verify GB/s over each of those rates. Timing only: nothing here is a test.
set -euo pipefail
W=${1:-/tmp/deltafin-bench}
ROUNDS=${2:-3}
B=${DELTAFIN:-./deltafin}
S=$W/s4
mkdir -p "$W"
[ -f "$W/k3mini4/model.safetensors" ] || $B synth --preset k3-mini --size-gb 4 --out "$W/k3mini4"
[ -f "$S/manifest.json" ] || $B prepare --model "$W/k3mini4" --out "$S"
P=$(ls "$S"/dfsp-*.pack)
# (as root in a container whose /proc/sys is read-only the drop fails too: said once, then warm)
drop() { sync; [ -w /proc/sys/vm/drop_caches ] && echo 3 > /proc/sys/vm/drop_caches; true; }
[ -w /proc/sys/vm/drop_caches ] || echo "cannot drop the page cache here: these are warm figures"
echo "== machine"; nproc; free -g | head -2; date -u
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r"
  drop; $B doctor --drives "$S" --size 2G --no-save | grep -E "^\| /"
  drop; dd if="$P" of=/dev/null bs=8M iflag=direct 2>&1 | tail -1
  drop; $B eval --model "$S" --tokens 1 --logits-out /dev/null --stats 2>&1 | grep -E '^\[stats\] verified'
done
