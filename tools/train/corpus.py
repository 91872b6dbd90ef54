"""Training text from what a Python installation already holds: the standard library and the installed
distributions' Python sources and documentation, each distribution kept only if its declared licence is a
permissive one. Provenance (distribution, version, licence, files, bytes) goes into a manifest.

Dedup: exact, on the text with whitespace runs collapsed. Held-out split: a file goes to validation when the
hash of its (deduplicated) text falls in 1 bucket of 100, so the split does not depend on the machine's paths.
Also builds small instruction/chat pairs from the same files (function docstring -> code, doc heading ->
paragraph) for the optional chat tuning.
"""
import ast
import hashlib
import os
import re
import sys
import sysconfig

PERMISSIVE = ("mit", "bsd", "apache", "psf", "python software foundation", "isc", "unlicense", "zlib", "hpnd",
              "cc0", "public domain", "0bsd", "historical permission", "python-2.0")
COPYLEFT = ("gpl", "mpl", "mozilla", "epl", "cddl", "eupl", "copyleft", "proprietary", "commercial", "other/proprietary")
EXTS = (".py", ".md", ".rst", ".txt")
MAX_FILE = 200_000


def _licence(meta_text):
    lic = []
    for line in meta_text.splitlines():
        if line.startswith("License-Expression:"):
            lic.append(line.split(":", 1)[1].strip())
        elif line.startswith("License:"):
            v = line.split(":", 1)[1].strip()
            if len(v) < 120:
                lic.append(v)
        elif line.startswith("Classifier: License ::"):
            lic.append(line.split("::")[-1].strip())
        elif line == "":
            break
    return "; ".join(x for x in lic if x and x.upper() != "UNKNOWN")


def licence_ok(lic):
    l = lic.lower()
    if not l or any(c in l for c in COPYLEFT):
        # "LGPL" and "GPL" are excluded even when dual-licensed: keep the rule simple and safe
        return False
    return any(p in l for p in PERMISSIVE)


def distributions(site_dirs):
    """[(name, version, licence, [files])] from *.dist-info/RECORD (egg-info SOURCES.txt as a fallback)."""
    out = []
    for sd in site_dirs:
        if not os.path.isdir(sd):
            continue
        for d in sorted(os.listdir(sd)):
            p = os.path.join(sd, d)
            if d.endswith(".dist-info"):
                meta = os.path.join(p, "METADATA")
                rec = os.path.join(p, "RECORD")
                if not (os.path.exists(meta) and os.path.exists(rec)):
                    continue
                mt = open(meta, errors="replace").read()
                name = re.search(r"^Name:\s*(.+)$", mt, re.M)
                ver = re.search(r"^Version:\s*(.+)$", mt, re.M)
                files = []
                for line in open(rec, errors="replace"):
                    f = line.rsplit(",", 2)[0]
                    if f.endswith(EXTS) and not f.startswith(".."):
                        files.append(os.path.normpath(os.path.join(sd, f)))
                out.append((name.group(1).strip() if name else d, ver.group(1).strip() if ver else "?",
                            _licence(mt), files))
    return out


def stdlib_files():
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for dp, dn, fn in os.walk(root):
        dn[:] = sorted(x for x in dn if x not in ("site-packages", "dist-packages", "__pycache__"))
        for f in sorted(fn):
            if f.endswith(EXTS):
                files.append(os.path.join(dp, f))
    return root, files


def looks_like_text(t):
    if len(t) < 200 or len(t) > MAX_FILE:
        return False
    if "\x00" in t:
        return False
    lines = t.split("\n")
    if max(len(x) for x in lines) > 1000 or sum(len(x) > 300 for x in lines) > 5:
        return False
    if re.search(r"\s{2000,}", t):
        return False
    good = sum(c.isalnum() or c.isspace() for c in t[:20000])
    return good / min(len(t), 20000) > 0.6


