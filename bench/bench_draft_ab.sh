#!/usr/bin/env bash
# bench/bench_draft_ab.sh WORK ROUNDS DRAFTER OLD NEW [SETTINGS] — one drafter setting (e.g. auto) in
# two builds of deltafin, alternated run by run, on bench_draft.sh's prompts and settings (SETTINGS:
# "store ram" by default, or one of them)
# (bench/draft_setup.sh prepares them, with NEW as the binary that prepares the store). Prints a line
# per run ("setting prompt build tok/s passes") and the medians per setting, prompt and build,
# with none's from the NEW build for reference. Timing only: nothing here is a test.
set -euo pipefail
W=$1 ROUNDS=$2 DR=$3 OLD=$4 NEW=$5 SETTINGS=${6:-store ram}
D=$(cd "$(dirname "$0")/.." && pwd)
B=$NEW
. "$D/bench/draft_setup.sh"
one() { # binary setting kind prompt drafter
  local model=(--model "$D/models/default") extra=()
  [ "$2" = store ] && model=(--model "$W/store" --ram-budget "$BUDGET" --emulate-drives 100:200)
  [ "$3" = chat ] && extra=(--chat)
  "$1" run "${model[@]}" "${extra[@]}" --prompt "$4" --max-new 128 --ignore-eos --draft "$5" --stats 2>&1 >/dev/null |
    sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p;s/.*decode: \([0-9]*\) passes for.*/\1/p' | tr '\n' ' '
}
echo "# $(date -u +%FT%TZ) $(nproc) cpus; old $OLD new $NEW; drafter $DR"
for r in $(seq 1 "$ROUNDS"); do
  for setting in $SETTINGS; do
    for p in 1 2 3; do
      for kind in code chat; do
        if [ $kind = code ]; then pr=$(cat "$W/code$p.py"); else pr=${CHATS[$((p - 1))]}; fi
        order=(old new none); [ $((r % 2)) = 0 ] && order=(new none old)
        for b in "${order[@]}"; do
          case $b in old) bin=$OLD dr=$DR ;; new) bin=$NEW dr=$DR ;; none) bin=$NEW dr=none ;; esac
          echo "$setting $kind$p $b $(one "$bin" "$setting" "$kind" "$pr" "$dr")"
        done
      done
    done
  done
done | tee "$W/ab.txt"
python3 - "$W/ab.txt" <<'PY'
import collections, statistics, sys
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 5 and not f[0].startswith("#"):
        v[(f[0], f[1], f[2])].append((float(f[3]), int(f[4])))
print("| setting | prompt | none tok/s | old tok/s (x none, passes) | new tok/s (x none, passes) |")
print("|---|---|---|---|---|")
for s, p in sorted({k[:2] for k in v}):
    med = lambda b, i: statistics.median(x[i] for x in v[(s, p, b)])
    n = med("none", 0)
    print(f"| {s} | {p} | {n:.1f} | {med('old', 0):.1f} ({med('old', 0) / n:.2f}x, {med('old', 1):.0f}) "
          f"| {med('new', 0):.1f} ({med('new', 0) / n:.2f}x, {med('new', 1):.0f}) |")
PY
