// The chat page of `deltafin serve` (GET /) in a headless Chromium, driven by puppeteer-core.
//
//   node browser.test.mjs BASE_URL SCREENSHOT_PATH [API_KEY]
//
// It launches Debian's /usr/bin/chromium (headless, --no-sandbox --disable-gpu, a temporary
// profile), opens BASE_URL/, enters API_KEY in the page's key field when one is given (the page
// itself needs none, its /v1 calls do), sends a message and waits until the answer has streamed in
// and the stats line shows tokens/s, sends a second turn (the page sends the whole conversation,
// so the server reuses its prefix), saves a screenshot to SCREENSHOT_PATH, then checks the Stop
// button. One line per check, "ok   NAME" or "FAIL NAME: WHY", then "N passed, M failed"; the
// exit status is 0 only when nothing failed.

import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import puppeteer from "puppeteer-core";

const [BASE_URL, SCREENSHOT, API_KEY] = process.argv.slice(2);
if (!BASE_URL || !SCREENSHOT) {
  console.error("usage: node browser.test.mjs BASE_URL SCREENSHOT_PATH [API_KEY]");
  process.exit(2);
}
const ROOT = BASE_URL.replace(/\/+$/, "") + "/";
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
// A hang guard, not a speed check: the page samples at the server's default temperature, so an
// answer is sometimes a long program (8059 chars took 18.5 s on a 2-vCPU VM, and longer ones
// passed 30 s there).
const ANSWER_TIMEOUT = 120_000;

let passed = 0, failed = 0;
function ok(name) {
  passed++;
  console.log(`ok   ${name}`);
}
function fail(name, why) {
  failed++;
  console.log(`FAIL ${name}: ${String(why).replace(/\s+/g, " ").trim()}`);
}
async function check(name, fn) {
  try {
    const note = await fn();
    ok(note ? `${name} (${note})` : name);
    return true;
  } catch (e) {
    fail(name, (e && e.message) || e);
    return false;
  }
}
function assert(cond, why) {
  if (!cond) throw new Error(why);
}
const show = (v) => JSON.stringify(v);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const STATS_RE = /^(\d+) tokens · ([\d.]+|–) tokens\/s · first token ([\d.]+) s · (\d+) of (\d+) prompt tokens reused$/;

// records, in the page, every text the answers are given (each assignment of textContent adds a
// new Text node, so the added node's data is the text at that moment), with the time
const OBSERVE = () => {
  window.__answers = [];
  new MutationObserver((ms) => {
    const t = performance.now();
    for (const m of ms) {
      const el = m.target.nodeType === 1 ? m.target : m.target.parentElement;
      if (!el || !el.classList || !el.classList.contains("answer")) continue;
      for (const n of m.addedNodes) if (n.nodeType === 3) window.__answers.push({ t, len: n.data.length, text: n.data });
    }
  }).observe(document.getElementById("log"), { childList: true, subtree: true, characterData: true });
};

// one turn: type, send, and watch the answer stream in until the stats line has tokens/s
async function turn(page, text, prevStats) {
  const before = await page.$$eval(".msg.assistant", (a) => a.length);
  await page.evaluate(() => { window.__answers = []; });
  await page.click("#input");
  await page.type("#input", text);
  const t0 = Date.now();
  await page.click("#send");
  const samples = []; // the last answer's length, sampled from here while it streams
  let done = null;
  while (Date.now() - t0 < ANSWER_TIMEOUT) {
    const s = await page.evaluate((before) => {
      const a = document.querySelectorAll(".msg.assistant");
      const last = a.length > before ? a[a.length - 1] : null;
      const ans = last && last.querySelector(".answer");
      const err = last && last.querySelector(".err");
      return { n: a.length, len: ans ? ans.textContent.length : -1, text: ans ? ans.textContent : "",
               stats: document.getElementById("stats").textContent, err: err ? err.textContent : null,
               sendDisabled: document.getElementById("send").disabled };
    }, before);
    samples.push(s.len);
    if (s.err) throw new Error(`the page shows an error: ${s.err}`);
    if (s.len > 0 && s.stats.includes("tokens/s") && s.stats !== prevStats && !s.sendDisabled) {
      done = s;
      break;
    }
    await sleep(15);
  }
  if (!done) {
    const s = await page.evaluate(() => ({ stats: document.getElementById("stats").textContent,
      answers: [...document.querySelectorAll(".msg.assistant .answer")].map((a) => a.textContent.slice(0, 80)) }));
    throw new Error(`no finished answer within ${ANSWER_TIMEOUT / 1000} s: stats ${show(s.stats)}, answers ${show(s.answers)}`);
  }
  const updates = await page.evaluate(() => window.__answers);
  return { ...done, ms: Date.now() - t0, samples, updates };
}

