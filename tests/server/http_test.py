#!/usr/bin/env python3
"""tests/server/http_test.py DELTAFIN [STORE] -- `deltafin serve` from raw HTTP, on loopback.

Every route and every error status the server answers, streaming (SSE framing, usage chunk,
stop strings held back across chunks), cancellation of running and queued generations by a
client that goes away, prefix reuse (logits through --debug's /debug/logits against a cold
`deltafin eval`, memcmp), and a bounded load test (8 clients, a few hundred requests with
malformed and hostile ones mixed in; the server stays up, answers every valid request with the
reference answer, and ends with no more file descriptors and a bounded RSS).

STORE (optional): a DFSP store of the bundled model, for the 503-while-loading check (its drives
emulated slow so that loading takes seconds). Prints "ok   NAME" / "FAIL NAME: why" per check and
a last line "N passed, M failed"; exit status 0 only when nothing failed. Standard library only.
"""
import base64
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/deltafin"
STORE = sys.argv[2] if len(sys.argv) > 2 else None
passed = failed = 0


def check(name, ok, why=""):
    global passed, failed
    if ok:
        passed += 1
        print("ok   server " + name)
    else:
        failed += 1
        print("FAIL server %s: %s" % (name, why))
    sys.stdout.flush()
    return ok


class Server:
    def __init__(self, *args):
        self.name = " ".join(args) or "defaults"
        self.err = tempfile.TemporaryFile(mode="w+")  # a pipe nobody reads could fill and stall it
        self.p = subprocess.Popen([BIN, "serve", "--port", "0"] + list(args), stdout=subprocess.PIPE,
                                  stderr=self.err, text=True)
        line = self.p.stdout.readline()
        if not line.startswith("listening on http://"):
            raise RuntimeError("no listening line: %r %s" % (line, self.stderr()))
        self.host, port = line.split("//")[1].strip().rsplit(":", 1)
        self.port = int(port)

    def wait_ready(self):
        line = self.p.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError("no ready line: %r %s" % (line, self.stderr()))
        return self

    def stderr(self):
        self.err.seek(0)
        return self.err.read()

    def stop(self):
        """SIGTERM; a clean stop is exit status 0 with nothing on stderr but its own error lines
        (a sanitizer's report fails it)"""
        self.p.terminate()
        try:
            self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        err = self.stderr()
        check("serve %s: stops cleanly on SIGTERM" % self.name, self.p.returncode == 0 and "Sanitizer" not in err,
              (self.p.returncode, err[-2000:]))
        return self.p.returncode

    def req(self, method, path, body=None, headers=None, timeout=60):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        h = dict(headers or {})
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def jreq(self, method, path, body=None, headers=None):
        st, h, data = self.req(method, path, body, headers)
        try:
            return st, json.loads(data)
        except ValueError:
            return st, {"raw": data.decode("utf-8", "replace")}

    def stream(self, path, body, headers=None):
        """the SSE events of a streamed request, in order, as raw strings"""
        st, h, data = self.req("POST", path, body, headers)
        text = data.decode()
        return st, h, text

    def metrics(self):
        st, h, data = self.req("GET", "/metrics")
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def fds(self):
        return len(os.listdir("/proc/%d/fd" % self.p.pid))

    def rss_kb(self):
        for line in open("/proc/%d/status" % self.p.pid):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0


def is_err(body, status_code=None, param=None, code=None):
    e = body.get("error") if isinstance(body, dict) else None
    if not isinstance(e, dict) or not isinstance(e.get("message"), str) or "type" not in e:
        return False
    if "param" not in e or "code" not in e:
        return False
    return (param is None or e["param"] == param) and (code is None or e["code"] == code)


def sse_events(text):
    """data payloads of an SSE body; the framing must be exact: 'data: X' blocks split by blank lines"""
    evs = []
    for block in text.split("\n\n"):
        if not block:
            continue
        if block.startswith(":"):
            continue
        assert block.startswith("data: "), block[:80]
        evs.append(block[6:])
    return evs


CHAT = {"model": "default", "messages": [{"role": "user", "content": "Write a function that sorts a list."}],
        "temperature": 0, "max_tokens": 24}


