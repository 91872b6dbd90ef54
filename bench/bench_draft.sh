#!/usr/bin/env bash
# bench/bench_draft.sh WORK [ROUNDS] [MAX_NEW] — speculative decoding on the bundled model, each
# drafter (none, ngram, qwen, dspark, auto) in two settings:
#   ram:   models/default resident (compute-bound);
#   store: models/default prepared into a DFSP store (WORK/store, its drafters linked beside it)
#          with a RAM budget of the globals, the spines and a quarter of the experts, behind an
#          emulated drive of 100 MB/s and 200 us (reads dominate, as they do for K3);
# on code completion (the three held-out Python files of tests/data/drafting) and on three chat
# prompts, greedy, MAX_NEW tokens (default 128). ROUNDS rounds (default 3); within a round every
# drafter runs once per prompt and setting, in a rotating order, so the machine's drift falls on all
# of them alike. Prints each run's figures (tok/s of the decode after the first token, tokens per
# pass, bytes read per generated token, the drive's rate over its emulated one) and a table of
# medians, with each drafter's tok/s over none's both as medians and paired (the median of the
# ratios of runs made in the same rotation, seconds apart). A run from RAM decodes in about 80 ms,
# and this VM's noise moves single runs by 10-25% in phases of seconds: each round makes the RAM
# setting's rotation RAM_REPS times (default 5), so its medians are of 3 x 5 runs spread over the
# whole benchmark. Timing only: nothing here is a test.
set -euo pipefail
W=${1:-/tmp/deltafin-bench-draft}
ROUNDS=${2:-3}
NEW=${3:-128}
B=${DELTAFIN:-./deltafin}
RAM_REPS=${RAM_REPS:-5}
D=$(cd "$(dirname "$0")/.." && pwd)
. "$D/bench/draft_setup.sh"
DRAFTERS=(none ngram qwen dspark auto)
echo "== machine"; nproc; free -g | head -2; date -u; git -C "$D" log -1 --format=%h
echo "== store budget $BUDGET bytes (globals, spines and a quarter of the experts)"
run() { # setting prompt-kind prompt drafter
  local model=(--model "$D/models/default") extra=()
  [ "$1" = store ] && model=(--model "$W/store" --ram-budget "$BUDGET" --emulate-drives 100:200)
  [ "$2" = chat ] && extra=(--chat)
  local out
  out=$($B run "${model[@]}" "${extra[@]}" --prompt "$3" --max-new "$NEW" --ignore-eos --draft "$4" --stats 2>&1 >/dev/null)
  local tps passes toks bpt ratio
  tps=$(sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p' <<<"$out")
  passes=$(sed -n 's/.*decode: \([0-9]*\) passes for \([0-9]*\) tokens.*/\1 \2/p' <<<"$out")
  bpt=$(sed -n 's/.*decode: \([0-9.]* [KMG]*B\) read per token.*/\1/p' <<<"$out" | tr -d ' ')
  ratio=$(sed -n 's/.*decode: drive 0 read .*(\([0-9.]*\) of its emulated.*/\1/p' <<<"$out")
  echo "$1 $2 $5 $4 tok/s ${tps:-?} passes/tokens ${passes:-? ?} bytes/token ${bpt:-0B} drive ${ratio:--}"
}
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r"
  for setting in ram store; do
    reps=1
    [ "$setting" = ram ] && reps=$RAM_REPS
    for ((rep = 0; rep < reps; rep++)); do
      for p in 1 2 3; do
        for k in 0 1 2 3 4; do
          d=${DRAFTERS[$(( (k + r + p + rep) % 5 ))]}
          run "$setting" code "$(cat "$W/code$p.py")" "$d" "code$p"
          run "$setting" chat "${CHATS[$((p - 1))]}" "$d" "chat$p"
        done
      done
    done
  done
done | tee "$W/runs.txt"
echo "== medians over rounds (tok/s; tokens per pass; bytes per generated token) and tok/s over none"
python3 - "$W/runs.txt" <<'EOF'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 12 or f[4] != "tok/s" or f[5] == "?":
        continue
    setting, kind, prompt, drafter = f[:4]
    runs[(setting, kind, prompt, drafter)].append((float(f[5]), int(f[8]) / max(1, int(f[7])), f[10], f[12]))
print("| setting | prompt | drafter | tok/s | x none | x none, paired | tokens/pass | bytes/token | drive/emulated |")
print("|---|---|---|---|---|---|---|---|---|")
for key in sorted(runs, key=lambda k: (k[0], k[1], k[2], ["none", "ngram", "qwen", "dspark", "auto"].index(k[3]))):
    v = runs[key]
    tps = statistics.median(x[0] for x in v)
    base = runs.get(key[:3] + ("none",))
    rel = tps / statistics.median(x[0] for x in base) if base else float("nan")
    # the i-th run of a drafter and the i-th of none on a prompt share a rotation, seconds apart
    paired = statistics.median(a[0] / b[0] for a, b in zip(v, base)) if base else float("nan")
    print("| %s | %s | %s | %.1f | %.2f | %.3f | %.2f | %s | %s |" % (key[0], key[2], key[3], tps, rel, paired,
          statistics.median(x[1] for x in v), v[len(v) // 2][2], v[len(v) // 2][3]))
EOF