def norm_key(t):
    return hashlib.sha1(re.sub(r"\s+", " ", t).strip().encode("utf-8", "surrogatepass")).hexdigest()


def build(max_bytes=160_000_000, per_dist=12_000_000, log=print):
    """-> (train_docs, valid_docs, manifest). Docs are (source, text)."""
    ver = "%d.%d" % sys.version_info[:2]
    sites = sorted({p for p in [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]] +
                    [x for x in sys.path if x.endswith(("site-packages", "dist-packages"))]})
    groups = []
    root, sfiles = stdlib_files()
    groups.append(("python-stdlib", ver, "PSF-2.0", sfiles))
    groups += distributions(sites)
    seen, train, valid, manifest = set(), [], [], []
    total = 0
    skipped = []
    for name, version, lic, files in groups:
        if not licence_ok(lic):
            skipped.append({"name": name, "version": version, "licence": lic or "(none declared)"})
            continue
        nb = nf = 0
        for f in sorted(set(files), key=lambda p: hashlib.md5(p.split("-packages/")[-1].encode()).hexdigest()):
            if nb >= per_dist or total >= max_bytes:
                break
            try:
                t = open(f, encoding="utf-8").read()
            except (OSError, UnicodeDecodeError, ValueError):
                continue
            if not looks_like_text(t):
                continue
            key = norm_key(t)
            if key in seen:
                continue
            seen.add(key)
            (valid if int(key[:8], 16) % 100 == 0 else train).append((name, t))
            nb += len(t.encode("utf-8", "surrogatepass"))
            nf += 1
            total += len(t)
        if nf:
            manifest.append({"name": name, "version": version, "licence": lic, "files": nf, "bytes": nb})
    if len(valid) < 20:                       # a tiny corpus (dry runs): still hold something out
        valid, train = valid + train[-20:], train[:-20]
    log("corpus: %d distributions kept, %d skipped (licence), %d train + %d valid files, %.1f MB"
        % (len(manifest), len(skipped), len(train), len(valid), total / 1e6))
    return train, valid, {"kept": manifest, "skipped": skipped, "python": sys.version.split()[0]}


# ---------------------------------------------------------------------------------------------- chat pairs

def _first_sentence(doc):
    doc = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    m = re.match(r"(.+?[.!?])(\s|$)", doc)
    s = m.group(1) if m else doc
    return s if 10 <= len(s) <= 200 else None


def chat_pairs(docs, limit=40000):
    """(user, answer) pairs made from the corpus itself."""
    pairs = []
    for name, t in docs:
        if len(pairs) >= limit:
            break
        if t.startswith(("#", "=")) or "\n===" in t[:400] or "\n---" in t[:400]:
            # markdown / rst: a heading and its first paragraph
            m = re.search(r"^#{1,3} (.+)\n+([^#\n][^\n]+(?:\n[^\n#][^\n]*){0,4})", t, re.M)
            if m and 3 < len(m.group(1)) < 80 and len(m.group(2)) > 60:
                pairs.append(("What is %s?" % m.group(1).strip(), m.group(2).strip()))
            continue
        try:
            tree = ast.parse(t)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        lines = t.split("\n")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            s = _first_sentence(doc) if doc else None
            if not s or not hasattr(node, "end_lineno"):
                continue
            src_lines = lines[node.lineno - 1:node.end_lineno]
            ind = len(src_lines[0]) - len(src_lines[0].lstrip())
            src = "\n".join(x[ind:] for x in src_lines)
            if len(src) > 1500 or len(src) < 80:
                continue
            s2 = s[0].lower() + s[1:]
            if len(pairs) % 2 == 0:
                pairs.append(("Write a Python function `%s` that %s" % (node.name, s2.rstrip(".")) + ".",
                              "```python\n%s\n```" % src))
            else:
                pairs.append(("What does the Python function `%s` do?" % node.name,
                              doc.strip().split("\n\n")[0].strip()))
            if len(pairs) >= limit:
                break
    return pairs
