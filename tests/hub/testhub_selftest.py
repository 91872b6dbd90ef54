#!/usr/bin/env python3
"""Self-test of testhub.py (the local Hugging Face hub stand-in), with raw HTTP requests.

    python3 tests/hub/testhub_selftest.py

Stages a small repo in a temp folder, starts testhub.py on port 0 (with a gated copy of the repo
and one with a fixed commit), and checks its endpoints, headers, Range handling, auth codes, the
CDN redirect and every fault kind (each has its effect `count` times and then stops). Prints
"ok   testhub: ..." / "FAIL testhub: ..." lines and a last "N passed, M failed"; exits 0 only if
all passed. Standard library only; runs in a few seconds.
"""
import hashlib, http.client, json, os, shutil, signal, subprocess, sys, tempfile, time
from urllib.parse import urlsplit

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "hf_selftest"
FIXED = "0123456789abcdef0123456789abcdef01234567"
results = [0, 0]


def check(what, cond, why=""):
    results[0 if cond else 1] += 1
    print("ok   testhub: %s" % what if cond else "FAIL testhub: %s: %s" % (what, why), flush=True)
    return cond


class Answer:
    def __init__(self, resp, body, error=None):
        self.status, self.body, self.error = resp.status, body, error
        self.headers = resp.headers

    def h(self, name):
        return self.headers.get(name)

    def json(self):
        return json.loads(self.body)


def req(port, method, url, headers=None, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, url, body=body, headers=headers or {})
        resp = conn.getresponse()
        try:
            return Answer(resp, resp.read())
        except (http.client.IncompleteRead, ConnectionError) as e:
            return Answer(resp, getattr(e, "partial", b""), e)
    finally:
        conn.close()


def git_oid(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def pointer(data):
    return (b"version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n"
            % (hashlib.sha256(data).hexdigest().encode(), len(data)))


def main():
    tmp = tempfile.mkdtemp(prefix="testhub-selftest-")
    proc = None
    try:
        rnd = hashlib.sha256(b"seed").digest() * (300000 // 32)
        files = {"config.json": b'{"model_type": "qwen3"}\n', "model.safetensors": rnd[:200000],
                 "sub/a file.txt": b"hello, sub folder\n", "sub/big.dat": rnd[:70000],
                 "tokenizer.model": b"tiny lfs by suffix"}
        lfs = {"model.safetensors", "sub/big.dat", "tokenizer.model"}
        repo_dir = os.path.join(tmp, "repo")
        for p, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(repo_dir, p)), exist_ok=True)
            with open(os.path.join(repo_dir, p), "wb") as fh:
                fh.write(data)
        listing = "".join("%s %s\n" % (p, hashlib.sha256(d).hexdigest())
                          for p, d in sorted(files.items()))
        commit = hashlib.sha1(listing.encode()).hexdigest()
        port_file = os.path.join(tmp, "port")
        proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "testhub.py"), "--repo", "o/m=" + repo_dir,
             "--repo", "o/gated=" + repo_dir, "--repo", "o/fixed=%s@%s" % (repo_dir, FIXED),
             "--port", "0", "--port-file", port_file, "--token", TOKEN, "--gated", "o/gated"],
            stderr=subprocess.PIPE, text=True)
        for _ in range(100):
            if os.path.exists(port_file) or proc.poll() is not None:
                break
            time.sleep(0.05)
        if not check("starts and writes its port file", os.path.exists(port_file),
                     "exit %s: %s" % (proc.poll(), proc.stderr.read() if proc.poll() else "")):
            return
        port, cdn_port = [int(x) for x in open(port_file).read().split()]
        line = proc.stderr.readline().strip()
        check("prints its listening line", line == "testhub: listening on http://127.0.0.1:%d "
              "(cdn %d)" % (port, cdn_port), line)
        run_checks(port, cdn_port, files, lfs, commit)
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = "still running"
        check("exits cleanly on SIGTERM", rc == 0, "exit status %s" % rc)
    finally:
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        print("%d passed, %d failed" % tuple(results))


