#!/usr/bin/env python3
"""setup_test.py BIN BUILD — `deltafin setup` and `setup-qwen` end to end against tests/hub/testhub.py.

On loopback, with the test hub serving stand-ins under the real repo names: the bundled model
(models/default, the oracle case default-k3) as moonshotai/Kimi-K3 (gated: it needs HF_TOKEN), its
DSpark (models/default-dspark) as Inferact/Kimi-K3-DSpark at the pinned commit, and the bundled
Qwen3 drafter as Qwen/Qwen3-0.6B-Base and Qwen/Qwen3-1.7B-Base. Every install is checked byte for
byte against the source files, and `eval` without --model against the bundled model's logits
(memcmp) and the oracle's (1e-3). Faults are injected through the hub's control API; what the
client did is read from the hub's request log (counts, never times).

Prints "ok   setup: ..." / "FAIL setup: ..." lines and a last "N passed, M failed".
"""
import array, glob, json, math, os, shutil, signal, subprocess, sys, tempfile, time, urllib.request

BIN, BUILD = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DSPARK_REV = "cf6b8244620e7ea4b0651d214f28e89eac75bed6"
TOKEN = "hf_setuptesttoken"
ORACLE = os.path.join(os.environ.get("DF_TEST_DATA", os.path.join(BUILD, "testdata")), "oracle", "default-k3")

passed = failed = 0


def check(ok, what, why=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   setup: {what}", flush=True)
    else:
        failed += 1
        print(f"FAIL setup: {what}" + (f": {why}" if why else ""), flush=True)
    return ok


work = tempfile.mkdtemp(prefix="hub-setup.", dir=BUILD)
src = os.path.join(work, "src")
repos = {
    "moonshotai/Kimi-K3": os.path.join(src, "k3"),
    "Inferact/Kimi-K3-DSpark": os.path.join(ROOT, "models", "default-dspark"),
    "Qwen/Qwen3-0.6B-Base": os.path.join(ROOT, "models", "default-qwen3-drafter"),
    "Qwen/Qwen3-1.7B-Base": os.path.join(ROOT, "models", "default-qwen3-drafter"),
}
shutil.copytree(os.path.join(ROOT, "models", "default"), repos["moonshotai/Kimi-K3"])
with open(os.path.join(repos["moonshotai/Kimi-K3"], "README.md"), "w") as f:
    f.write("# a model card: setup leaves it on the hub\n")

hub = None
url = None


def start_hub():
    global hub, url
    pf = os.path.join(work, "port")
    if os.path.exists(pf):
        os.unlink(pf)
    args = [sys.executable, os.path.join(HERE, "testhub.py"), "--port", "0", "--port-file", pf,
            "--token", TOKEN, "--gated", "moonshotai/Kimi-K3"]
    for name, d in repos.items():
        args += ["--repo", f"{name}={d}" + (f"@{DSPARK_REV}" if name == "Inferact/Kimi-K3-DSpark" else "")]
    hub = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "hub.log"), "a"))
    for _ in range(300):
        if os.path.exists(pf) and open(pf).read().strip():
            url = "http://127.0.0.1:" + open(pf).read().split()[0]
            return
        time.sleep(0.05)
    raise SystemExit("FAIL setup: the test hub did not start\n0 passed, 1 failed")


def stop_hub():
    global hub
    if hub:
        hub.terminate()
        hub.wait(10)
        hub = None