def test_routes(s):
    st, b = s.jreq("GET", "/health")
    check("GET /health", st == 200 and b.get("status") == "ok", (st, b))
    st, b = s.jreq("GET", "/v1/models")
    check("GET /v1/models", st == 200 and b["object"] == "list" and b["data"][0]["id"] == "default", (st, b))
    st, b = s.jreq("GET", "/v1/models/default")
    check("GET /v1/models/default", st == 200 and b["id"] == "default" and b["object"] == "model", (st, b))
    st, b = s.jreq("GET", "/v1/models/gpt-4")
    check("GET /v1/models/unknown is 404 model_not_found", st == 404 and is_err(b, code="model_not_found"), (st, b))
    st, h, data = s.req("GET", "/")
    check("GET / serves the chat page", st == 200 and h.get("Content-Type", "").startswith("text/html")
          and b"<html" in data and b"/v1/chat/completions" in data and b"src=\"http" not in data, st)
    st, h, data = s.req("GET", "/metrics")
    check("GET /metrics is Prometheus text", st == 200 and h.get("Content-Type", "").startswith("text/plain")
          and b"# TYPE deltafin_generation_tokens_total counter" in data, st)
    st, b = s.jreq("POST", "/tokenize", {"content": "hello world", "with_pieces": True})
    ok = st == 200 and b["tokens"] and "".join(p["piece"] for p in b["pieces"]) == "hello world"
    check("POST /tokenize", ok, (st, b))
    st2, b2 = s.jreq("POST", "/detokenize", {"tokens": b.get("tokens", [])})
    check("POST /detokenize round trip", st2 == 200 and b2.get("content") == "hello world", (st2, b2))
    st, b = s.jreq("POST", "/tokenize", {"messages": CHAT["messages"]})
    check("POST /tokenize with messages", st == 200 and len(b.get("tokens", [])) > 5, (st, b))
    st, b = s.jreq("POST", "/detokenize", {"tokens": [10 ** 9]})
    check("POST /detokenize out-of-vocabulary is 400", st == 400 and is_err(b, param="tokens"), (st, b))

    st, b = s.jreq("POST", "/v1/chat/completions", CHAT)
    m = b.get("choices", [{}])[0].get("message", {}) if st == 200 else {}
    u = b.get("usage", {})
    check("POST /v1/chat/completions", st == 200 and b["object"] == "chat.completion" and b["id"].startswith("chatcmpl-")
          and isinstance(m.get("content"), str) and m.get("role") == "assistant"
          and b["choices"][0]["finish_reason"] == "length" and u.get("completion_tokens") == 24
          and u["total_tokens"] == u["prompt_tokens"] + 24 and "cached_tokens" in u.get("prompt_tokens_details", {}),
          (st, b))
    st, b = s.jreq("POST", "/v1/completions", {"prompt": "def fibonacci(n):", "max_tokens": 10, "temperature": 0})
    check("POST /v1/completions", st == 200 and b["object"] == "text_completion" and isinstance(b["choices"][0]["text"], str)
          and b["usage"]["completion_tokens"] == 10, (st, b))
    st, b2 = s.jreq("POST", "/v1/completions", {"prompt": "def fibonacci(n):", "max_tokens": 10, "temperature": 0, "echo": True})
    check("completions echo", st == 200 and b2["choices"][0]["text"] == "def fibonacci(n):" + b["choices"][0]["text"], b2)
    st, ids = s.jreq("POST", "/tokenize", {"content": "def fibonacci(n):"})
    st, b3 = s.jreq("POST", "/v1/completions", {"prompt": ids["tokens"], "max_tokens": 10, "temperature": 0})
    check("completions from token ids equal text", st == 200 and b3["choices"][0]["text"] == b["choices"][0]["text"], b3)
    st, b4 = s.jreq("POST", "/v1/completions", {"prompt": "def fibonacci(n):", "max_tokens": 4, "temperature": 0, "logprobs": 3})
    lp = b4.get("choices", [{}])[0].get("logprobs") or {}
    ok = (st == 200 and len(lp.get("tokens", [])) == 4 and len(lp.get("token_logprobs", [])) == 4
          and all(v <= 0 for v in lp["token_logprobs"]) and all(len(t) == 3 for t in lp["top_logprobs"])
          and all(lp["token_logprobs"][i] == max(lp["top_logprobs"][i].values()) for i in range(4)))
    check("completions logprobs (greedy: each token is its top alternative)", ok, b4)
    st, b5 = s.jreq("POST", "/v1/chat/completions", dict(CHAT, max_tokens=3, logprobs=True, top_logprobs=2))
    lc = (b5.get("choices", [{}])[0].get("logprobs") or {}).get("content", [])
    check("chat logprobs", st == 200 and len(lc) == 3 and all(len(e["top_logprobs"]) == 2 and "bytes" in e for e in lc), b5)
    # the same seed samples the same tokens, and sampling differs from greedy somewhere
    samp = dict(CHAT, temperature=1.0, seed=1234)
    r1 = s.jreq("POST", "/v1/chat/completions", samp)[1]["choices"][0]["message"]["content"]
    r2 = s.jreq("POST", "/v1/chat/completions", samp)[1]["choices"][0]["message"]["content"]
    check("seeded sampling repeats", r1 == r2, (r1, r2))


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
                   "required": ["city"]}}}]


