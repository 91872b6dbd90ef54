#!/usr/bin/env python3
"""testhub: a local stand-in for the Hugging Face hub (huggingface.co), for tests and benchmarks.

    python3 tests/hub/testhub.py --repo OWNER/NAME=DIR[@COMMIT40HEX] [--repo ...] [--port 0]
            [--port-file FILE] [--token TOKEN] [--gated OWNER/NAME ...] [--throttle MBPS]
            [--log FILE] [--page-size N]

Python 3 standard library only. It serves each DIR (every regular file below it, recursively, a
`.git` folder excepted) as one model repo at one commit, with the endpoints and headers that
hub clients (huggingface_hub, @huggingface/hub, `deltafin setup`) use:

  GET  /api/models/{repo}[/revision/{rev}][?blobs=true]   repo info: sha, gated, siblings
  GET  /api/models/{repo}/tree/{rev}[/{dir}]?recursive=&expand=&cursor=&limit=
                                   pages of entries; `Link: <...>; rel="next"` when more remain
  HEAD/GET /{repo}/resolve/{rev}/{path}   plain file: 200/206 with the bytes; LFS file: 307 to
                                   the relative /api/resolve-cache/models/{repo}/{commit}/{path}
  HEAD/GET /{repo}/raw/{rev}/{path}       the git file (an LFS file's pointer)
  HEAD/GET /api/resolve-cache/models/{repo}/{commit}/{path}   the bytes (Range: 206/416)
  on the second ("cdn") listener: HEAD/GET /cdn/{repo}/{commit}/{path}   the bytes, no auth check

Invariants: one commit per repo (COMMIT, else the sha1 of the sorted "path sha256" lines);
revisions `main`, `HEAD` and the commit resolve to it, any other is 404 RevisionNotFound. A file
is LFS when its name ends in .safetensors/.bin/.pack/.model or it is >= 64 KiB. Its git oid is the
git blob sha1 of its content, or of its LFS pointer for LFS files (as in the real hub's tree);
its LFS oid is the sha256 of its content; directories carry real git tree oids. Hashes are
computed once at start. Every answer has a Content-Length (HTTP/1.1 keep-alive), and HEAD
answers carry the same headers as GET without the body. Gated repos (--gated, needs --token):
their info and tree are public, as on the real hub, but every request for file bytes needs
`Authorization: Bearer TOKEN`: none is 401, another token 403, both `X-Error-Code: GatedRepo`.
Unknown repo: 404 RepoNotFound; unknown file: 404 EntryNotFound; errors have a JSON body
{"error": ...} and an X-Error-Message header.

Faults (control API on the main listener; /_control requests are not logged):
  POST   /_control/faults  [{"path": GLOB, "kind": K, "count": N, ...}, ...]  appends faults
  GET    /_control/faults  the active ones;  DELETE /_control/faults  clears them
  GET    /_control/log     every request, entered as it arrives and filled in as it is
                           answered: method, path (the decoded file path for file requests),
                           url, range, auth, host ("main"|"cdn"), status, bytes_sent, fault
                           (--log FILE: the same, a JSON line each, once answered)
  DELETE /_control/log;    GET /_control/health -> "ok"
A request takes the first active fault whose GLOB (fnmatch, `*` crosses `/`; optional "repo"
field) matches its file and whose kind applies to it, and uses up one of its `count` (default 1):
  429, 503 (retry_after, default 1): any request that touches the file, HEAD included: answers
           that status with Retry-After and a JSON error.
  cdn:     an LFS file's resolve HEAD/GET: 302 to http://localhost:CDNPORT/cdn/... instead.
  etag:    an LFS file's resolve HEAD/GET: X-Linked-Etag names another sha256 (a moved revision).
  drop (after, default half the body; reset: true for an RST instead of a FIN), truncate
  (after, default half: Content-Length and body cut to that), corrupt (offsets: body offsets
  XORed with 0xFF, default three), range200 (Range ignored: 200, whole file), throttle (mbps,
  default 1):
           only GETs that send file bytes (resolve of a plain file, resolve-cache, cdn).
Rates (--throttle, throttle faults) are in MB/s (10^6 bytes/s), sent in chunks of <= 64 KiB.
"""
import argparse, base64, fnmatch, hashlib, http.server, io, json, os, re, signal, socket
import struct, sys, threading, time
from urllib.parse import parse_qs, quote, unquote, urlencode