def control(method, what, body=None):
    req = urllib.request.Request(url + "/_control/" + what, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        data = r.read()
    return json.loads(data) if data and method == "GET" else None


def env(root, token=True, **extra):
    e = dict(os.environ, HF_ENDPOINT=url, DELTAFIN_HOME=root)
    e.pop("HF_TOKEN", None)
    e.pop("HF_HUB_OFFLINE", None)
    if token:
        e["HF_TOKEN"] = TOKEN
    e.update(extra)
    return e


def deltafin(args, root, timeout=120, **kw):
    return subprocess.run([BIN] + args, env=env(root, **kw), capture_output=True, text=True, timeout=timeout)


def same_bytes(a, b):
    with open(a, "rb") as x, open(b, "rb") as y:
        return x.read() == y.read()


def tree_equal(dst, srcdir, skip=("README.md",)):
    """the installed folder holds every source file (but skip) with the same bytes"""
    for p in sorted(os.listdir(srcdir)):
        if p in skip:
            continue
        if not os.path.exists(os.path.join(dst, p)) or not same_bytes(os.path.join(dst, p), os.path.join(srcdir, p)):
            return f"{dst}/{p} differs from the hub's"
    return ""


def leftovers(root):
    return [p for p in glob.glob(os.path.join(root, "**", "*"), recursive=True) if p.endswith(".incomplete")]


def gets(log, repo_path, statuses=(200, 206)):
    return [e for e in log if e["method"] == "GET" and e["path"] == repo_path and e["status"] in statuses]


def oneline(err):
    lines = [l for l in err.strip().split("\n") if l]
    return len(lines) == 1


# ---- the oracle's first prompt, and the bundled model's logits for it ----
exp = json.load(open(os.path.join(ORACLE, "expected.json")))
ids = exp["prompts"][0]["ids"]
ref_logits = os.path.join(work, "ref.f32")
r = subprocess.run([BIN, "eval", "--model", os.path.join(ROOT, "models", "default"), "--tokens",
                    ",".join(map(str, ids)), "--logits-out", ref_logits], capture_output=True, text=True)
if r.returncode:
    raise SystemExit(f"FAIL setup: eval of the bundled model failed: {r.stderr.strip()}\n0 passed, 1 failed")


def eval_installed(root, what, **kw):
    out = os.path.join(work, "installed.f32")
    r = deltafin(["eval", "--tokens", ",".join(map(str, ids)), "--logits-out", out], root, **kw)
    if not check(r.returncode == 0 and "model: the installed Kimi K3" in r.stderr,
                 f"{what}: eval without --model runs the installed K3 and says so", r.stderr.strip()[-300:]):
        return
    check(same_bytes(out, ref_logits), f"{what}: its logits are the bundled model's, bit for bit (memcmp)")
    got = array.array("f", open(out, "rb").read())
    want = array.array("f", open(os.path.join(ORACLE, exp["prompts"][0]["logits_file"]), "rb").read())
    n = min(len(got), len(want))
    num = sum((got[i] - want[i]) ** 2 for i in range(n))
    den = sum(want[i] ** 2 for i in range(n)) or 1
    rel = math.sqrt(num / den)
    check(len(got) == len(want) and rel < 1e-3, f"{what}: logits within 1e-3 of the oracle (rel L2 {rel:.2e})")


start_hub()
try:
    # ---- a plan changes nothing ----
    ra = os.path.join(work, "a")
    r = deltafin(["setup", "--full", "--dry-run", "--include-qwen"], ra)
    check(r.returncode == 0 and "moonshotai/Kimi-K3@" in r.stdout and DSPARK_REV in r.stdout and "space:" in r.stdout
          and "Qwen/Qwen3-1.7B-Base@" in r.stdout, "--dry-run prints the repos, their commits, sizes and the free space",
          (r.stdout + r.stderr)[-300:])
    check(not os.path.exists(ra), "--dry-run writes nothing")

    # ---- the hub's refusals, each one line ----
    rg = os.path.join(work, "gated")
    r = deltafin(["setup", "--full"], rg, token=False)
    check(r.returncode == 1 and oneline(r.stderr) and "401" in r.stderr and "HF_TOKEN" in r.stderr
          and not os.path.exists(os.path.join(rg, "install.json")),
          "a gated repo without HF_TOKEN: one line naming 401 and HF_TOKEN", r.stderr.strip())
    control("POST", "faults", [{"repo": "moonshotai/Kimi-K3", "path": "model.safetensors", "kind": "etag"}])
    r = deltafin(["setup", "--full"], os.path.join(work, "etag"))
    control("DELETE", "faults")
    check(r.returncode == 1 and oneline(r.stderr) and "X-Linked-Etag" in r.stderr and
          not glob.glob(os.path.join(work, "etag", "download", "*", "model.safetensors")),
          "a resolve answer whose X-Linked-Etag is not the resolved sha256 stops the download", r.stderr.strip())
    r = deltafin(["setup", "--full", "--revision", "0" * 40], os.path.join(work, "nf"))
    check(r.returncode == 1 and oneline(r.stderr) and "404" in r.stderr and "RevisionNotFound" in r.stderr,
          "an unknown revision: one line naming 404", r.stderr.strip())

    # ---- faults during a full install: the bytes come out right ----
    control("DELETE", "log")
    control("POST", "faults", [
        {"repo": "moonshotai/Kimi-K3", "path": "model.safetensors", "kind": "drop", "after": 5000000},
        {"repo": "moonshotai/Kimi-K3", "path": "tiktoken.model", "kind": "truncate", "after": 1000},
        {"repo": "Inferact/Kimi-K3-DSpark", "path": "model.safetensors", "kind": "corrupt"},
        {"repo": "moonshotai/Kimi-K3", "path": "config.json", "kind": "503", "retry_after": 1},
        {"repo": "moonshotai/Kimi-K3", "path": "generation_config.json", "kind": "429", "retry_after": 1},
        {"repo": "Qwen/Qwen3-1.7B-Base", "path": "model.safetensors", "kind": "drop", "after": 1000000},
        {"repo": "Qwen/Qwen3-1.7B-Base", "path": "model.safetensors", "kind": "range200"},
        {"repo": "moonshotai/Kimi-K3", "path": "model.safetensors", "kind": "cdn", "count": 10},
    ])
    r = deltafin(["setup", "--full", "--include-qwen"], ra, timeout=300)
    log = control("GET", "log")
    control("DELETE", "faults")
    ok = check(r.returncode == 0, "setup --full --include-qwen completes through the faults", r.stderr.strip()[-400:])
    if ok:
        k3 = [e for e in log if e["url"].find("Kimi-K3/") >= 0 or "/Kimi-K3/" in e["url"]]
        store = os.path.join(ra, "k3")
        check(tree_equal(os.path.join(ra, "k3-dspark"), repos["Inferact/Kimi-K3-DSpark"]) == "", "the DSpark files are the hub's bytes")
        check(tree_equal(os.path.join(ra, "qwen3-0.6b-base"), repos["Qwen/Qwen3-0.6B-Base"]) == "" and
              tree_equal(os.path.join(ra, "qwen3-1.7b-base"), repos["Qwen/Qwen3-1.7B-Base"]) == "", "the Qwen files are the hub's bytes")
        small = [p for p in ("config.json", "generation_config.json", "tiktoken.model", "tokenizer_config.json")]
        check(all(same_bytes(os.path.join(store, p), os.path.join(repos["moonshotai/Kimi-K3"], p)) for p in small),
              "the store's config and tokenizer files are the hub's bytes")
        check(not leftovers(ra) and not os.path.exists(os.path.join(ra, "download")),
              "no .incomplete file is left, and the download is gone once the store is complete")
        check(not os.path.exists(os.path.join(store, "README.md")), "the model card stays on the hub")
        mk = [e for e in log if e["path"] == "model.safetensors" and "Kimi-K3/" in e["url"] and "DSpark" not in e["url"]
              and e["method"] == "GET" and e["status"] in (200, 206)]
        check(len(mk) >= 2 and mk[0]["fault"] == "drop" and any((e["range"] or "").startswith("bytes=") and
                                                               e["range"] != "bytes=0-" for e in mk[1:]),
              "a connection dropped mid-file is resumed with a Range request",
              json.dumps([(e["range"], e["status"], e["fault"]) for e in mk]))
        tk = gets(log, "tiktoken.model")
        check(len(tk) >= 2 and tk[0]["fault"] == "truncate", "a truncated body is fetched again",
              json.dumps([(e["range"], e["fault"]) for e in tk]))
        ds = [e for e in log if "DSpark" in e["url"] and e["path"] == "model.safetensors" and e["method"] == "GET"
              and e["status"] == 200]
        check(len(ds) == 2 and ds[0]["fault"] == "corrupt" and ds[1]["range"] is None,
              "corrupt bytes fail the sha256 and the file is fetched again from the start",
              json.dumps([(e["range"], e["fault"]) for e in ds]))
        for code, path in (("503", "config.json"), ("429", "generation_config.json")):
            es = [e for e in log if e["path"] == path and "Kimi-K3/" in e["url"] and "DSpark" not in e["url"]
                  and "Qwen" not in e["url"]]
            check(len(es) >= 2 and es[0]["status"] == int(code) and es[-1]["status"] in (200, 206),
                  f"a {code} with Retry-After is retried", json.dumps([(e["status"], e["fault"]) for e in es]))
        q = [e for e in log if "Qwen3-1.7B" in e["url"] and e["path"] == "model.safetensors" and e["method"] == "GET"
             and e["status"] in (200, 206)]
        check(len(q) >= 2 and q[1]["fault"] == "range200" and q[1]["range"] and q[1]["status"] == 200,
              "a 200 answer to a Range request restarts the file (and it comes out right)",
              json.dumps([(e["range"], e["status"], e["fault"]) for e in q]))
        cdn = [e for e in log if e["host"] == "cdn"]
        main_k3 = [e for e in log if e["host"] == "main" and "/resolve/" in e["url"] and "Kimi-K3/" in e["url"]
                   and "DSpark" not in e["url"]]
        check(cdn and not any(e["auth"] for e in cdn) and main_k3 and all(e["auth"] for e in main_k3),
              "a cross-host redirect: the token goes to the hub, never to the other host",
              f"{len(cdn)} cdn requests, auth {[e['auth'] for e in cdn]}")
        inst = json.load(open(os.path.join(ra, "install.json")))
        check(inst["dspark"]["commit"] == DSPARK_REV and os.path.realpath(os.path.join(ra, "k3-qwen3-drafter")) ==
              os.path.realpath(os.path.join(ra, "qwen3-0.6b-base")), "install.json pins the DSpark commit; the Qwen drafter is beside K3")
        eval_installed(ra, "after setup --full")
        r = deltafin(["setup", "--check"], ra)
        check(r.returncode == 0 and r.stdout.count("ok   ") == 5, "setup --check passes on the install", (r.stdout + r.stderr)[-300:])
        control("DELETE", "log")
        r = deltafin(["setup-qwen"], ra)
        log = control("GET", "log")
        check(r.returncode == 0 and not [e for e in log if e["method"] == "GET" and "/resolve" in e["url"]],
              "setup-qwen over an install that has them fetches nothing", (r.stdout + r.stderr)[-300:])
        claim = os.path.join(ra, "k3-dspark", ".hub-commit")
        good = open(claim).read()
        with open(claim, "w") as f:
            f.write("Inferact/Kimi-K3-DSpark@" + "1" * 40 + "\n")
        r = deltafin(["setup", "--full"], ra)
        check(r.returncode == 1 and oneline(r.stderr) and "remove it" in r.stderr and "1111111111" in r.stderr,
              "a folder holding another commit is refused, never topped up", r.stderr.strip())
        with open(claim, "w") as f:
            f.write(good)
        r = deltafin(["run", "--prompt", "def f(x):", "--max-new", "8", "--draft", "qwen", "--stats"], ra)
        check(r.returncode == 0 and "draft qwen:" in r.stderr, "run without --model drafts with the installed Qwen drafter",
              r.stderr.strip()[-300:])

    # ---- killed mid-download, then rerun: nothing verified is fetched again ----
    rb = os.path.join(work, "b")
    control("DELETE", "log")
    control("POST", "faults", [{"repo": "moonshotai/Kimi-K3", "path": "model.safetensors", "kind": "throttle", "mbps": 3}])
    p = subprocess.Popen([BIN, "setup", "--full"], env=env(rb), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = []  # the K3 shard's part file, once it holds a few MB
    deadline = time.time() + 60
    while time.time() < deadline:
        parts = glob.glob(os.path.join(rb, "download", "*", "model.safetensors.incomplete"))
        if parts and os.path.getsize(parts[0]) > 3000000:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    control("DELETE", "faults")
    r = deltafin(["setup", "--full"], rb, timeout=300)
    log = control("GET", "log")
    k3gets = {}
    for e in log:
        if e["method"] == "GET" and e["status"] in (200, 206) and "DSpark" not in e["url"] and "/api/models/" not in e["url"]:
            k3gets.setdefault(e["path"], []).append(e)
    ds = [e for e in log if e["method"] == "GET" and e["status"] in (200, 206) and "DSpark" in e["url"]
          and not e["url"].startswith("/api/models/")]
    ms = k3gets.get("model.safetensors", [])
    ok = check(r.returncode == 0 and parts, "setup killed with SIGKILL mid-file, then rerun, completes", r.stderr.strip()[-300:])
    if ok:
        check(len(ds) == 2 and all(len(v) == 1 for k, v in k3gets.items() if k != "model.safetensors"),
              "the rerun fetches no file that was verified before the kill",
              json.dumps({k: len(v) for k, v in k3gets.items()}) + f", dspark {len(ds)}")
        check(len(ms) == 2 and ms[1]["range"] and int(ms[1]["range"].split("=")[1].rstrip("-")) > 3000000,
              "the interrupted file resumes where the kill left it", json.dumps([e["range"] for e in ms]))
        eval_installed(rb, "after a kill and a rerun")

    # ---- the hub gone: what is installed runs, and a rerun offline needs nothing ----
    stop_hub()
    r = deltafin(["setup", "--full"], ra, HF_HUB_OFFLINE="1")
    check(r.returncode == 0 and "already complete" in r.stdout, "HF_HUB_OFFLINE=1 setup --full over a complete install needs no hub",
          (r.stdout + r.stderr)[-300:])
    r = deltafin(["setup", "--full"], os.path.join(work, "c"), HF_HUB_OFFLINE="1")
    check(r.returncode == 1 and oneline(r.stderr) and "HF_HUB_OFFLINE" in r.stderr, "offline with nothing downloaded: one line naming HF_HUB_OFFLINE",
          r.stderr.strip())
    eval_installed(ra, "with the hub stopped")

    # ---- --check finds a flipped byte, offline ----
    pack = glob.glob(os.path.join(ra, "k3", "*.pack"))[0]
    with open(pack, "r+b") as f:
        f.seek(os.path.getsize(pack) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    ds_file = os.path.join(ra, "k3-dspark", "model.safetensors")
    with open(ds_file, "r+b") as f:
        f.seek(1000)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    r = deltafin(["setup", "--check"], ra)
    check(r.returncode == 1 and "FAIL K3 store" in r.stdout and "FAIL Inferact/Kimi-K3-DSpark" in r.stdout,
          "setup --check names a corrupt store blob and a corrupt drafter file", (r.stdout + r.stderr)[-400:])
finally:
    stop_hub()

# ---- setup --stream: config, tokenizer, spine and DSpark now, each expert when first routed ----
start_hub()
try:
    rs = os.path.join(work, "s")
    shard_src = os.path.join(repos["moonshotai/Kimi-K3"], "model.safetensors")
    shard = os.path.join(rs, "k3-stream", "model.safetensors")
    r = deltafin(["setup", "--stream", "--dry-run"], rs)
    check(r.returncode == 0 and "setup --stream: plan" in r.stdout and not os.path.exists(rs),
          "setup --stream --dry-run prints the plan and writes nothing", (r.stdout + r.stderr)[-300:])
    control("DELETE", "log")
    control("POST", "faults", [
        {"repo": "moonshotai/Kimi-K3", "path": "model.safetensors", "kind": "503", "retry_after": 1},
        {"repo": "moonshotai/Kimi-K3", "path": "model.safetensors", "kind": "drop", "after": 4},
    ])
    r = deltafin(["setup", "--stream"], rs)
    log = control("GET", "log")
    control("DELETE", "faults")
    sent = sum(e["bytes_sent"] or 0 for e in log if e["path"] == "model.safetensors" and e["method"] == "GET"
               and e["status"] in (200, 206) and "Kimi-K3/" in e["url"] and "DSpark" not in e["url"])
    ok = check(r.returncode == 0 and json.load(open(os.path.join(rs, "install.json")))["k3"].get("stream"),
               "setup --stream completes through a 503 and a dropped connection", r.stderr.strip()[-300:])
    if ok:
        size = os.path.getsize(shard_src)
        check(os.path.getsize(shard) == size and 0 < sent < size * 0.8,
              f"the shard is fetched in part: its header and spine ({sent} of {size} bytes)")
        eval_installed(rs, "after setup --stream")
        r = deltafin(["run", "--tokens", ",".join(map(str, ids)), "--max-new", "4", "--stats"], rs)
        m = __import__("re").search(r"streamed from the hub: (\d+) of (\d+) experts on the drive, (\d+) of them unverified", r.stderr)
        present, total = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
        check(m and 0 < present < total and int(m.group(3)) == present,
              "--stats counts the experts fetched so far, all unverified until their shard is whole",
              r.stderr.strip()[-300:])
        stop_hub()
        eval_installed(rs, "streamed, with the hub stopped (the experts already fetched)")
        far = [(7 * i * i + 3 * i) % 2000 + 10 for i in range(160)]
        r = deltafin(["eval", "--tokens", ",".join(map(str, far)), "--logits-out", os.path.join(work, "far.f32")], rs,
                     HF_HUB_OFFLINE="1")
        check(r.returncode == 1 and "HF_HUB_OFFLINE" in r.stderr and "not fetched yet" in r.stderr,
              "offline, an expert not fetched yet is a clear error", r.stderr.strip()[-300:])
        start_hub()
        jpath = os.path.join(rs, "k3-stream", "stream.journal")
        jtext = open(jpath).read()
        with open(jpath, "w") as f:  # as a setup killed after the headers leaves it: no spine
            f.write("")
        r = deltafin(["eval", "--tokens", ",".join(map(str, ids)), "--logits-out", os.path.join(work, "ns.f32")], rs)
        check(r.returncode == 1 and "spine is not all fetched" in r.stderr,
              "a streamed install whose spine is not all there does not run (never zeros)", r.stderr.strip()[-300:])
        with open(jpath, "w") as f:
            f.write(jtext + "B 12ab")  # and a torn last line, as a crash leaves it
        eval_installed(rs, "streamed, after a torn journal line")
        lines = open(jpath).read().split("\n")
        check(lines[-1] == "" and all(l.startswith(("B ", "V ", "R ")) and len(l.split(" ")) == (3 if l[0] == "B" else 2)
                                      for l in lines[:-1]), "the torn line is cut before the journal is appended to")
        r = deltafin(["setup", "--stream", "--prefetch-hot", "100000"], rs)
        check(r.returncode == 0 and same_bytes(shard, shard_src),
              "--prefetch-hot fetches the rest: the shard is then the hub's bytes, whole", (r.stdout + r.stderr)[-300:])
        r = deltafin(["run", "--tokens", "5,6,7", "--max-new", "4", "--stats"], rs)
        check(r.returncode == 0 and f"{total} of {total} experts on the drive, 0 of them unverified" in r.stderr
              and "1 of 1 shards verified" in r.stderr, "a whole shard is hashed: no expert of it is unverified",
              r.stderr.strip()[-300:])
        with open(jpath) as f:
            kept = [l for l in f.read().split("\n") if l and not l.startswith("V ")]
        with open(jpath, "w") as f:  # as a run killed while hashing the shard leaves it
            f.write("\n".join(kept) + "\n")
        r = deltafin(["run", "--tokens", "5,6,7", "--max-new", "4", "--stats"], rs)
        check(r.returncode == 0 and "1 of 1 shards verified" in r.stderr,
              "a shard all present but not yet hashed is hashed by the next run that reads it", r.stderr.strip()[-300:])
        r = deltafin(["setup", "--check"], rs)
        check(r.returncode == 0 and "ok   K3 stream" in r.stdout, "setup --check passes on the streamed install",
              (r.stdout + r.stderr)[-300:])
        # a flipped byte inside an expert the oracle prompt routes to (the first expert the journal
        # records: the first eval fetched it): the next read of it fails its fetch's checksum
        with open(shard, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            hdr = json.loads(f.read(n))
        journal = open(os.path.join(rs, "k3-stream", "stream.journal")).read().split("\n")
        name, part_off = [l.split(" ")[2] for l in journal if ".experts." in l][0].rsplit("+", 1)
        at = 8 + n + hdr[name]["data_offsets"][0] + int(part_off) + 3
        with open(shard, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x10]))
        r = deltafin(["eval", "--tokens", ",".join(map(str, ids)), "--logits-out", os.path.join(work, "bad.f32")], rs)
        check(r.returncode == 1 and "failed its checksum" in r.stderr and "when it was fetched" in r.stderr,
              "a flipped byte in a streamed expert fails the checksum of its fetch, and nothing is computed with it",
              r.stderr.strip()[-300:])
        r = deltafin(["setup", "--check"], rs)
        check(r.returncode == 1 and "FAIL K3 stream" in r.stdout, "setup --check finds it",
              (r.stdout + r.stderr)[-300:])
        r2 = deltafin(["doctor", "--model", os.path.join(rs, "k3-stream")], rs)
        check(r2.returncode == 1 and "not those fetched" in r2.stderr, "doctor --model names it too", r2.stderr.strip()[-300:])
finally:
    stop_hub()

# ---- a disk that fills up (a tmpfs with a size limit): a clean error, nothing half-written ----
start_hub()
try:
    script = os.path.join(work, "diskfull.sh")
    with open(script, "w") as f:
        f.write(r'''set -u
mnt=$1; size=$2; mode=$3
mount -t tmpfs -o size=$size tmpfs "$mnt" || exit 99
if [ "$mode" = fill ]; then
  "$BIN" setup --full --model-root "$mnt/r" 2>"$mnt.err" &
  pid=$!
  for i in $(seq 600); do
    ls "$mnt"/r/download/*/model.safetensors.incomplete >/dev/null 2>&1 && break; sleep 0.05
  done
  head -c 200000000 /dev/zero > "$mnt/filler" 2>/dev/null
  wait $pid; rc=$?
else
  "$BIN" setup --full --model-root "$mnt/r" 2>"$mnt.err"; rc=$?
fi
find "$mnt/r" -type f > "$mnt.files" 2>/dev/null
umount "$mnt" 2>/dev/null
exit $rc
''')
    for mode, size, what in (("pre", "8m", "the preflight refuses a disk too small"),
                             ("fill", "60m", "a disk that fills during the download")):
        mnt = os.path.join(work, "tmpfs-" + mode)
        os.makedirs(mnt, exist_ok=True)
        control("DELETE", "faults")
        if mode == "fill":
            control("POST", "faults", [{"repo": "moonshotai/Kimi-K3", "path": "model.safetensors", "kind": "throttle", "mbps": 4}])
        e = env(os.path.join(work, "unused"), BIN=BIN)
        cmd = ["bash", script, mnt, size, mode]
        if os.geteuid() != 0:
            cmd = ["unshare", "-r", "-m"] + cmd
        r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=120)
        if r.returncode == 99:  # neither root nor a user namespace: said, not failed
            print(f"ok   setup: {what}: skipped, no tmpfs can be mounted here (not root, and `unshare -rm` is refused)")
            passed += 1
            continue
        err = open(mnt + ".err").read().strip() if os.path.exists(mnt + ".err") else ""
        files = open(mnt + ".files").read().split() if os.path.exists(mnt + ".files") else []
        bad = [p for p in files if p.endswith(".incomplete") or p.endswith("model.safetensors") and "/download/" in p]
        want = "not enough space" if mode == "pre" else "No space left on device"
        check(r.returncode == 1 and oneline(err) and want in err and not bad and
              not any(p.endswith("install.json") for p in files), f"{what}: one line, no partial file left",
              f"rc {r.returncode}: {err} {bad}")
finally:
    stop_hub()
    shutil.rmtree(work, ignore_errors=True)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
