#!/bin/sh
# bench_matmul.sh — bench_gemv at the T that issue 20 reports, on 1 and 2 threads, one log:
# T = 16, 64 and 512 (prefill) at all four of K3's shapes for BF16 and MXFP4, INT4 and FP8 at
# T = 64; T = 1, 2, 4 and 8 (decode and verify: also the ratio to the read bandwidth) at
# 12288 x 7168 and the expert's 3072 x 3584.
# usage: bench/bench_matmul.sh [SECONDS] > LOG     (timing only; never part of a test)
# BENCH_GEMV names another build's binary (for alternating against it).
set -e
S=${1:-0.5}
B=${BENCH_GEMV:-./build/bench/bench_gemv}
echo "# $(date -u +%FT%TZ) $B $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for T in 1 2 4 8; do
    for shape in 12288x7168 3072x3584; do
        echo "## --tokens $T --shape $shape"
        "$B" --seconds "$S" --tokens "$T" --shape "$shape"
    done
done
for T in 16 64 512; do
    echo "## --tokens $T"
    "$B" --seconds "$S" --tokens "$T"
done
echo "## --tokens 64 --formats int4,fp8 --shape 3072x3584"
"$B" --seconds "$S" --tokens 64 --formats int4,fp8 --shape 3072x3584