LFS_SUFFIXES = (".safetensors", ".bin", ".pack", ".model")
LFS_MIN_SIZE = 64 * 1024
CHUNK = 64 * 1024
DATE = "2024-01-01T00:00:00.000Z"
ERROR_KINDS = {"429", "503"}
BODY_KINDS = {"drop", "truncate", "corrupt", "range200", "throttle"}
KINDS = ERROR_KINDS | BODY_KINDS | {"cdn", "etag"}
NET_ERRORS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, socket.timeout)


def git_oid(kind, data):
    return hashlib.sha1(b"%s %d\0" % (kind.encode(), len(data)) + data).hexdigest()


class File:
    def __init__(self, path, abspath):
        self.path, self.abspath = path, abspath
        self.size = os.path.getsize(abspath)
        blob, sha = hashlib.sha1(b"blob %d\0" % self.size), hashlib.sha256()
        with open(abspath, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                blob.update(chunk)
                sha.update(chunk)
        self.blob_oid, self.sha256 = blob.hexdigest(), sha.hexdigest()
        self.lfs = path.endswith(LFS_SUFFIXES) or self.size >= LFS_MIN_SIZE
        self.pointer = (b"version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n"
                        % (self.sha256.encode(), self.size))
        self.oid = git_oid("blob", self.pointer) if self.lfs else self.blob_oid


class Repo:
    def __init__(self, name, root, commit, gated):
        self.name, self.gated, self.files = name, gated, {}
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != ".git")
            for fn in sorted(filenames):
                full = os.path.join(dirpath, fn)
                if os.path.isfile(full):
                    rel = os.path.relpath(full, root).replace(os.sep, "/")
                    self.files[rel] = File(rel, full)
        listing = "".join("%s %s\n" % (p, f.sha256) for p, f in sorted(self.files.items()))
        self.commit = commit or hashlib.sha1(listing.encode()).hexdigest()
        self.children = {"": set()}  # directory -> names of its files and directories
        for p in self.files:
            parts = p.split("/")
            for i in range(len(parts)):
                parent = "/".join(parts[:i])
                self.children.setdefault(parent, set()).add(parts[i])
        self.tree_oid = {}
        self._tree("")

    def _tree(self, d):  # the git tree object of directory d, as git would hash it
        entries = []
        for name in self.children[d]:
            p = d + "/" + name if d else name
            if p in self.files:
                entries.append((name, b"100644", self.files[p].oid))
            else:
                entries.append((name + "/", b"40000", self._tree(p)))
        data = b"".join(b"%s %s\0" % (mode, key.rstrip("/").encode()) + bytes.fromhex(oid)
                        for key, mode, oid in sorted(entries, key=lambda e: e[0].encode()))
        self.tree_oid[d] = git_oid("tree", data)
        return self.tree_oid[d]

    def walk(self, d, recursive):  # entry paths under d, depth first, in name order
        for name in sorted(self.children[d]):
            p = d + "/" + name if d else name
            yield p
            if recursive and p not in self.files:
                yield from self.walk(p, True)

    def entry(self, p, expand):
        f = self.files.get(p)
        if f:
            e = {"type": "file", "oid": f.oid, "size": f.size, "path": p}
            if f.lfs:
                e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": len(f.pointer)}
        else:
            e = {"type": "directory", "oid": self.tree_oid[p], "size": 0, "path": p}
        if expand:
            e["lastCommit"] = {"id": self.commit, "title": "testhub snapshot", "date": DATE}
        return e


class Hub:
    def __init__(self, repos, token, throttle, page_size, log_path):
        self.repos, self.token, self.throttle, self.page_size = repos, token, throttle, page_size
        self.lock = threading.Lock()
        self.faults, self.log = [], []
        self.log_file = open(log_path, "a", buffering=1) if log_path else None
        self.cdn_port = 0

    def take_fault(self, repo, path, kinds):
        with self.lock:
            for f in self.faults:
                if (f["kind"] in kinds and f["remaining"] > 0
                        and fnmatch.fnmatchcase(path, f.get("path", "*"))
                        and fnmatch.fnmatchcase(repo.name, f.get("repo", "*"))):
                    f["remaining"] -= 1
                    if f["remaining"] == 0:
                        self.faults.remove(f)
                    return f
        return None

    def record(self, rec):
        with self.lock:
            self.log.append(rec)


