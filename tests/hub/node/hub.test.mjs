// The official Hugging Face hub client (npm "@huggingface/hub") against tests/hub/testhub.py,
// the local stand-in for the hub: if the real client accepts what testhub serves, testhub is a
// faithful enough hub to test `deltafin setup` against.
//
//   node hub.test.mjs HUB_URL REPO DIR GATED_REPO TOKEN
//
// HUB_URL is testhub's main listener (http://127.0.0.1:PORT); REPO a repo it serves from DIR;
// GATED_REPO a repo it serves from the same DIR, gated with TOKEN (testhub --token TOKEN --gated
// GATED_REPO; the client wants tokens that start with "hf_"). It lists REPO with listFiles and
// downloads each of its files with downloadFile, comparing paths, sizes, oids and sha256 with
// DIR, and reads testhub's request log (/_control/log) to see which way each file came. One line
// per check, "ok   hub npm: WHAT" or "FAIL hub npm: WHAT: WHY", then "N passed, M failed"; the
// exit status is 0 only when nothing failed. Besides the client it uses node's built-ins only.

import { createHash } from "node:crypto";
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { downloadFile, listFiles, modelInfo } from "@huggingface/hub";

const [HUB_URL, REPO, DIR, GATED, TOKEN] = process.argv.slice(2);
if (!TOKEN) {
  console.error("usage: node hub.test.mjs HUB_URL REPO DIR GATED_REPO TOKEN");
  process.exit(2);
}
const hubUrl = HUB_URL.replace(/\/+$/, "");

let passed = 0, failed = 0;

async function check(name, fn) {
  try {
    const note = await fn();
    passed++;
    console.log(note ? `ok   hub npm: ${name} (${note})` : `ok   hub npm: ${name}`);
  } catch (e) {
    failed++;
    const why = (e && e.message) || String(e);
    console.log(`FAIL hub npm: ${name}: ${why.replace(/\s+/g, " ").trim()}`);
  }
}

function assert(cond, why) {
  if (!cond) throw new Error(why);
}

const show = (v) => JSON.stringify(v);
const sha256 = (buf) => createHash("sha256").update(buf).digest("hex");
const gitOid = (buf) => createHash("sha1").update(`blob ${buf.length}\0`).update(buf).digest("hex");

// The files of DIR, as the hub should list them: path -> {size, sha256, oid}
function walk(dir, prefix = "", out = new Map()) {
  for (const name of readdirSync(dir).sort()) {
    const full = join(dir, name), rel = prefix + name;
    if (statSync(full).isDirectory()) {
      if (name !== ".git") walk(full, rel + "/", out);
    } else {
      const data = readFileSync(full);
      out.set(rel, { size: data.length, sha256: sha256(data), oid: gitOid(data) });
    }
  }
  return out;
}
const source = walk(DIR);
const isLfs = (p) => /\.(safetensors|bin|pack|model)$/.test(p) || source.get(p).size >= 64 * 1024;

async function control(method, what) {
  const res = await fetch(`${hubUrl}/_control/${what}`, { method });
  assert(res.ok, `${method} /_control/${what}: ${res.status}`);
  return res.json();
}

async function download(repo, path, creds = {}) {
  const blob = await downloadFile({ repo, path, hubUrl, ...creds });
  assert(blob, `downloadFile returned ${blob}`);
  return Buffer.from(await blob.arrayBuffer());
}

function sameBytes(buf, path) {
  const want = source.get(path);
  assert(buf.length === want.size, `${buf.length} bytes, want ${want.size}`);
  assert(sha256(buf) === want.sha256, `sha256 ${sha256(buf)}, want ${want.sha256}`);
}

