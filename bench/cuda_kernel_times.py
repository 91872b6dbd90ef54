#!/usr/bin/env python3
"""bench/cuda_kernel_times.py CSV[.xz] SKIP PASSES — each kernel's GPU time per pass, from ncu.

CSV: `ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base
--log-file CSV deltafin run ...` (every kernel a run launched, in launch order). SKIP: the kernels
before the passes to count (the prompt's pass and the first decode step's); PASSES: how many passes
the rest holds. Prints the passes' kernel time and count, then each kernel (name and grid) by its
time a pass. The kernel time set against the run's wall time per pass (--stats) tells how much of a
step the GPU computes and how much it waits for the host (bench/results/cuda.md)."""
import collections
import csv
import lzma
import re
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.splitlines()[0])
    path, skip, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        if r["Metric Unit"] != "ns":
            sys.exit(f"{path}: unit {r['Metric Unit']!r}: run ncu with --print-units base")
        name = re.sub(r"\(.*", "", r["Kernel Name"]) + " " + r["Grid Size"]
        rows.append((int(r["ID"]), name, float(r["Metric Value"].replace(",", "")) / 1000.0))
    rows.sort()
    part = rows[skip:]
    if not part or passes < 1:
        sys.exit(f"{path}: {len(rows)} kernels, none after the first {skip}")
    total = sum(us for _, _, us in part)
    print(f"{len(rows)} kernels; the last {len(part)} over {passes} passes: "
          f"{total / passes:.1f} us of kernels and {len(part) / passes:.1f} launches a pass")
    per = collections.defaultdict(lambda: [0, 0.0])
    for _, name, us in part:
        per[name][0] += 1
        per[name][1] += us
    for name, (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{us / passes:9.1f} us a pass {n / passes:6.1f} x {us / n:8.1f} us  {name}")


if __name__ == "__main__":
    main()
