#!/usr/bin/env python3
"""bench/bench_serve.py DELTAFIN [MODEL_OPTS...] -- the server's overhead and prefix reuse, measured.

1. The same greedy raw completion (N tokens through end-of-text) by `deltafin run --stats` and
   through `deltafin serve` (/v1/completions, streamed, on a fresh server so the prompt is cold):
   time to first byte, time to first token, decode tokens/s; the ratio server / run is the
   server's cost (the engine's own limit is `run`'s, measured in the same invocation).
2. A follow-up chat turn after a long first turn: time to first token on the server that served
   turn 1 (prefix reuse) against a fresh server (the whole conversation recomputed).
Drafting is off in both so that the same passes run. Prints a markdown table. Standard library only.
"""
import http.client
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "./deltafin"
MODEL = sys.argv[2:]
N = 128
REPS = 5
PROMPT = "import numpy as np\n\n\ndef moving_average(x, w):\n"


def run_cli():
    out = subprocess.run([BIN, "run"] + MODEL + ["--draft", "none", "--prompt", PROMPT, "--max-new", str(N),
                                                 "--ignore-eos", "--stats"], capture_output=True, text=True, check=True)
    ttft = float(re.search(r"time to first token ([0-9.]+) s", out.stderr).group(1))
    tps = float(re.search(r"decode ([0-9.]+) tok/s", out.stderr).group(1))
    return ttft, tps


class Server:
    def __init__(self, *extra):
        self.p = subprocess.Popen([BIN, "serve", "--port", "0", "--draft", "none"] + list(extra) + MODEL,
                                  stdout=subprocess.PIPE, text=True)
        self.port = int(self.p.stdout.readline().strip().rsplit(":", 1)[1])
        assert self.p.stdout.readline().startswith("ready")

    def stream(self, path, body):
        """(first byte s, first token s, decode tok/s, usage) of a streamed request"""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.perf_counter()
        c.request("POST", path, json.dumps(dict(body, stream=True, stream_options={"include_usage": True})),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        first_byte = first_tok = last = None
        usage = None
        buf = b""
        while True:
            d = r.read1(65536)
            now = time.perf_counter()
            if not d:
                break
            if first_byte is None:
                first_byte = now - t0
            buf += d
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                    continue
                j = json.loads(ev[6:])
                if j.get("usage"):
                    usage = j["usage"]
                # the first chunk goes out once the first token is decided (a chat's is the role chunk)
                if j["choices"] and (j["choices"][0].get("text") or "delta" in j["choices"][0]):
                    if first_tok is None:
                        first_tok = now - t0
                    last = now - t0
        c.close()
        n = usage["completion_tokens"]
        return first_byte, first_tok, (n - 1) / (last - first_tok) if last and last > first_tok else 0.0, usage

    def stop(self):
        self.p.terminate()
        self.p.wait()


def main():
    cli = [run_cli() for _ in range(REPS)]
    srv = []
    for _ in range(REPS):
        s = Server()
        srv.append(s.stream("/v1/completions", {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True}))
        s.stop()
    med = statistics.median
    c_ttft, c_tps = med(x[0] for x in cli), med(x[1] for x in cli)
    s_fb, s_ttft, s_tps = med(x[0] for x in srv), med(x[1] for x in srv), med(x[2] for x in srv)
    print("| %d greedy tokens, median of %d | deltafin run | deltafin serve | serve / run |" % (N, REPS))
    print("|---|---|---|---|")
    print("| time to first byte | — | %.1f ms | — |" % (s_fb * 1e3))
    print("| time to first token | %.1f ms | %.1f ms | %.2f |" % (c_ttft * 1e3, s_ttft * 1e3, s_ttft / c_ttft))
    print("| decode tokens/s | %.1f | %.1f | %.3f |" % (c_tps, s_tps, s_tps / c_tps))

    # a long first turn, then a follow-up
    code = open("src/engine/generate.c").read()[:6000]
    turn1 = [{"role": "user", "content": "Explain this code:\n" + code}]
    warm, cold, lens, disk = [], [], [], []
    for _ in range(REPS):
        with tempfile.TemporaryDirectory() as d:  # turn 1, a restart, turn 2 from --cache-dir
            s = Server("--cache-dir", d)
            s.stream("/v1/chat/completions", {"messages": turn1, "max_tokens": 32, "temperature": 0})
            s.stop()  # SIGTERM after the answer: the state was written before the next request
            s = Server("--cache-dir", d)
            turn2 = turn1 + [{"role": "assistant", "content": "It decodes tokens."}, {"role": "user", "content": "Shorter?"}]
            fb, ft, tps, u = s.stream("/v1/chat/completions", {"messages": turn2, "max_tokens": 8, "temperature": 0})
            disk.append((ft, u))
            s.stop()
        s = Server()
        r = s.stream("/v1/chat/completions", {"messages": turn1, "max_tokens": 32, "temperature": 0})
        turn2 = turn1 + [{"role": "assistant", "content": "It decodes tokens."}, {"role": "user", "content": "Shorter?"}]
        fb, ft, tps, u = s.stream("/v1/chat/completions", {"messages": turn2, "max_tokens": 8, "temperature": 0})
        warm.append((ft, u))
        s.stop()
        s = Server()
        fb, ft, tps, u2 = s.stream("/v1/chat/completions", {"messages": turn2, "max_tokens": 8, "temperature": 0})
        cold.append((ft, u2))
        s.stop()
        lens.append(r[3]["prompt_tokens"])
    w, c = med(x[0] for x in warm), med(x[0] for x in cold)
    print()
    print("| follow-up turn (%d-token conversation), median of %d | time to first token | prompt tokens reused |"
          % (warm[0][1]["prompt_tokens"], REPS))
    print("|---|---|---|")
    print("| same server (prefix reuse) | %.1f ms | %d |" % (w * 1e3, warm[0][1]["prompt_tokens_details"]["cached_tokens"]))
    print("| fresh server (recomputed) | %.1f ms | %d |" % (c * 1e3, cold[0][1]["prompt_tokens_details"]["cached_tokens"]))
    k = med(x[0] for x in disk)
    print("| restarted server with --cache-dir | %.1f ms | %d |" % (k * 1e3, disk[0][1]["prompt_tokens_details"]["cached_tokens"]))
    print("| reuse speed-up: same server, restarted from disk | %.1fx, %.1fx | |" % (c / w, c / k))


if __name__ == "__main__":
    main()