// ---- listing ----
let listed = [];
await check(`listFiles ${REPO} recursive: the paths and sizes of the files in DIR`, async () => {
  await control("DELETE", "log");
  for await (const e of listFiles({ repo: REPO, hubUrl, recursive: true })) listed.push(e);
  const files = listed.filter((e) => e.type === "file");
  const got = files.map((e) => `${e.path}:${e.size}`).sort();
  const want = [...source].map(([p, s]) => `${p}:${s.size}`).sort();
  assert(show(got) === show(want), `listed ${show(got)}, want ${show(want)}`);
  const dirs = listed.filter((e) => e.type === "directory").map((e) => e.path);
  const pages = (await control("GET", "log")).filter((r) => r.path.includes("/tree/")).length;
  return `${files.length} files, directories ${show(dirs)}, ${pages} page(s)`;
});
await check("listFiles: oids (git blob sha1 / LFS pointer) and lfs.oid = sha256", async () => {
  for (const e of listed.filter((e) => e.type === "file")) {
    const want = source.get(e.path);
    assert(want, `unexpected ${e.path}`);
    assert(Boolean(e.lfs) === isLfs(e.path), `${e.path}: lfs ${show(e.lfs)}`);
    if (e.lfs) {
      assert(e.lfs.oid === want.sha256 && e.lfs.size === want.size,
        `${e.path}: lfs ${show(e.lfs)}, want oid ${want.sha256} size ${want.size}`);
      // the git file behind an LFS file is its pointer: the entry's oid and pointerSize are its
      const ptr = Buffer.from(`version https://git-lfs.github.com/spec/v1\noid sha256:${want.sha256}\nsize ${want.size}\n`);
      assert(e.lfs.pointerSize === ptr.length, `${e.path}: pointerSize ${e.lfs.pointerSize}, want ${ptr.length}`);
      assert(e.oid === gitOid(ptr), `${e.path}: oid ${e.oid}, want the pointer's ${gitOid(ptr)}`);
    } else {
      assert(e.oid === want.oid, `${e.path}: oid ${e.oid}, want ${want.oid}`);
    }
  }
});
await check("listFiles of a folder, not recursive", async () => {
  const sub = [...source.keys()].find((p) => p.includes("/"));
  assert(sub, "DIR has no subfolder");
  const folder = sub.slice(0, sub.lastIndexOf("/"));
  const got = [];
  for await (const e of listFiles({ repo: REPO, hubUrl, path: folder })) got.push(e.path);
  const want = [...source.keys()].filter((p) => p.startsWith(folder + "/") && !p.slice(folder.length + 1).includes("/"));
  assert(show(got.sort()) === show(want.sort()), `${show(got)}, want ${show(want)}`);
  return folder;
});
await check("modelInfo: name and gated", async () => {
  const a = await modelInfo({ name: REPO, hubUrl }), b = await modelInfo({ name: GATED, hubUrl });
  assert(a.name === REPO && a.gated === false && b.gated === "auto", `${show(a)} / ${show(b)}`);
});

// ---- every file ----
for (const path of source.keys()) {
  await check(`downloadFile ${path}`, async () => {
    sameBytes(await download(REPO, path), path);
    return `${source.get(path).size} bytes, ${isLfs(path) ? "LFS" : "plain"}`;
  });
}