def test_tools(s):
    """a tool call the bundled model really makes (its chat tuning has tool calls: tools/train/toolcalls.py),
    whole and streamed, and the round trip back with the tool's result"""
    ask = {"messages": [{"role": "user", "content": "What is the weather like in Paris?"}], "tools": WEATHER,
           "temperature": 0}
    st, b = s.jreq("POST", "/v1/chat/completions", ask)
    ch = b.get("choices", [{}])[0]
    calls = ch.get("message", {}).get("tool_calls") or []
    ok = (st == 200 and ch.get("finish_reason") == "tool_calls" and len(calls) == 1 and calls[0]["type"] == "function"
          and calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
          and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"} and ch["message"]["content"] is None)
    check("tool call: the model calls get_weather(city=Paris), finish_reason tool_calls", ok, b)
    st, h, text = s.stream("/v1/chat/completions", dict(ask, stream=True))
    deltas = [json.loads(e)["choices"][0] for e in sse_events(text)[:-1]]
    tc = [d["delta"]["tool_calls"][0] for d in deltas if d["delta"].get("tool_calls")]
    args = "".join(t.get("function", {}).get("arguments", "") for t in tc)
    ok = (len(tc) >= 2 and all(t["index"] == 0 for t in tc) and tc[0].get("id") and tc[0]["function"]["name"] == "get_weather"
          and json.loads(args) == {"city": "Paris"} and deltas[-1]["finish_reason"] == "tool_calls")
    check("tool call streamed: index, id, name, then the arguments", ok, text[-600:])
    back = dict(ask, messages=ask["messages"] + [
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"] if calls else "x",
         "content": json.dumps({"city": "Paris", "temp_c": 21, "sky": "sunny"})}])
    st, b = s.jreq("POST", "/v1/chat/completions", back)
    ch = b.get("choices", [{}])[0]
    check("tool round trip: the result goes back and the model answers", st == 200 and ch.get("finish_reason") == "stop"
          and "Paris" in (ch.get("message", {}).get("content") or "") and not ch["message"].get("tool_calls"), b)
    st, b = s.jreq("POST", "/v1/chat/completions", dict(ask, tools=WEATHER, tool_choice="none", max_tokens=40))
    ch = b.get("choices", [{}])[0]
    check("tool_choice none: no tools shown, no call", st == 200 and not ch.get("message", {}).get("tool_calls"), b)