def run_checks(port, cdn_port, files, lfs, commit):
    get = lambda url, headers=None: req(port, "GET", url, headers)
    head = lambda url, headers=None: req(port, "HEAD", url, headers)
    auth = {"Authorization": "Bearer " + TOKEN}
    sha = lambda b: hashlib.sha256(b).hexdigest()
    model = files["model.safetensors"]
    a = get("/_control/health")
    check("health", a.status == 200 and a.body == b"ok", "%s %r" % (a.status, a.body))

    # ---- repo info ----
    a = get("/api/models/o/m/revision/main?blobs=true")
    info = a.json() if a.status == 200 else {}
    sib = {s["rfilename"]: s for s in info.get("siblings", [])}
    check("revision main: id, sha and siblings", info.get("id") == "o/m" and
          info.get("sha") == commit and set(sib) == set(files) and info.get("gated") is False,
          "%s %s" % (a.status, a.body[:300]))
    good = all(s["size"] == len(files[p]) and
               s["blobId"] == git_oid(pointer(files[p]) if p in lfs else files[p]) and
               (s.get("lfs", {}).get("sha256") == sha(files[p])) == (p in lfs)
               for p, s in sib.items())
    check("revision ?blobs=true: size, blobId, lfs.sha256", good, json.dumps(sib)[:300])
    a = get("/api/models/o/m/revision/" + commit)
    check("revision by commit", a.status == 200 and a.json()["sha"] == commit, str(a.status))
    a = get("/api/models/o/fixed/revision/main")
    check("--repo DIR@COMMIT sets the commit", a.status == 200 and a.json()["sha"] == FIXED,
          a.body[:200])
    a = get("/api/models/o/m/revision/v9")
    check("unknown revision: 404 RevisionNotFound",
          a.status == 404 and a.h("X-Error-Code") == "RevisionNotFound", str(a.status))
    a = get("/api/models/o/gated/revision/main")
    check("gated repo info is public, gated auto", a.status == 200 and a.json()["gated"] == "auto",
          "%s %s" % (a.status, a.body[:200]))

    # ---- tree ----
    a = get("/api/models/o/m/tree/main?recursive=true")
    tree = a.json() if a.status == 200 else []
    fent = {e["path"]: e for e in tree if e["type"] == "file"}
    good = set(fent) == set(files) and all(
        e["size"] == len(files[p]) and e["oid"] == git_oid(pointer(files[p]) if p in lfs
                                                           else files[p]) and
        (e.get("lfs") == {"oid": sha(files[p]), "size": len(files[p]),
                          "pointerSize": len(pointer(files[p]))} if p in lfs else "lfs" not in e)
        for p, e in fent.items())
    check("tree recursive: paths, sizes, oids, lfs", good, json.dumps(tree)[:400])
    a = get("/api/models/o/m/tree/main?recursive=false")
    top = {e["path"]: e["type"] for e in a.json()} if a.status == 200 else {}
    check("tree not recursive: sub is a directory", top.get("sub") == "directory" and
          "sub/big.dat" not in top, str(top))
    a = get("/api/models/o/m/tree/main/sub")
    check("tree of a folder", a.status == 200 and sorted(e["path"] for e in a.json()) ==
          ["sub/a file.txt", "sub/big.dat"], a.body[:200])
    paged, url, pages = [], "/api/models/o/m/tree/main?recursive=true&limit=2", 0
    while url and pages < 20:
        a = get(url)
        paged += a.json()
        link = a.h("Link") or ""
        url = urlsplit(link[1:link.index(">")]) if 'rel="next"' in link else None
        url = url and url.path + "?" + url.query
        pages += 1
    check("tree pages (limit=2) via Link rel=next", paged == tree and pages == 3,
          "%d pages, %d entries" % (pages, len(paged)))

    # ---- resolve ----
    base = "/o/m/resolve/main/"
    a = head(base + "model.safetensors")
    loc = a.h("Location") or ""
    check("HEAD LFS: 307 relative resolve-cache, X-Repo-Commit, X-Linked-Etag/Size",
          a.status == 307 and loc.startswith("/api/resolve-cache/models/o/m/%s/" % commit) and
          a.h("X-Repo-Commit") == commit and a.h("X-Linked-Etag") == '"%s"' % sha(model) and
          a.h("X-Linked-Size") == str(len(model)) and a.body == b"",
          "%s %s" % (a.status, dict(a.headers)))
    a = get(base + "model.safetensors")
    check("GET LFS: 307 with a body of its Content-Length", a.status == 307 and
          len(a.body) == int(a.h("Content-Length")) > 0 and a.h("Location") == loc, str(a.status))
    a = get(loc)
    check("resolve-cache serves the bytes", a.status == 200 and a.body == model and
          a.h("Content-Length") == str(len(model)), "%s %d" % (a.status, len(a.body)))
    a = get(base + "sub%2Fbig.dat")
    b = get(a.h("Location") or "/")
    check("LFS by size (>= 64 KiB), %2F in the path", a.status == 307 and
          b.body == files["sub/big.dat"], "%s %s" % (a.status, b.status))
    a = get(base + "config.json")
    check("plain file: 200, ETag = git oid, X-Repo-Commit", a.status == 200 and
          a.body == files["config.json"] and a.h("ETag") == '"%s"' % git_oid(files["config.json"])
          and a.h("X-Repo-Commit") == commit and a.h("Accept-Ranges") == "bytes",
          "%s %s" % (a.status, dict(a.headers)))
    a = head(base + "sub/a%20file.txt")
    check("HEAD plain file with a space: headers, no body", a.status == 200 and a.body == b"" and
          a.h("Content-Length") == str(len(files["sub/a file.txt"])), str(a.status))
    a = get("/o/m/raw/main/model.safetensors")
    check("raw: the LFS pointer", a.status == 200 and a.body == pointer(model), str(a.status))
    a = get(loc, {"Range": "bytes=10-19"})
    check("Range a-b: 206, Content-Range", a.status == 206 and a.body == model[10:20] and
          a.h("Content-Range") == "bytes 10-19/%d" % len(model), "%s %s" % (a.status,
                                                                             a.h("Content-Range")))
    a = get(base + "config.json", {"Range": "bytes=5-"})
    check("Range a-: 206 to the end", a.status == 206 and a.body == files["config.json"][5:],
          str(a.status))
    a = get(loc, {"Range": "bytes=%d-" % len(model)})
    b = head(loc, {"Range": "bytes=%d-" % (len(model) + 5)})
    check("Range past the end: 416, Content-Range */size (GET and HEAD)", a.status == 416 ==
          b.status and a.h("Content-Range") == "bytes */%d" % len(model), str(a.status))
    a, b = get("/o/nope/resolve/main/x"), head("/o/nope/resolve/main/x")
    check("unknown repo: 404 RepoNotFound (GET and HEAD)", a.status == b.status == 404 and
          a.h("X-Error-Code") == b.h("X-Error-Code") == "RepoNotFound", str(a.status))
    a, b = get(base + "nope.bin"), head(base + "nope.bin")
    check("unknown file: 404 EntryNotFound (GET and HEAD)", a.status == b.status == 404 and
          a.h("X-Error-Code") == b.h("X-Error-Code") == "EntryNotFound", str(a.status))
    a = get("/o/m/resolve/v9/config.json")
    check("resolve of an unknown revision: 404 RevisionNotFound", a.status == 404 and
          a.h("X-Error-Code") == "RevisionNotFound", str(a.status))

    # ---- gated ----
    gbase = "/o/gated/resolve/main/"
    a, b = get(gbase + "config.json"), head(gbase + "model.safetensors")
    check("gated, no token: 401 GatedRepo, JSON error (GET and HEAD)", a.status == b.status == 401
          and a.h("X-Error-Code") == b.h("X-Error-Code") == "GatedRepo" and "error" in a.json(),
          "%s %s" % (a.status, b.status))
    a = get(gbase + "config.json", {"Authorization": "Bearer hf_wrong"})
    check("gated, wrong token: 403 GatedRepo", a.status == 403 and
          a.h("X-Error-Code") == "GatedRepo", str(a.status))
    a = get(gbase + "model.safetensors", auth)
    gloc = a.h("Location") or "/"
    b, c = get(gloc, auth), get(gloc)
    check("gated, token: 307, resolve-cache needs the token too", a.status == 307 and
          b.status == 200 and b.body == model and c.status == 401, "%s %s %s" % (
              a.status, b.status, c.status))

    # ---- faults ----
    def fault(*faults):
        a = req(port, "POST", "/_control/faults", {"Content-Type": "application/json"},
                json.dumps(list(faults)))
        assert a.status == 200, a.body

    def twice(what, url, headers, first, then=lambda a: a.status == 200 and a.body == model):
        a, b = get(url, headers), get(url, headers)
        check(what, first(a) and then(b), "first %s %d bytes %s, then %s %d bytes" % (
            a.status, len(a.body), a.error, b.status, len(b.body)))

    fault({"path": "*.safetensors", "kind": "drop", "after": 1000})
    twice("fault drop: headers, 1000 bytes, close; then whole", loc, {},
          lambda a: a.status == 200 and a.body == model[:1000] and a.error is not None)
    fault({"path": "*.safetensors", "kind": "drop", "reset": True})
    twice("fault drop reset: cut short; then whole", loc, {},
          lambda a: len(a.body) < len(model) and a.error is not None)
    fault({"path": "model.*", "kind": "truncate", "after": 500})
    twice("fault truncate: Content-Length 500, 500 bytes; then whole", loc, {},
          lambda a: a.status == 200 and a.body == model[:500] and a.h("Content-Length") == "500")
    fault({"path": "*.safetensors", "kind": "corrupt"})
    twice("fault corrupt: full length, other bytes; then whole", loc, {},
          lambda a: a.status == 200 and len(a.body) == len(model) and a.body != model)
    fault({"path": "*.safetensors", "kind": "range200"})
    twice("fault range200: 200 whole file; then 206", loc, {"Range": "bytes=0-99"},
          lambda a: a.status == 200 and a.body == model,
          lambda b: b.status == 206 and b.body == model[:100])
    fault({"path": "*.safetensors", "kind": "429", "retry_after": 7})
    a, b = head(base + "model.safetensors"), head(base + "model.safetensors")
    check("fault 429 on HEAD: Retry-After, JSON; then 307", a.status == 429 and
          a.h("Retry-After") == "7" and b.status == 307, "%s %s" % (a.status, b.status))
    fault({"path": "config.json", "kind": "503", "count": 2})
    r = [get(base + "config.json") for _ in range(3)]
    check("fault 503 count 2: two 503s with Retry-After 1, then 200",
          [x.status for x in r] == [503, 503, 200] and r[0].h("Retry-After") == "1" and
          "error" in r[0].json(), str([x.status for x in r]))
    fault({"path": "*.safetensors", "kind": "throttle", "mbps": 1})
    t0 = time.monotonic()
    a = get(loc)
    t1 = time.monotonic()
    b = get(loc)
    t2 = time.monotonic()
    check("fault throttle 1 MB/s: 200 KB takes >= 0.15 s; then fast", a.body == model == b.body
          and t1 - t0 >= 0.15 and t2 - t1 < 0.15, "%.3f s, then %.3f s" % (t1 - t0, t2 - t1))
    req(port, "DELETE", "/_control/log")
    fault({"path": "*.safetensors", "repo": "o/gated", "kind": "cdn"})
    a = get(gbase + "model.safetensors", auth)
    cdn = urlsplit(a.h("Location") or "")
    b = req(cdn_port, "GET", cdn.path, auth)
    c = req(cdn_port, "GET", cdn.path, {"Range": "bytes=1-2"})
    d = get(gbase + "model.safetensors", auth)
    check("fault cdn: 302 to http://localhost:CDN/cdn/..., CDN serves (Range too); then 307",
          a.status == 302 and cdn.hostname == "localhost" and cdn.port == cdn_port and
          b.status == 200 and b.body == model and c.status == 206 and c.body == model[1:3] and
          d.status == 307, "%s %s %s %s" % (a.status, a.h("Location"), b.status, d.status))
    log = req(port, "GET", "/_control/log").json()
    cdn_log = [(e["auth"], e["status"], e["bytes_sent"]) for e in log if e["host"] == "cdn"]
    check("log: cdn requests with their auth, status, bytes", cdn_log ==
          [(True, 200, len(model)), (False, 206, 2)], str(cdn_log))
    check("log: main requests with decoded path and fault", [
        (e["host"], e["path"], e["status"], e["fault"]) for e in log if e["host"] == "main"] ==
        [("main", "model.safetensors", 302, "cdn"), ("main", "model.safetensors", 307, None)],
        json.dumps(log)[:400])
    fault({"path": "*", "kind": "corrupt", "count": 5})
    req(port, "DELETE", "/_control/faults")
    a = get(loc)
    check("DELETE /_control/faults clears them", a.body == model, "%d bytes" % len(a.body))
    a = req(port, "POST", "/_control/faults", body=json.dumps([{"kind": "nope"}]))
    check("bad fault kind: 400", a.status == 400, str(a.status))
    a = req(port, "DELETE", "/_control/log")
    check("DELETE /_control/log clears it", req(port, "GET", "/_control/log").json() == [],
          str(a.status))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    bodies = []
    for p in ("config.json", "sub/a%20file.txt", "config.json"):
        conn.request("GET", base + p)
        bodies.append(conn.getresponse().read())
    conn.close()
    check("keep-alive: three answers on one connection",
          bodies == [files["config.json"], files["sub/a file.txt"], files["config.json"]],
          str(bodies))


if __name__ == "__main__":
    main()
    sys.exit(0 if results[1] == 0 and results[0] > 0 else 1)