const lfsFile = [...source.keys()].find((p) => p.endsWith(".safetensors"));
const plainFile = [...source.keys()].find((p) => !isLfs(p));
await check(`LFS file ${lfsFile}: through the 307 relative redirect to resolve-cache`, async () => {
  await control("DELETE", "log");
  sameBytes(await download(REPO, lfsFile), lfsFile);
  const log = (await control("GET", "log")).map((r) => `${r.method} ${r.url.split("?")[0]} ${r.status}`);
  assert(log.some((l) => l.startsWith(`GET /${REPO}/resolve/main/`) && l.endsWith(" 307")), show(log));
  assert(log.some((l) => l.startsWith("GET /api/resolve-cache/") && l.endsWith(" 200")), show(log));
  return `${log.length} requests`;
});
await check(`LFS file ${lfsFile}: the resolve answer's headers`, async () => {
  const res = await fetch(`${hubUrl}/${REPO}/resolve/main/${lfsFile}`, { method: "HEAD", redirect: "manual" });
  const want = source.get(lfsFile), h = (k) => res.headers.get(k);
  assert(res.status === 307 && h("location").startsWith("/api/resolve-cache/"), `${res.status} ${h("location")}`);
  assert(h("x-linked-size") === String(want.size), `X-Linked-Size ${h("x-linked-size")}, want ${want.size}`);
  assert(h("x-linked-etag") === `"${want.sha256}"`, `X-Linked-Etag ${h("x-linked-etag")}, want "${want.sha256}"`);
  assert(/^[0-9a-f]{40}$/.test(h("x-repo-commit") || ""), `X-Repo-Commit ${h("x-repo-commit")}`);
});
await check(`plain file ${plainFile}: straight from resolve`, async () => {
  await control("DELETE", "log");
  sameBytes(await download(REPO, plainFile), plainFile);
  const log = await control("GET", "log");
  assert(log.every((r) => r.url.startsWith(`/${REPO}/resolve/main/`) && r.status < 300), show(log));
  assert(log.some((r) => r.status === 200 && r.bytes_sent === source.get(plainFile).size), show(log));
});
await check("a missing file: downloadFile gives null", async () => {
  const blob = await downloadFile({ repo: REPO, path: "no/such-file.bin", hubUrl });
  assert(blob === null, `got ${blob}`);
});

// ---- gated ----
async function rejects(fn, status) {
  try {
    await fn();
  } catch (e) {
    assert(e.statusCode === status, `threw ${e.statusCode ?? ""} ${e.message}, want status ${status}`);
    return e.message.split(".")[0];
  }
  throw new Error("did not throw");
}
await check(`gated ${GATED}: downloadFile without credentials throws 401`,
  () => rejects(() => download(GATED, plainFile), 401));
await check(`gated ${GATED}: downloadFile with another token throws 403`,
  () => rejects(() => download(GATED, plainFile, { accessToken: "hf_not_the_token" }), 403));
await check(`gated ${GATED}: downloadFile with accessToken`, async () => {
  sameBytes(await download(GATED, lfsFile, { accessToken: TOKEN }), lfsFile);
  sameBytes(await download(GATED, plainFile, { accessToken: TOKEN }), plainFile);
});
await check(`gated ${GATED}: downloadFile with credentials`, async () => {
  sameBytes(await download(GATED, lfsFile, { credentials: { accessToken: TOKEN } }), lfsFile);
});
await check(`gated ${GATED}: listFiles without credentials (metadata is public, as on the hub)`, async () => {
  let n = 0;
  for await (const e of listFiles({ repo: GATED, hubUrl, recursive: true })) n += e.type === "file";
  assert(n === source.size, `${n} files, want ${source.size}`);
});

// ---- through the CDN host ----
await check(`gated ${GATED}: ${lfsFile} through a CDN on another host, no Authorization sent there`, async () => {
  await control("DELETE", "log");
  await control("DELETE", "faults");
  const res = await fetch(`${hubUrl}/_control/faults`, {
    method: "POST",
    body: JSON.stringify([{ path: lfsFile, repo: GATED, kind: "cdn", count: 10 }]),
  });
  assert(res.ok, `POST /_control/faults: ${res.status}`);
  try {
    sameBytes(await download(GATED, lfsFile, { accessToken: TOKEN }), lfsFile);
  } finally {
    await control("DELETE", "faults");
  }
  const log = await control("GET", "log");
  const cdn = log.filter((r) => r.host === "cdn"), main = log.filter((r) => r.host === "main");
  assert(main.length > 0 && main.every((r) => r.status === 302 && r.auth), `main: ${show(main)}`);
  assert(cdn.length > 0 && cdn.some((r) => r.bytes_sent === source.get(lfsFile).size), `cdn: ${show(cdn)}`);
  assert(cdn.every((r) => !r.auth), `the token went to the CDN: ${show(cdn)}`);
  return `${main.length} redirects, ${cdn.length} CDN requests`;
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);
