#!/usr/bin/env bash
# bench/bench_verify_cost.sh [SECONDS] — what a verify pass of T = 1..8 positions costs on K3's
# expert shapes: bench_gemv --tokens T on the routed expert's two matrices (3072 x 3584 gate/up,
# 3584 x 3072 down; MXFP4, 2 threads, weights from DRAM), the microseconds of one call and the
# ratio to the FMA peak (T > 1) or to the read bandwidth (T = 1) the same rounds measure; then,
# for K3's routing (16 of 896 experts per position), the experts T positions read under uniform
# routing relative to one position, u(T) = 896 (1 - (1 - 16/896)^T) / 16. Each expert a verify
# pass reads serves 16 T / (16 u(T)) positions on average (1.0-1.07 for T <= 8), so its compute
# is a one- or two-row call as well, and the expert part of a pass costs about u(T) times a
# plain one whether reads or compute bound it. k guesses pay only if they bring more than u(k+1)
# tokens per pass. Timing only: nothing here is a test.
set -euo pipefail
S=${1:-0.5}
G=${BENCH_GEMV:-build/bench/bench_gemv}
D=$(cd "$(dirname "$0")/.." && pwd)
echo "== machine"; nproc; date -u; git -C "$D" log -1 --format=%h
for shape in 3072x3584 3584x3072; do
  for T in 1 2 3 4 5 6 7 8; do
    "$G" --seconds "$S" --shape "$shape" --tokens "$T" | grep -E '^\| mxfp4 .*\| +[0-9]+ \| 2 \|' |
      sed "s/^/T=$T /"
  done
done
echo "== K3 uniform routing: experts read by T positions relative to one (16 of 896)"
python3 - <<'EOF'
E, k = 896, 16
for T in range(1, 9):
    u = E * (1 - (1 - k / E) ** T) / k
    print("T=%d u=%.2f tokens/pass needed to pay=%.2f positions per expert=%.2f" % (T, u, u, T / u))
EOF