def test_errors(s):
    bad = [
        ("bad JSON", "/v1/chat/completions", b"{\"messages\": [", 400, None),
        ("unknown field", "/v1/chat/completions", dict(CHAT, frobnicate=1), 400, "frobnicate"),
        ("wrong type", "/v1/chat/completions", dict(CHAT, temperature="hot"), 400, "temperature"),
        ("out of range", "/v1/chat/completions", dict(CHAT, top_p=1.5), 400, "top_p"),
        ("n > 1", "/v1/chat/completions", dict(CHAT, n=2), 400, "n"),
        ("image content", "/v1/chat/completions",
         dict(CHAT, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
         "messages[0].content"),
        ("penalty", "/v1/chat/completions", dict(CHAT, presence_penalty=1.0), 400, "presence_penalty"),
        ("json_schema", "/v1/chat/completions", dict(CHAT, response_format={"type": "json_schema"}), 400, "response_format"),
        ("five stops", "/v1/chat/completions", dict(CHAT, stop=["a", "b", "c", "d", "e"]), 400, "stop"),
        ("no prompt", "/v1/completions", {"max_tokens": 3}, 400, "prompt"),
        ("suffix", "/v1/completions", {"prompt": "a", "suffix": "b"}, 400, "suffix"),
        ("token id out of vocabulary", "/v1/completions", {"prompt": [10 ** 8]}, 400, "prompt"),
        ("context exceeded", "/v1/completions", {"prompt": "x " * 9000}, 400, "prompt"),
        ("wrong model", "/v1/chat/completions", dict(CHAT, model="gpt-4"), 404, "model"),
    ]
    for name, path, body, status, param in bad:
        st, b = s.jreq("POST", path, body)
        check("%d on %s" % (status, name), st == status and is_err(b, param=param), (st, b))
    st, b = s.jreq("POST", "/v1/completions", {"prompt": "x " * 9000})
    check("context_length_exceeded code", is_err(b, code="context_length_exceeded"), b)
    st, b = s.jreq("GET", "/nowhere")
    check("404 on an unknown route", st == 404 and is_err(b), (st, b))
    st, b = s.jreq("GET", "/%ff%fe")
    check("404 on a route of invalid UTF-8, still a JSON error", st == 404 and is_err(b), (st, b))
    st, b = s.jreq("POST", "/v1/completions", json.dumps({"prompt": "a", "\u00e9" * 300: 1}))
    check("400 naming a long non-ASCII field, cut to valid UTF-8", st == 400 and is_err(b), (st, b))
    st, b = s.jreq("DELETE", "/v1/models")
    check("405 on a wrong method", st == 405 and is_err(b), (st, b))
    st, b = s.jreq("GET", "/v1/chat/completions")
    check("405 on GET of a POST route", st == 405 and is_err(b), (st, b))
    st, b = s.jreq("POST", "/debug/logits", {"tokens": [1]})
    check("no /debug route without --debug", st == 404, (st, b))
    big = json.dumps(dict(CHAT, messages=[{"role": "user", "content": "a" * 70000}]))
    st, b = s.jreq("POST", "/v1/chat/completions", big)
    check("413 on a body over --max-request-bytes", st == 413 and is_err(b, code="request_too_large"), (st, b))
    # chunked upload growing past the limit: refused without a Content-Length
    c = socket.create_connection((s.host, s.port), timeout=10)
    c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"a" * 16384
    try:
        for _ in range(6):
            c.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        c.sendall(b"0\r\n\r\n")
    except OSError:
        pass
    resp = b""
    try:
        while True:
            d = c.recv(65536)
            if not d:
                break
            resp += d
            if b"\r\n\r\n" in resp and resp.rstrip().endswith(b"}"):
                break
    except OSError:
        pass
    c.close()
    check("413 on a chunked body over the limit", resp.startswith(b"HTTP/1.1 413"), resp[:60])


def test_auth():
    s = Server("--api-key", "sekrit", "--draft", "none").wait_ready()
    try:
        st, b = s.jreq("GET", "/v1/models")
        check("401 without a key", st == 401 and is_err(b, code="invalid_api_key"), (st, b))
        st, b = s.jreq("GET", "/v1/models", headers={"Authorization": "Bearer wrong!"})
        check("401 with a wrong key", st == 401 and is_err(b), (st, b))
        st, b = s.jreq("GET", "/v1/models", headers={"Authorization": "Bearer sekrit"})
        check("200 with the key", st == 200, (st, b))
        st, b = s.jreq("GET", "/health")
        check("/health needs no key", st == 200, (st, b))
        st, b = s.jreq("POST", "/v1/chat/completions", CHAT)
        check("401 on a generation without a key", st == 401, (st, b))
    finally:
        s.stop()


def test_loading():
    if not STORE:
        check("503 while loading", False, "no store given (tests/run.sh prepares one)")
        return
    s = Server("--model", STORE, "--emulate-drives", "2:5000", "--ram-budget", "6M", "--draft", "none")
    try:
        st, b = s.jreq("POST", "/v1/completions", {"model": os.path.basename(STORE.rstrip("/")), "prompt": "hi"})
        st2, b2 = s.jreq("GET", "/health")
        check("503 while loading", st == 503 and is_err(b, code="model_loading"), (st, b))
        check("/health says loading", st2 == 503 and b2.get("status") == "loading", (st2, b2))
        s.wait_ready()
        st, b = s.jreq("GET", "/health")
        check("/health ok once loaded", st == 200, (st, b))
        st, b = s.jreq("POST", "/v1/completions", {"model": os.path.basename(STORE.rstrip("/")), "prompt": "def f(x):",
                                                   "max_tokens": 4, "temperature": 0})
        m = s.metrics()
        req, hits = m.get("deltafin_store_expert_requests_total", 0), m.get("deltafin_store_expert_hits_total", -1)
        check("/metrics: the store's expert requests, hits and hit rate", st == 200 and req > 0 and 0 <= hits <= req
              and abs(m.get("deltafin_store_hit_rate", -1) - hits / req) < 1e-3, (st, m))
    finally:
        s.stop()


def test_stream(s):
    ref = s.jreq("POST", "/v1/chat/completions", CHAT)[1]
    st, h, text = s.stream("/v1/chat/completions", dict(CHAT, stream=True, stream_options={"include_usage": True}))
    evs = sse_events(text)
    ok = st == 200 and h.get("Content-Type") == "text/event-stream" and evs[-1] == "[DONE]"
    chunks = [json.loads(e) for e in evs[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    ok = ok and all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    ok = ok and chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    ok = ok and chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24
    ok = ok and all(c.get("usage", 0) is None for c in chunks[:-1])
    fin = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    ok = ok and fin[-1] == "length" and all(f is None for f in fin[:-1])
    check("chat stream: SSE chunks, usage chunk, [DONE]", ok, text[:400])
    check("chat stream text equals the whole response", content == ref["choices"][0]["message"]["content"],
          (content, ref["choices"][0]["message"]["content"]))
    st, h, text = s.stream("/v1/chat/completions", dict(CHAT, stream=True))
    chunks = [json.loads(e) for e in sse_events(text)[:-1]]
    check("no usage chunk unless asked", all("usage" not in c for c in chunks) and chunks[-1]["choices"], text[-300:])
    # completions stream
    body = {"prompt": "def fibonacci(n):", "max_tokens": 16, "temperature": 0}
    whole = s.jreq("POST", "/v1/completions", body)[1]["choices"][0]["text"]
    st, h, text = s.stream("/v1/completions", dict(body, stream=True))
    evs = sse_events(text)
    streamed = "".join(json.loads(e)["choices"][0]["text"] for e in evs[:-1])
    check("completions stream equals the whole response", evs[-1] == "[DONE]" and streamed == whole, (streamed, whole))
    st, h, text = s.stream("/v1/completions", dict(body, stream=True, echo=True))
    streamed = "".join(json.loads(e)["choices"][0]["text"] for e in sse_events(text)[:-1])
    check("completions stream with echo leads with the prompt", streamed == body["prompt"] + whole, streamed)
    # stop strings: a piece of the greedy text that spans tokens is never emitted, not even in part
    long = {"prompt": "def fibonacci(n):", "max_tokens": 40, "temperature": 0}
    full = s.jreq("POST", "/v1/completions", long)[1]["choices"][0]["text"]
    pieces = s.jreq("POST", "/tokenize", {"content": "def fibonacci(n):" + full, "with_pieces": True})[1]["pieces"]
    # a stop string that starts inside one token and ends inside a later one
    at, cut = 0, None
    for p in pieces:
        if at > len("def fibonacci(n):") + 4 and len(p["piece"]) >= 2 and cut is None:
            cut = at - len("def fibonacci(n):") + 1
        at += len(p["piece"])
    stop = full[cut:cut + 4] if cut is not None else ""
    if len(stop) == 4 and full.find(stop) == cut:
        st, h, text = s.stream("/v1/completions", dict(long, stream=True, stop=[stop, "zzzz-never"]))
        evs = sse_events(text)
        got = "".join(json.loads(e)["choices"][0]["text"] for e in evs[:-1])
        fin = json.loads(evs[-2])["choices"][0]["finish_reason"]
        check("stop string held back across chunks, never emitted", got == full[:cut] and fin == "stop",
              (stop, got, full[:cut], fin))
        st, b = s.jreq("POST", "/v1/completions", dict(long, stop=stop))
        check("stop string (whole response)", b["choices"][0]["text"] == full[:cut] and b["choices"][0]["finish_reason"] == "stop", b)
    else:
        check("stop string held back across chunks, never emitted", False, "no usable stop piece in %r" % full)


# a generation that runs until its client goes away: raw completion through end-of-text
LONG = {"prompt": "def main():", "max_tokens": 1000000, "temperature": 0, "ignore_eos": True, "stream": True}


def open_stream(s, body, path="/v1/completions"):
    c = socket.create_connection((s.host, s.port), timeout=30)
    data = json.dumps(body).encode()
    c.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return c


def wait_idle(s, t=20):
    end = time.time() + t
    while time.time() < end:
        m = s.metrics()
        if m.get("deltafin_running") == 0 and m.get("deltafin_queue_depth") == 0:
            return m
        time.sleep(0.05)
    return s.metrics()


def test_cancel(s):
    wait_idle(s)
    m0 = s.metrics()
    long = LONG
    c = open_stream(s, long)
    got = b""
    while got.count(b"data: ") < 3:
        got += c.recv(4096)
    c.close()
    m1 = wait_idle(s)
    gen = m1["deltafin_generation_tokens_total"] - m0["deltafin_generation_tokens_total"]
    check("a stream the client drops is cancelled", m1["deltafin_cancelled_total"] == m0["deltafin_cancelled_total"] + 1
          and gen < 5000, (gen, m1["deltafin_cancelled_total"]))
    # queued: one runs, one waits and goes away; then the running one goes away too
    a = open_stream(s, long)
    got = b""
    while got.count(b"data: ") < 2:
        got += a.recv(4096)
    b = open_stream(s, dict(LONG, stream=False))
    end = time.time() + 10
    while s.metrics()["deltafin_queue_depth"] < 1 and time.time() < end:
        time.sleep(0.02)
    b.close()
    time.sleep(0.3)
    a.close()
    m2 = wait_idle(s)
    check("a queued request the client drops never runs",
          m2["deltafin_cancelled_total"] == m1["deltafin_cancelled_total"] + 2
          and m2["deltafin_generation_requests_total"] == m1["deltafin_generation_requests_total"] + 1,
          (m1, m2))


def test_queue():
    s = Server("--queue", "1", "--draft", "none").wait_ready()
    try:
        long = LONG
        a = open_stream(s, long)
        got = b""
        while got.count(b"data: ") < 2:
            got += a.recv(4096)
        b = open_stream(s, long)
        end = time.time() + 10
        while s.metrics()["deltafin_queue_depth"] < 1 and time.time() < end:
            time.sleep(0.02)
        st, body = s.jreq("POST", "/v1/chat/completions", CHAT)
        check("429 when the queue is full", st == 429 and is_err(body, code="queue_full")
              and body["error"]["type"] == "rate_limit_error", (st, body))
        t0 = time.time()
        st, _ = s.jreq("GET", "/health")
        st2, _ = s.jreq("POST", "/tokenize", {"content": "x"})
        check("non-generating routes never wait", st == 200 and st2 == 200 and time.time() - t0 < 2.0, time.time() - t0)
        a.close()
        b.close()
        wait_idle(s)
    finally:
        s.stop()


def test_engine_failure():
    """500: the engine fails mid-generation (a copy of the store with one layer's experts damaged, read
    and checked as they stream in); whole: a 500 error object; streamed: an error event, then [DONE];
    the server carries on"""
    if not STORE:
        check("500 when the engine fails", False, "no store given")
        return
    import json as _j
    import shutil
    with tempfile.TemporaryDirectory() as d:
        bad = os.path.join(d, "bad")
        shutil.copytree(STORE, bad)
        man = _j.load(open(os.path.join(bad, "manifest.json")))
        ex = [b for b in man["blobs"] if b["kind"] == "expert"]
        pack = [f for f in os.listdir(bad) if f.endswith(".pack")][0]
        with open(os.path.join(bad, pack), "r+b") as f:
            for b in ex:
                if b["layer"] == ex[0]["layer"]:
                    f.seek(b["copies"][0][1] + 100)
                    f.write(b"\xde\xad\xbe\xef" * 4)
        s = Server("--model", bad, "--ram-budget", "6M", "--draft", "none").wait_ready()
        try:
            body = {"model": "bad", "prompt": "def f(x):", "max_tokens": 4}
            st, b = s.jreq("POST", "/v1/completions", body)
            check("500 when the engine fails (a damaged expert)", st == 500 and is_err(b) and
                  b["error"]["type"] == "server_error" and "checksum" in b["error"]["message"], (st, b))
            st, h, text = s.stream("/v1/completions", dict(body, stream=True))
            evs = sse_events(text)
            check("an engine failure mid-stream: an error event, then [DONE]",
                  st == 200 and len(evs) >= 2 and is_err(json.loads(evs[-2])) and evs[-1] == "[DONE]", text[-300:])
            st, b = s.jreq("GET", "/health")
            check("the server carries on after an engine failure", st == 200, (st, b))
        finally:
            s.stop()


def test_queue_zero():
    """--queue 0: one generation at a time and nothing waiting; an idle server still runs one"""
    s = Server("--queue", "0", "--draft", "none").wait_ready()
    try:
        st, b = s.jreq("POST", "/v1/chat/completions", CHAT)
        check("--queue 0: an idle server runs a generation", st == 200, (st, b))
        a = open_stream(s, LONG)
        got = b""
        while got.count(b"data: ") < 2:
            got += a.recv(4096)
        st, b = s.jreq("POST", "/v1/chat/completions", CHAT)
        check("--queue 0: 429 while one runs", st == 429 and is_err(b, code="queue_full"), (st, b))
        a.close()
        wait_idle(s)
    finally:
        s.stop()


def test_sigterm_mid_stream():
    """SIGTERM while a stream runs: it ends with an error event (not a 'length' finish), then [DONE]"""
    s = Server("--draft", "none").wait_ready()
    a = open_stream(s, LONG)
    got = b""
    while got.count(b"data: ") < 3:
        got += a.recv(4096)
    s.p.terminate()
    a.settimeout(30)
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            got += d
    except OSError:
        pass
    a.close()
    text = got.decode("utf-8", "replace")
    check("SIGTERM mid-stream: an error event saying the server stops, then [DONE]",
          '"error"' in text and "stopping" in text and "data: [DONE]" in text and '"finish_reason":"length"' not in text,
          text[-400:])
    s.stop()


def b64logits(s, ids):
    st, b = s.jreq("POST", "/debug/logits", {"tokens": ids})
    return st, b


def test_prefix_reuse():
    s = Server("--debug").wait_ready()
    try:
        turn1 = [{"role": "user", "content": "Write a function that reverses a string."}]
        r = s.jreq("POST", "/v1/chat/completions", {"messages": turn1, "temperature": 0, "max_tokens": 30})[1]
        msg = r["choices"][0]["message"]
        turn2 = turn1 + [{"role": "assistant", "content": msg["content"]}, {"role": "user", "content": "Now in C."}]
        r2 = s.jreq("POST", "/v1/chat/completions", {"messages": turn2, "temperature": 0, "max_tokens": 8})[1]
        cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
        check("a follow-up turn reuses the conversation's prefix", cached >= r["usage"]["prompt_tokens"],
              (cached, r["usage"]))
        m = s.metrics()
        drafters = [k for k in m if k.startswith("deltafin_draft_tokens_total") and 'kind="proposed"' in k]
        ok = (m.get("deltafin_prefix_reuse_hits_total", 0) >= 1 and m.get("deltafin_prefix_reused_tokens_total", 0) >= cached
              and m.get("deltafin_generation_tokens_total") == r["usage"]["completion_tokens"] + r2["usage"]["completion_tokens"]
              and len(drafters) >= 1
              and all(m[k.replace("proposed", "accepted")] <= m[k] for k in drafters)
              and m.get("deltafin_decode_tokens_per_second", 0) > 0)
        check("/metrics: prefix reuse, generated tokens, drafters proposed and accepted, tokens/s", ok, m)
        ids = s.jreq("POST", "/tokenize", {"messages": turn2 + [{"role": "user", "content": "And in Rust?"}]})[1]["tokens"]
        st, b = b64logits(s, ids)
        warm = base64.b64decode(b["logits"]) if st == 200 else b""
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "l.bin")
            subprocess.run([BIN, "eval", "--tokens", ",".join(map(str, ids)), "--logits-out", out], check=True,
                           capture_output=True)
            cold = open(out, "rb").read()[-len(warm):] if warm else b""
        check("prefix-reused logits are a cold run's bits (memcmp with eval)", st == 200 and b["cached_tokens"] > 0
              and len(warm) > 0 and warm == cold, (st, b.get("cached_tokens"), len(warm)))
    finally:
        s.stop()


def test_cache_dir():
    """--cache-dir: a restarted server resumes a conversation from disk with a cold run's logits;
    a damaged state is refused and removed; the byte budget holds"""
    with tempfile.TemporaryDirectory() as d:
        cache = os.path.join(d, "states")
        turn1 = [{"role": "user", "content": "Write a function that parses a date."}]
        s = Server("--debug", "--cache-dir", cache).wait_ready()
        try:
            r = s.jreq("POST", "/v1/chat/completions", {"messages": turn1, "temperature": 0, "max_tokens": 24})[1]
            wait_idle(s)
            time.sleep(0.2)  # the state is written once the answer is out
        finally:
            s.stop()
        states = [f for f in os.listdir(cache) if f.endswith(".state")]
        check("--cache-dir: the conversation's state is on disk", len(states) == 1, states)
        turn2 = turn1 + [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "Now handle time zones."}]
        s = Server("--debug", "--cache-dir", cache).wait_ready()
        try:
            ids = s.jreq("POST", "/tokenize", {"messages": turn2})[1]["tokens"]
            st, b = b64logits(s, ids)
            warm = base64.b64decode(b["logits"]) if st == 200 else b""
            out = os.path.join(d, "l.bin")
            subprocess.run([BIN, "eval", "--tokens", ",".join(map(str, ids)), "--logits-out", out], check=True,
                           capture_output=True)
            cold = open(out, "rb").read()[-len(warm):] if warm else b""
            check("--cache-dir: after a restart the conversation resumes from disk (%s of %d tokens), with a cold "
                  "run's logits (memcmp with eval)" % (b.get("cached_tokens"), len(ids)),
                  st == 200 and b["cached_tokens"] >= r["usage"]["prompt_tokens"] and warm == cold and len(warm) > 0,
                  (st, b.get("cached_tokens"), r["usage"]["prompt_tokens"]))
            m = s.metrics()
            check("--cache-dir: /metrics counts the load", m.get("deltafin_cache_loads_total") == 1, m)
        finally:
            s.stop()
        # damage every state: the next server refuses and removes them, and still answers rightly
        for f in os.listdir(cache):
            p = os.path.join(cache, f)
            data = bytearray(open(p, "rb").read())
            data[len(data) // 2] ^= 0x55
            open(p, "wb").write(bytes(data))
        s = Server("--cache-dir", cache).wait_ready()
        try:
            body = {"messages": turn2, "temperature": 0, "max_tokens": 8}
            got = s.jreq("POST", "/v1/chat/completions", body)[1]
            damaged = [f for f in os.listdir(cache) if f in states]
            check("--cache-dir: a damaged state is refused and removed", not damaged and
                  got["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and "checksum" in s.stderr(),
                  (damaged, got.get("usage"), s.stderr()[-300:]))
        finally:
            s.stop()
        fresh = Server("--draft", "none").wait_ready()
        try:
            want = fresh.jreq("POST", "/v1/chat/completions", body)[1]["choices"][0]["message"]["content"]
        finally:
            fresh.stop()
        check("--cache-dir: the answer after a refused state is a cold server's", got["choices"][0]["message"]["content"] == want,
              (got["choices"][0]["message"]["content"], want))
        # a budget of about one state: distinct conversations evict the least recently used
        one = max(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache))
        s = Server("--cache-dir", cache, "--cache-bytes", str(int(one * 1.5))).wait_ready()
        try:
            for k in range(4):
                s.jreq("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "topic %d" % k}],
                                                         "temperature": 0, "max_tokens": 8})
            wait_idle(s)
            time.sleep(0.2)
            total = sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache))
        finally:
            s.stop()
        check("--cache-dir: the byte budget holds (%d bytes of %d)" % (total, int(one * 1.5)),
              0 < total <= one * 1.5, total)