const profile = await mkdtemp(join(tmpdir(), "deltafin-chromium-"));
let browser = null;
try {
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    userDataDir: profile,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check"],
  });
  ok(`chromium starts (${await browser.version()})`);
} catch (e) {
  fail("chromium starts", (e && e.message) || e);
}

if (browser) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1000, height: 760 });
  const pageErrors = [], failedRequests = [];
  page.on("pageerror", (e) => pageErrors.push(e.message));
  page.on("console", (m) => { if (m.type() === "error") pageErrors.push(`console: ${m.text()}`); });
  page.on("requestfailed", (r) => {
    const why = r.failure() && r.failure().errorText;
    if (why !== "net::ERR_ABORTED") failedRequests.push(`${r.url()}: ${why}`); // Stop aborts on purpose
  });

  const loaded = await check("page loads", async () => {
    const r = await page.goto(ROOT, { waitUntil: "load", timeout: 15_000 });
    assert(r && r.status() === 200, `GET / gave ${r && r.status()}`);
    assert((r.headers()["content-type"] || "").startsWith("text/html"), `content-type ${r.headers()["content-type"]}`);
    assert((await page.title()) === "Deltafin", `title ${show(await page.title())}`);
    for (const sel of ["#input", "#send", "#stop", "#stats", "#log", "#model"])
      assert(await page.$(sel), `no ${sel}`);
    await page.evaluate(OBSERVE);
  });

  // #model leaves "connecting…" once /v1/models answered (or failed)
  const modelText = async () => {
    await page.waitForFunction(() => !document.getElementById("model").textContent.startsWith("connecting"), { timeout: 10_000 });
    return page.$eval("#model", (e) => e.textContent);
  };

  if (loaded && API_KEY) {
    await check("without the key the page says the server wants one", async () => {
      const t = await modelText();
      assert(/not reachable/.test(t) && /API key/i.test(t), `#model is ${show(t)}`);
    });
    pageErrors.length = 0; // the 401 above shows as a failed resource in the console
    await page.type("#key", API_KEY);
    await page.keyboard.press("Tab"); // change: the page stores the key and asks /v1/models again
    await page.waitForFunction(() => !document.getElementById("model").textContent.startsWith("not reachable"), { timeout: 10_000 }).catch(() => {});
  }

  let ready = false;
  if (loaded)
    ready = await check("the page finds the model", async () => {
      const t = await modelText();
      assert(/^default\b/.test(t), `#model is ${show(t)}`);
      return t;
    });

  let first = null;
  if (ready) {
    const ANSWERED = "answer streams in and the stats line shows tokens/s";
    try {
      first = await turn(page, "Write a Python function that adds two numbers.", "");
      ok(`${ANSWERED} (${first.text.length} chars in ${first.ms} ms)`);
    } catch (e) {
      fail(ANSWERED, e.message);
    }
  }

  if (first) {
    await check("the user's message is shown", async () => {
      const u = await page.$$eval(".msg.user", (a) => a.map((e) => e.textContent));
      assert(u.length === 1 && u[0] === "Write a Python function that adds two numbers.", `user bubbles ${show(u)}`);
      assert((await page.$eval("#input", (e) => e.value)) === "", "the textarea was not cleared");
    });

    await check("the answer grew while streaming", async () => {
      const ups = first.updates, final = first.text;
      assert(ups.length >= 1, "the answer was never updated");
      for (let i = 0; i < ups.length; i++) {
        assert(final.startsWith(ups[i].text), `update ${i} ${show(ups[i].text.slice(0, 40))} is not a prefix of the answer`);
        if (i) assert(ups[i].len >= ups[i - 1].len, `update ${i} shrank ${ups[i - 1].len} -> ${ups[i].len}`);
      }
      assert(ups[ups.length - 1].text === final, "the last update is not the answer shown");
      const sampled = [...new Set(first.samples.filter((n) => n > 0))];
      const spanMs = ups[ups.length - 1].t - ups[0].t;
      // a short answer may come in one decode step: then growth cannot be seen, only the answer
      if (ups.length < 2)
        return `one update of ${final.length} chars: nothing to see grow`;
      assert(ups[0].len < final.length, `the first update was already the whole answer (${ups.length} updates)`);
      return `${ups.length} updates over ${spanMs.toFixed(0)} ms, ${sampled.length} distinct lengths sampled`;
    });

    await check("the stats line", async () => {
      const m = STATS_RE.exec(first.stats);
      assert(m, `#stats is ${show(first.stats)}`);
      const n = Number(m[1]), tps = m[2], reused = Number(m[4]), prompt = Number(m[5]);
      assert(n >= 1, `${n} tokens`);
      assert(n === 1 || (tps !== "–" && Number(tps) > 0), `tokens/s is ${tps} for ${n} tokens`);
      assert(prompt > 0 && reused <= prompt, `${reused} of ${prompt} prompt tokens reused`);
      return first.stats;
    });

    let second = null;
    await check("a second turn reuses the conversation's prefix", async () => {
      second = await turn(page, "Now add type hints.", first.stats);
      const m = STATS_RE.exec(second.stats);
      assert(m, `#stats is ${show(second.stats)}`);
      const reused = Number(m[4]), prompt = Number(m[5]);
      const firstPrompt = Number(STATS_RE.exec(first.stats)[5]);
      assert(prompt > firstPrompt, `the second prompt (${prompt} tokens) is not longer than the first (${firstPrompt})`);
      assert(reused > 0, `0 of ${prompt} prompt tokens reused (${show(second.stats)})`);
      const n = await page.$$eval(".msg.assistant .answer", (a) => a.filter((e) => e.textContent.length > 0).length);
      assert(n === 2, `${n} non-empty answers on the page`);
      return `${reused} of ${prompt} reused`;
    });

    await check("screenshot saved", async () => {
      await page.screenshot({ path: SCREENSHOT, fullPage: true });
      return SCREENSHOT;
    });

    await check("Stop ends a running answer", async () => {
      const statsBefore = await page.$eval("#stats", (e) => e.textContent);
      await page.type("#input", "Write a long program with many classes.");
      await page.click("#send");
      // stop as soon as the answer has begun (or it is already over)
      await page.waitForFunction(() => {
        const a = document.querySelectorAll(".msg.assistant .answer");
        return (a.length === 3 && a[2].textContent.length > 0) || !document.getElementById("send").disabled;
      }, { timeout: ANSWER_TIMEOUT });
      const running = await page.$eval("#send", (e) => e.disabled);
      if (running) await page.click("#stop");
      await page.waitForFunction(() => !document.getElementById("send").disabled && document.getElementById("stop").disabled, { timeout: 10_000 });
      const stats = await page.$eval("#stats", (e) => e.textContent);
      const err = await page.$(".msg.assistant .err");
      assert(!err, `the page shows an error: ${err && (await err.evaluate((e) => e.textContent))}`);
      if (!running) return "the answer was over before Stop could be pressed";
      assert(stats !== statsBefore, `the stats line did not change (${show(stats)})`);
      assert(/^stopped after \d+ chunks$/.test(stats) || STATS_RE.test(stats), `#stats is ${show(stats)}`);
      return stats;
    });
  }

  if (loaded) {
    await check("no page errors", async () => {
      assert(pageErrors.length === 0, pageErrors.join("; "));
      assert(failedRequests.length === 0, `failed requests: ${failedRequests.join("; ")}`);
    });
  }
  await browser.close().catch(() => {});
}
await rm(profile, { recursive: true, force: true }).catch(() => {});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
