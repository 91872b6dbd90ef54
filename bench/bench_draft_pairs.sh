#!/usr/bin/env bash
# bench/bench_draft_pairs.sh WORK ROTATIONS BIN... — chat from RAM, where a drafter that does not
# pay must cost next to nothing: for each build, `none` then `auto` back to back on each of
# bench_draft.sh's chat prompts, the builds in turn, ROTATIONS times. Prints a line per run
# ("build prompt drafter tok/s"), then per build and prompt the median of auto/none taken pair by
# pair (the two runs of a pair are a second apart, so a slow phase of this VM, which lasts seconds
# and moves a run by 10-25%, mostly hits both), and the medians' ratio. Timing only: nothing here
# is a test.
set -euo pipefail
W=$1 ROT=$2
shift 2
D=$(cd "$(dirname "$0")/.." && pwd)
B=$1
. "$D/bench/draft_setup.sh"
echo "# $(date -u +%FT%TZ) $(nproc) cpus; builds $*"
for ((r = 0; r < ROT; r++)); do
  for p in 1 2 3; do
    for bin in "$@"; do
      for dr in none auto; do
        t=$("$bin" run --model "$D/models/default" --chat --prompt "${CHATS[$((p - 1))]}" --max-new 128 \
          --ignore-eos --draft "$dr" --stats 2>&1 >/dev/null | sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p')
        echo "$bin chat$p $dr $t"
      done
    done
  done
done | tee "$W/pairs.txt"
python3 - "$W/pairs.txt" <<'PY'
import collections, statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if not l.startswith("#")]
pair, runs = collections.defaultdict(list), collections.defaultdict(list)
for a, b in zip(rows, rows[1:]):
    if a[:2] == b[:2] and a[2] == "none" and b[2] == "auto":
        pair[tuple(a[:2])].append(float(b[3]) / float(a[3]))
for r in rows:
    runs[tuple(r[:3])].append(float(r[3]))
print("| build | prompt | none tok/s | auto tok/s | auto/none, medians | auto/none, paired |")
print("|---|---|---|---|---|---|")
for b, p in sorted(pair):
    n, a = statistics.median(runs[(b, p, "none")]), statistics.median(runs[(b, p, "auto")])
    print(f"| {b} | {p} | {n:.0f} | {a:.0f} | {a / n:.3f} | {statistics.median(pair[(b, p)]):.3f} |")
for b in sorted({k[0] for k in pair}):
    allp = [x for k in pair if k[0] == b for x in pair[k]]
    print(f"| {b} | all | | | | {statistics.median(allp):.3f} |")
PY