def load_worker(s, k, n, refs, errors, stats):
    rnd = random.Random(k)
    for i in range(n):
        kind = rnd.randrange(9)
        try:
            if kind <= 2:  # a valid request whose answer is known
                name, path, body = refs[rnd.randrange(len(refs))][:3]
                st, b = s.jreq("POST", path, body)
                want = refs[[r[0] for r in refs].index(name)][3]
                got = b["choices"][0].get("text", None) if path == "/v1/completions" else b["choices"][0]["message"]["content"]
                if st != 200 or got != want:
                    errors.append(("valid %s" % name, st, got, want))
                stats["valid"] += 1
            elif kind == 3:  # malformed JSON
                st, b = s.jreq("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"')
                if st != 400:
                    errors.append(("malformed", st, b))
            elif kind == 4:  # wrong types
                st, b = s.jreq("POST", "/v1/completions", {"prompt": {"a": 1}, "max_tokens": "many"})
                if st != 400:
                    errors.append(("types", st, b))
            elif kind == 5:  # oversized
                st, b = s.jreq("POST", "/v1/completions", {"prompt": "z" * 70000})
                if st != 413:
                    errors.append(("oversized", st))
            elif kind == 6:  # slow-loris: half a header, then silence; the server times it out
                c = socket.create_connection((s.host, s.port), timeout=10)
                c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
                stats["loris"].append(c)
            elif kind == 7:  # abrupt disconnect mid-stream
                c = open_stream(s, dict(CHAT, max_tokens=500, stream=True), "/v1/chat/completions")
                c.recv(512)
                c.close()
            else:  # garbage bytes
                c = socket.create_connection((s.host, s.port), timeout=10)
                c.sendall(bytes(rnd.randrange(256) for _ in range(300)) + b"\r\n\r\n")
                try:
                    c.recv(4096)
                except OSError:
                    pass
                c.close()
        except Exception as e:  # noqa: BLE001 - any failure of the client side is a finding
            errors.append(("exception", kind, repr(e)))


def test_load():
    s = Server("--timeout", "2", "--max-request-bytes", "65536").wait_ready()
    try:
        refs = []
        for k, prompt in enumerate(["def add(a, b):", "import os\n", "class Stack:", "for i in range(10):"]):
            body = {"prompt": prompt, "max_tokens": 12, "temperature": 0}
            refs.append(("c%d" % k, "/v1/completions", body, s.jreq("POST", "/v1/completions", body)[1]["choices"][0]["text"]))
            cb = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 10, "temperature": 0}
            refs.append(("h%d" % k, "/v1/chat/completions", cb,
                         s.jreq("POST", "/v1/chat/completions", cb)[1]["choices"][0]["message"]["content"]))
        wait_idle(s)
        time.sleep(0.3)
        fd0, rss0 = s.fds(), s.rss_kb()
        errors, stats = [], {"valid": 0, "loris": []}
        ts = [threading.Thread(target=load_worker, args=(s, k, 40, refs, errors, stats)) for k in range(8)]
        t0 = time.time()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        took = time.time() - t0
        for c in stats["loris"]:
            c.close()
        wait_idle(s)
        time.sleep(2.5)  # past --timeout: every connection the clients left is closed
        fd1, rss1 = s.fds(), s.rss_kb()
        st, _ = s.jreq("GET", "/health")
        check("load: 320 requests from 8 clients, every valid one answered correctly (%d valid, %.1f s)"
              % (stats["valid"], took), not errors and st == 200 and s.p.poll() is None, errors[:3])
        check("load: no file descriptor leaked (%d before, %d after)" % (fd0, fd1), fd1 <= fd0, (fd0, fd1))
        # a sanitizer's quarantine and shadow memory grow by design: a looser bound there
        libs = subprocess.run(["ldd", BIN], capture_output=True, text=True).stdout
        bound = 256 if ("libasan" in libs or "libtsan" in libs) else 64
        check("load: RSS within %d MiB of where it started (%d -> %d KiB)" % (bound, rss0, rss1),
              rss1 - rss0 < bound * 1024, (rss0, rss1))
    finally:
        s.stop()


def main():
    s = Server("--max-request-bytes", "65536", "--context", "4096").wait_ready()
    try:
        test_routes(s)
        test_tools(s)
        test_errors(s)
        test_stream(s)
        test_cancel(s)
    finally:
        s.stop()
    test_auth()
    test_queue()
    test_queue_zero()
    test_engine_failure()
    test_sigterm_mid_stream()
    test_loading()
    test_prefix_reuse()
    test_cache_dir()
    test_load()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
