#!/usr/bin/env python3
"""DSpark's training sequences from the engine itself: the greedy continuation of each prompt that
`train.py --stage ds-prompts` wrote, as `deltafin run` decides it.

Why the engine and not torch: the drafter is judged by the tokens the engine emits, and the engine keeps
float32 activations where train.py's generation runs in bfloat16, so close calls can differ. And torch's
greedy_batch recomputes the whole prefix every token: on a GPU, 3072 continuations took 192 s of a 600 s
call (bench/results/train.md, runs 8 and 9), while the engine makes them on this machine's CPUs beforehand.

usage: engine_greedy.py PROMPTS.json OUT.json [--deltafin BIN] [--model DIR] [--jobs N]
Each prompt runs as `deltafin run --tokens ... --max-new N --print-ids` (raw ids, no end-of-text stop), so
every sequence is its prompt followed by exactly N generated ids. OUT.json is written whole or not at all.
"""
import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))


def continue_ids(binary, model, prompt, n):
    """prompt ids -> prompt + the engine's n greedy ids (an error names the prompt's first ids)."""
    cmd = [binary, "run", "--tokens", ",".join(map(str, prompt)), "--max-new", str(n), "--print-ids",
           "--threads", "1"] + (["--model", model] if model else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    got = [int(x) for x in r.stdout.split()] if r.returncode == 0 else []
    if len(got) != n:
        raise RuntimeError("deltafin run on prompt %s...: exit %d, %d ids of %d: %s" % (
            prompt[:4], r.returncode, len(got), n, r.stderr.strip().splitlines()[-1:] or ""))
    return prompt + got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prompts")
    ap.add_argument("out")
    ap.add_argument("--deltafin", default=os.path.join(HERE, "..", "..", "build", "deltafin"))
    ap.add_argument("--model", default=None, help="the target (default: the bundled model)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    args = ap.parse_args()
    pj = json.load(open(args.prompts))
    out = {"new": pj["new"], "chat_new": pj["chat_new"], "raw": [], "chat": []}
    with ThreadPoolExecutor(args.jobs) as pool:
        for kind, n in (("raw", pj["new"]), ("chat", pj["chat_new"])):
            for g in pj[kind]:
                seqs = list(pool.map(lambda p: continue_ids(args.deltafin, args.model, p, n), g["prompts"]))
                out[kind].append({"plen": g["plen"], "seqs": seqs})
                print("%s: %d prompts of %d ids continued by %d" % (kind, len(seqs), g["plen"], n), flush=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    sys.exit(main())