def parse_range(header, size):
    """(start, end) inclusive, None to ignore the header (absent or unsupported), or "416"."""
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header or "")
    if not m or m[1] == m[2] == "":
        return None
    if m[1] == "":  # suffix: the last N bytes
        n = int(m[2])
        return (max(0, size - n), size - 1) if n > 0 and size > 0 else "416"
    start = int(m[1])
    end = int(m[2]) if m[2] else size - 1
    if m[2] and end < start:
        return None
    return "416" if start >= size else (start, min(end, size - 1))


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # headers and body go out in separate writes: without this, Nagle holds the body until the
        # client's delayed ACK (40 ms per answer on a kept-alive connection)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    server_version = "testhub/1"
    timeout = 120
    listener = "main"
    hub = None  # the Hub, set in main()

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.dispatch()

    do_HEAD = do_POST = do_DELETE = do_PUT = do_GET

    def dispatch(self):
        raw, _, self.query = self.path.partition("?")
        self.segs = raw.split("/")[1:]
        self.dec = [unquote(s) for s in self.segs]
        self.rec = {"method": self.command, "path": unquote(raw), "url": self.path,
                    "range": self.headers.get("Range"), "auth": "Authorization" in self.headers,
                    "host": self.listener, "status": None, "bytes_sent": 0, "fault": None}
        control = self.listener == "main" and self.dec[0] == "_control"
        if not control:  # logged at once, and filled in as it goes: no race with a fast client
            self.hub.record(self.rec)
        try:
            if control:
                self.control()
            elif self.command not in ("GET", "HEAD"):
                self.close_connection = True  # its body, if any, is left unread
                self.error(405, None, "method not allowed")
            elif self.listener == "cdn":
                self.route_cdn()
            else:
                self.route_main()
        except NET_ERRORS:
            self.close_connection = True
        finally:
            if not control and self.hub.log_file:
                with self.hub.lock:
                    self.hub.log_file.write(json.dumps(self.rec) + "\n")

    # ---- answers ----

    def send(self, status, headers=(), body=b"", length=None):
        self.rec["status"] = status
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.write(body)

    def write(self, data):  # counted first, so that the log is right once the client has it
        self.rec["bytes_sent"] += len(data)
        try:
            self.wfile.write(data)
        except OSError:
            self.rec["bytes_sent"] -= len(data)
            raise

    def error(self, status, code, message, headers=()):
        hdrs = [("Content-Type", "application/json; charset=utf-8"), ("X-Error-Message", message)]
        if code:
            hdrs.append(("X-Error-Code", code))
        self.send(status, hdrs + list(headers), json.dumps({"error": message}).encode())

    def send_json(self, obj, headers=()):
        self.send(200, [("Content-Type", "application/json; charset=utf-8")] + list(headers),
                  json.dumps(obj).encode())

    def fault_status(self, fault):
        self.rec["fault"] = fault["kind"]
        wait = str(fault.get("retry_after", 1))
        msg = "testhub fault: too many requests" if fault["kind"] == "429" else \
            "testhub fault: service unavailable"
        self.error(int(fault["kind"]), None, msg, [("Retry-After", wait)])

    # ---- routing ----

    def find_repo(self, start):
        """The repo named by dec[start:start+2], or None after a 404 answer."""
        name = "/".join(self.dec[start:start + 2])
        repo = self.hub.repos.get(name) if len(self.dec) >= start + 2 else None
        if repo is None:
            self.error(404, "RepoNotFound", "Repository not found: %s" % name)
        return repo

    def check_revision(self, repo, rev):
        if rev in ("main", "HEAD", repo.commit):
            return True
        self.error(404, "RevisionNotFound", "Invalid rev id: %s" % rev)
        return False

    def check_gate(self, repo):
        if not repo.gated:
            return True
        auth = self.headers.get("Authorization")
        if auth is None:
            self.error(401, "GatedRepo", "Access to model %s is restricted. You must have access "
                       "to it and be authenticated to access it. Please log in." % repo.name)
        elif auth != "Bearer " + self.hub.token:
            self.error(403, "GatedRepo", "Access to model %s is restricted and you are not in the "
                       "authorized list." % repo.name)
        else:
            return True
        return False

    def find_file(self, repo, start):
        path = unquote("/".join(self.segs[start:]))
        f = repo.files.get(path)
        self.rec["path"] = path
        if f is None:
            self.error(404, "EntryNotFound", "Entry not found: %s" % path)
        return f

    def route_main(self):
        d = self.dec
        if d[:2] == ["api", "models"] and (len(d) == 4 or len(d) >= 6 and d[4] == "revision"):
            repo = self.find_repo(2)
            if repo and self.check_revision(repo, "/".join(d[5:]) or "main"):
                self.repo_info(repo)
        elif d[:2] == ["api", "models"] and len(d) >= 6 and d[4] == "tree":
            repo = self.find_repo(2)
            if repo and self.check_revision(repo, d[5]):
                self.tree(repo, unquote("/".join(self.segs[6:])).strip("/"))
        elif d[:3] == ["api", "resolve-cache", "models"] and len(d) >= 7:
            repo = self.find_repo(3)
            if repo and self.check_gate(repo):
                if d[5] != repo.commit:
                    self.error(404, "RevisionNotFound", "Invalid rev id: %s" % d[5])
                else:
                    f = self.find_file(repo, 6)
                    if f:
                        self.serve(repo, f, [("ETag", '"%s"' % f.sha256)])
        elif len(d) >= 5 and d[2] in ("resolve", "raw"):
            repo = self.find_repo(0)
            if repo and self.check_gate(repo) and self.check_revision(repo, d[3]):
                f = self.find_file(repo, 4)
                if f:
                    self.resolve(repo, f, raw=d[2] == "raw")
        else:
            self.error(404, None, "Not found: %s" % self.rec["path"])

    def route_cdn(self):
        d = self.dec
        if d[0] != "cdn" or len(d) < 5:
            return self.error(404, None, "Not found: %s" % self.rec["path"])
        repo = self.find_repo(1)
        if repo and d[3] != repo.commit:
            self.error(404, "RevisionNotFound", "Invalid rev id: %s" % d[3])
        elif repo:
            f = self.find_file(repo, 4)
            if f:
                self.serve(repo, f, [("ETag", '"%s"' % f.sha256)])

    # ---- the endpoints ----

    def repo_info(self, repo):
        blobs = parse_qs(self.query).get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for p, f in sorted(repo.files.items()):
            s = {"rfilename": p}
            if blobs:
                s.update(size=f.size, blobId=f.oid)
                if f.lfs:
                    s["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": len(f.pointer)}
            siblings.append(s)
        info = {"_id": hashlib.sha1(repo.name.encode()).hexdigest()[:24], "id": repo.name,
                "modelId": repo.name, "author": repo.name.split("/")[0], "sha": repo.commit,
                "lastModified": DATE, "createdAt": DATE, "private": False, "disabled": False,
                "gated": "auto" if repo.gated else False, "downloads": 0, "likes": 0,
                "tags": [], "siblings": siblings}
        if blobs:
            info["usedStorage"] = sum(f.size for f in repo.files.values())
        self.send_json(info)

    def tree(self, repo, path):
        if path not in repo.children:
            return self.error(404, "EntryNotFound", "Entry not found: %s" % path)
        q = parse_qs(self.query)
        flag = lambda k: q.get(k, ["false"])[0].lower() in ("1", "true")
        try:
            limit = max(1, int(q.get("limit", [self.hub.page_size])[0]))
            offset = int(base64.urlsafe_b64decode(q["cursor"][0]).decode()) if "cursor" in q else 0
        except ValueError:
            return self.error(400, None, "bad limit or cursor")
        paths = list(repo.walk(path, flag("recursive")))
        page = [repo.entry(p, flag("expand")) for p in paths[offset:offset + limit]]
        headers = []
        if offset + limit < len(paths):
            q["cursor"] = [base64.urlsafe_b64encode(str(offset + limit).encode()).decode()]
            nxt = "http://%s%s?%s" % (self.headers.get("Host", "127.0.0.1"),
                                      self.path.partition("?")[0], urlencode(q, doseq=True))
            headers.append(("Link", '<%s>; rel="next"' % nxt))
        self.send_json(page, headers)

    def resolve(self, repo, f, raw):
        common = [("X-Repo-Commit", repo.commit), ("Accept-Ranges", "bytes")]
        if f.lfs and not raw:
            fault = self.hub.take_fault(repo, f.path, ERROR_KINDS | {"cdn", "etag"})
            if fault and fault["kind"] not in ("cdn", "etag"):
                return self.fault_status(fault)
            etag = f.sha256
            if fault and fault["kind"] == "etag":  # another file's sha256, as a moved revision would say
                self.rec["fault"] = "etag"
                etag, fault = "0" * 64, None
            rest = "%s/%s/%s" % (quote(repo.name), repo.commit, quote(f.path))
            if fault:
                self.rec["fault"] = "cdn"
                status, loc = 302, "http://localhost:%d/cdn/%s" % (self.hub.cdn_port, rest)
            else:
                status, loc = 307, "/api/resolve-cache/models/%s?etag=%%22%s%%22" % (rest, f.sha256)
            body = ("%s. Redirecting to %s" % ("Found" if status == 302 else
                                               "Temporary Redirect", loc)).encode()
            return self.send(status, common + [
                ("Location", loc), ("X-Linked-Etag", '"%s"' % etag),
                ("X-Linked-Size", str(f.size)), ("ETag", '"%s"' % f.oid),
                ("Content-Type", "text/plain; charset=utf-8")], body)
        if f.lfs:  # raw: the pointer file
            return self.serve(repo, f, common + [("ETag", '"%s"' % f.oid)], data=f.pointer)
        self.serve(repo, f, common + [("ETag", '"%s"' % f.oid)], text=True)

    def serve(self, repo, f, headers, data=None, text=False):
        """Answers a file's bytes (or data, for a pointer file), with Range and the faults."""
        kinds = ERROR_KINDS | (BODY_KINDS if self.command == "GET" else set())
        fault = self.hub.take_fault(repo, f.path, kinds)
        kind = fault["kind"] if fault else None
        if kind in ERROR_KINDS:
            return self.fault_status(fault)
        self.rec["fault"] = kind
        size = f.size if data is None else len(data)
        ctype = "text/plain; charset=utf-8" if text or data is not None else \
            "application/octet-stream"
        headers = list(headers) + [("Content-Type", ctype)]
        rng = None if kind == "range200" else parse_range(self.headers.get("Range"), size)
        if rng == "416":
            return self.send(416, headers + [("Content-Range", "bytes */%d" % size)])
        start, end = rng or (0, size - 1)
        length = end - start + 1
        if rng:
            headers.append(("Content-Range", "bytes %d-%d/%d" % (start, end, size)))
        count = length
        if kind in ("truncate", "drop"):
            count = max(0, min(length, int(fault.get("after", length // 2))))
        self.send(206 if rng else 200, headers, length=count if kind == "truncate" else length)
        if self.command == "HEAD":
            return
        mbps = fault.get("mbps", 1) if kind == "throttle" else self.hub.throttle
        flips = set()
        if kind == "corrupt":
            flips = set(fault.get("offsets") or {length // 7, length // 2, length - 1})
        src = io.BytesIO(data) if data is not None else open(f.abspath, "rb")
        with src:
            src.seek(start)
            self.send_body(src, count, mbps * 1e6 if mbps else 0, flips)
        if kind == "drop":
            if fault.get("reset"):
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
            else:
                self.connection.shutdown(socket.SHUT_RDWR)
            self.connection.close()
            self.close_connection = True

    def send_body(self, src, count, rate, flips):
        t0, pos = time.monotonic(), 0
        while pos < count:
            chunk = src.read(min(CHUNK if rate else 1 << 20, count - pos))
            if not chunk:
                raise BrokenPipeError("the file shrank")  # close rather than hang the client
            if flips:
                chunk = bytearray(chunk)
                for off in flips:
                    if pos <= off < pos + len(chunk):
                        chunk[off - pos] ^= 0xFF
            self.write(chunk)
            pos += len(chunk)
            if rate and pos < count:
                ahead = t0 + pos / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)

    # ---- control ----

    def control(self):
        what, hub = "/".join(self.dec[1:]), self.hub
        if what == "health" and self.command in ("GET", "HEAD"):
            self.send(200, [("Content-Type", "text/plain")], b"ok")
        elif what == "faults" and self.command == "POST":
            try:
                n = int(self.headers.get("Content-Length") or 0)
                new = json.loads(self.rfile.read(n) or b"[]")
                new = [new] if isinstance(new, dict) else new
                for f in new:
                    f["kind"] = str(f.get("kind"))
                    if f["kind"] not in KINDS or not isinstance(f.get("path", "*"), str):
                        raise ValueError("bad fault %r (kinds: %s)" % (f, ", ".join(sorted(KINDS))))
                    f["remaining"] = int(f.get("count", 1))
            except (ValueError, TypeError, AttributeError) as e:
                return self.error(400, None, str(e))
            with hub.lock:
                hub.faults.extend(f for f in new if f["remaining"] > 0)
                active = list(hub.faults)
            self.send_json(active)
        elif what == "faults" and self.command in ("GET", "DELETE"):
            with hub.lock:
                if self.command == "DELETE":
                    hub.faults.clear()
                active = list(hub.faults)
            self.send_json(active)
        elif what == "log" and self.command in ("GET", "DELETE"):
            with hub.lock:
                if self.command == "DELETE":
                    hub.log.clear()
                log = list(hub.log)
            self.send_json(log)
        else:
            self.error(404, None, "unknown control request %s %s" % (self.command, self.path))


class CdnHandler(Handler):
    listener = "cdn"


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], OSError):  # a client that went away
            super().handle_error(request, client_address)


def main():
    ap = argparse.ArgumentParser(description="A local stand-in for the Hugging Face hub.")
    ap.add_argument("--repo", action="append", required=True, metavar="OWNER/NAME=DIR[@COMMIT]")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--token")
    ap.add_argument("--gated", nargs="*", action="extend", default=[], metavar="OWNER/NAME")
    ap.add_argument("--throttle", type=float, default=0, metavar="MBPS")
    ap.add_argument("--log", metavar="FILE", help="also append each request as a JSON line here")
    ap.add_argument("--page-size", type=int, default=1000, help="tree entries per page")
    args = ap.parse_args()
    if args.gated and not args.token:
        ap.error("--gated needs --token")
    specs = {}
    for spec in args.repo:
        name, eq, rest = spec.partition("=")
        commit = None
        m = re.fullmatch(r"(.*)@([0-9a-f]{40})", rest)
        if m:
            rest, commit = m[1], m[2]
        if not eq or name.count("/") != 1 or not all(name.split("/")) or not os.path.isdir(rest):
            ap.error("bad --repo %r: want OWNER/NAME=DIR[@COMMIT40HEX] with DIR a folder" % spec)
        specs[name] = (rest, commit)
    for g in args.gated:
        if g not in specs:
            ap.error("--gated %s is not one of the --repo names" % g)
    repos = {n: Repo(n, d, c, n in args.gated) for n, (d, c) in specs.items()}
    hub = Hub(repos, args.token, args.throttle, max(1, args.page_size), args.log)
    Handler.hub = hub
    main_srv = Server(("127.0.0.1", args.port), Handler)
    cdn_srv = Server(("127.0.0.1", 0), CdnHandler)
    hub.cdn_port = cdn_srv.server_address[1]
    port = main_srv.server_address[1]
    threading.Thread(target=cdn_srv.serve_forever, daemon=True).start()
    if args.port_file:
        tmp = "%s.tmp%d" % (args.port_file, os.getpid())
        with open(tmp, "w") as fh:
            fh.write("%d\n%d\n" % (port, hub.cdn_port))
        os.replace(tmp, args.port_file)
    print("testhub: listening on http://127.0.0.1:%d (cdn %d)" % (port, hub.cdn_port),
          file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        main_srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        main_srv.server_close()
        cdn_srv.server_close()


if __name__ == "__main__":
    main()
