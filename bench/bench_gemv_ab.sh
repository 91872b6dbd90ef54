#!/bin/sh
# bench_gemv_ab.sh — bench_gemv's table rows from several builds, alternated round by round, so
# that a change is compared against the build before it under the same drift of a shared machine.
# usage: bench/bench_gemv_ab.sh ROUNDS "BENCH_GEMV ARGS" BIN... > LOG   (timing only; never a test)
# Each round runs every BIN once with the same arguments, in the order given; each run is headed
# "## BIN round N" and followed by its table rows.
set -e
if [ $# -lt 3 ]; then
    echo "usage: $0 ROUNDS \"ARGS\" BIN..." >&2
    exit 2
fi
R=$1
A=$2
shift 2
r=1
while [ "$r" -le "$R" ]; do
    for b in "$@"; do
        echo "## $b round $r"
        # shellcheck disable=SC2086 # ARGS is a word list on purpose
        "$b" $A 2>&1 | grep -E '^\| [a-z][a-z0-9-]* +\|' | grep -v '^| format ' || true
    done
    r=$((r + 1))
done
