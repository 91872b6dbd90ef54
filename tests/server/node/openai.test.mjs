// The official openai SDK (npm "openai") against `deltafin serve`.
//
//   node openai.test.mjs BASE_URL [API_KEY]
//
// BASE_URL is the server's root (http://127.0.0.1:PORT); API_KEY the key it was started with
// (--api-key), if any: the wrong-key checks only run when one is given. One line per check,
// "ok   NAME" or "FAIL NAME: WHY", then "N passed, M failed"; the exit status is 0 only when
// nothing failed. Besides the SDK it uses node's built-ins only.
//
// The overload check assumes the server's --queue is under 39 (the default is 16).

import OpenAI from "openai";

const [BASE_URL, API_KEY] = process.argv.slice(2);
if (!BASE_URL) {
  console.error("usage: node openai.test.mjs BASE_URL [API_KEY]");
  process.exit(2);
}

const baseURL = BASE_URL.replace(/\/+$/, "") + "/v1";
// the SDK insists on some key; a server without --api-key ignores it
const client = new OpenAI({ baseURL, apiKey: API_KEY || "none", maxRetries: 0, timeout: 60_000 });
const MODEL = "default";

let passed = 0, failed = 0;

async function check(name, fn) {
  try {
    const note = await fn();
    passed++;
    console.log(note ? `ok   ${name} (${note})` : `ok   ${name}`);
  } catch (e) {
    failed++;
    const why = e instanceof OpenAI.APIError ? `${e.constructor.name} ${e.status ?? ""}: ${e.message}` : (e && e.message) || String(e);
    console.log(`FAIL ${name}: ${why.replace(/\s+/g, " ").trim()}`);
  }
}

function assert(cond, why) {
  if (!cond) throw new Error(why);
}

const show = (v) => JSON.stringify(v);

function isCount(v) {
  return Number.isInteger(v) && v >= 0;
}

function checkUsage(u, where) {
  assert(u && typeof u === "object", `${where}: no usage (${show(u)})`);
  for (const k of ["prompt_tokens", "completion_tokens", "total_tokens"])
    assert(isCount(u[k]), `${where}: usage.${k} is ${show(u[k])}`);
  assert(u.total_tokens === u.prompt_tokens + u.completion_tokens, `${where}: total_tokens ${u.total_tokens} != ${u.prompt_tokens} + ${u.completion_tokens}`);
  assert(u.prompt_tokens > 0, `${where}: prompt_tokens is 0`);
  const c = u.prompt_tokens_details && u.prompt_tokens_details.cached_tokens;
  assert(typeof c === "number" && isCount(c), `${where}: usage.prompt_tokens_details.cached_tokens is ${show(c)}`);
  assert(c <= u.prompt_tokens, `${where}: cached_tokens ${c} > prompt_tokens ${u.prompt_tokens}`);
}

// the request "expects" to fail with the SDK's class cls (and status, and optionally param/code)
async function expectError(promiseOrFn, cls, status, { param, code } = {}) {
  let err = null;
  try {
    const p = typeof promiseOrFn === "function" ? promiseOrFn() : promiseOrFn;
    const r = await p;
    // a stream that did not throw on create: reading it must throw
    if (r && typeof r[Symbol.asyncIterator] === "function") for await (const _ of r);
  } catch (e) {
    err = e;
  }
  assert(err, `no error: expected ${cls.name} (${status})`);
  assert(err instanceof cls, `expected ${cls.name}, got ${err.constructor.name} (${err.status}): ${err.message}`);
  let cause = "";
  for (let c = err.cause; c; c = c.cause) cause += ` <- ${c.code ? c.code + " " : ""}${c.message || c}`;
  assert(err.status === status, `expected status ${status}, got ${err.constructor.name} with status ${err.status}: ${err.message}${cause}`);
  assert(err.error && typeof err.error.message === "string", `no error.message in the body: ${show(err.error)}`);
  assert(typeof err.type === "string", `error.type is ${show(err.type)}`);
  if (param !== undefined) assert(err.param === param, `expected param ${show(param)}, got ${show(err.param)}`);
  if (code !== undefined) assert(err.code === code, `expected code ${show(code)}, got ${show(err.code)}`);
  return err;
}

// the server's count of generations whose client went away (GET /metrics, Prometheus text)
async function cancelledTotal() {
  const r = await fetch(BASE_URL.replace(/\/+$/, "") + "/metrics", { headers: API_KEY ? { Authorization: `Bearer ${API_KEY}` } : {} });
  assert(r.ok, `GET /metrics: ${r.status}`);
  const m = /^deltafin_cancelled_total (\d+)$/m.exec(await r.text());
  assert(m, "no deltafin_cancelled_total in /metrics");
  return Number(m[1]);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- the checks ----

const MESSAGES = [
  { role: "system", content: "You are a helpful coding assistant." },
  { role: "user", content: "Write a Python function that reverses a string." },
];
const CHAT_MAX = 16;
const greedyChat = { model: MODEL, messages: MESSAGES, max_tokens: CHAT_MAX, temperature: 0 };

await check("models.list contains default", async () => {
  const page = await client.models.list();
  const ids = [];
  for await (const m of page) ids.push(m.id);
  assert(ids.includes(MODEL), `ids are ${show(ids)}`);
  assert(page.data.every((m) => m.object === "model"), `object is not "model": ${show(page.data)}`);
});

await check("models.retrieve default", async () => {
  const m = await client.models.retrieve(MODEL);
  assert(m.id === MODEL, `id is ${show(m.id)}`);
  assert(m.object === "model", `object is ${show(m.object)}`);
  assert(typeof m.created === "number" && typeof m.owned_by === "string", `created/owned_by: ${show(m)}`);
});

let chatText = null, chatUsage = null;
await check("chat non-streaming", async () => {
  const r = await client.chat.completions.create(greedyChat);
  assert(r.object === "chat.completion", `object is ${show(r.object)}`);
  assert(typeof r.id === "string" && r.id.length > 0, `id is ${show(r.id)}`);
  assert(r.model === MODEL, `model is ${show(r.model)}`);
  assert(Array.isArray(r.choices) && r.choices.length === 1, `choices: ${show(r.choices)}`);
  const c = r.choices[0];
  assert(c.index === 0, `index is ${show(c.index)}`);
  assert(c.message.role === "assistant", `role is ${show(c.message.role)}`);
  assert(typeof c.message.content === "string", `content is ${show(c.message.content)}`);
  assert(["stop", "length"].includes(c.finish_reason), `finish_reason is ${show(c.finish_reason)}`);
  checkUsage(r.usage, "usage");
  assert(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= CHAT_MAX, `completion_tokens ${r.usage.completion_tokens} (max_tokens ${CHAT_MAX})`);
  if (c.finish_reason === "length") assert(r.usage.completion_tokens === CHAT_MAX, `finish_reason length but completion_tokens ${r.usage.completion_tokens}`);
  chatText = c.message.content;
  chatUsage = r.usage;
});

await check("chat repeated greedy request is the same and reuses the prompt", async () => {
  const r = await client.chat.completions.create(greedyChat);
  assert(chatText !== null, "no first answer to compare with");
  assert(r.choices[0].message.content === chatText, `${show(r.choices[0].message.content)} != ${show(chatText)}`);
  checkUsage(r.usage, "usage");
  assert(r.usage.prompt_tokens === chatUsage.prompt_tokens, `prompt_tokens ${r.usage.prompt_tokens} != ${chatUsage.prompt_tokens}`);
  assert(r.usage.prompt_tokens_details.cached_tokens > 0, `cached_tokens is 0 on an identical repeat (${show(r.usage)})`);
});

await check("chat streaming with include_usage", async () => {
  const stream = await client.chat.completions.create({ ...greedyChat, stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, chunks = 0, ids = new Set(), role = null, afterUsage = 0, usageNullBefore = true;
  for await (const ch of stream) {
    chunks++;
    ids.add(ch.id);
    assert(ch.object === "chat.completion.chunk", `chunk object is ${show(ch.object)}`);
    if (usage) afterUsage++;
    if (ch.usage) {
      usage = ch.usage;
      assert(Array.isArray(ch.choices) && ch.choices.length === 0, `the usage chunk has choices ${show(ch.choices)}`);
      continue;
    }
    if (ch.usage !== null && ch.usage !== undefined) usageNullBefore = false;
    assert(ch.choices.length === 1, `a chunk has ${ch.choices.length} choices`);
    const c = ch.choices[0];
    if (c.delta.role) role = c.delta.role;
    if (typeof c.delta.content === "string") text += c.delta.content;
    if (c.finish_reason) {
      assert(finish === null, `two finish_reasons (${finish}, ${c.finish_reason})`);
      finish = c.finish_reason;
    }
  }
  assert(chunks >= 2, `only ${chunks} chunks`);
  assert(ids.size === 1, `chunk ids differ: ${show([...ids])}`);
  assert(role === "assistant", `no delta.role assistant (${show(role)})`);
  assert(["stop", "length"].includes(finish), `finish_reason is ${show(finish)}`);
  assert(usage, "no usage chunk");
  assert(afterUsage === 0, `${afterUsage} chunks after the usage chunk`);
  assert(usageNullBefore, "a chunk before the last had a non-null usage");
  checkUsage(usage, "usage");
  if (finish === "length") assert(usage.completion_tokens === CHAT_MAX, `finish_reason length but completion_tokens ${usage.completion_tokens} (max_tokens ${CHAT_MAX})`);
  assert(chatText !== null, "no non-streamed answer to compare with");
  assert(text === chatText, `streamed ${show(text)} != non-streamed ${show(chatText)}`);
});

await check("chat streaming without include_usage has no usage", async () => {
  const stream = await client.chat.completions.create({ ...greedyChat, stream: true });
  let text = "", sawUsage = false;
  for await (const ch of stream) {
    if (ch.usage) sawUsage = true;
    if (ch.choices[0] && typeof ch.choices[0].delta.content === "string") text += ch.choices[0].delta.content;
  }
  assert(!sawUsage, "a chunk carried usage without stream_options.include_usage");
  assert(text === chatText, `streamed ${show(text)} != non-streamed ${show(chatText)}`);
});

await check("chat stream helper finalChatCompletion", async () => {
  const s = client.chat.completions.stream({ ...greedyChat, stream_options: { include_usage: true } });
  let deltas = "";
  s.on("content", (d) => { deltas += d; });
  const final = await s.finalChatCompletion();
  const content = final.choices[0].message.content;
  assert(content === chatText, `final content ${show(content)} != ${show(chatText)}`);
  assert(deltas === chatText, `content events ${show(deltas)} != ${show(chatText)}`);
  assert(final.usage && final.usage.completion_tokens >= 1, `final usage ${show(final.usage)}`);
});

// A tool call the bundled model really makes (its chat tuning has tool calls: tools/train/toolcalls.py),
// parsed by the SDK, streamed through its stream helper, and the round trip back with the result.
const WEATHER = [{ type: "function", function: {
  name: "get_weather", description: "Get the current weather of a city",
  parameters: { type: "object", properties: { city: { type: "string", description: "The city name" } }, required: ["city"] } } }];
const askWeather = { model: MODEL, messages: [{ role: "user", content: "What is the weather like in Paris?" }], tools: WEATHER, temperature: 0 };
let weatherCall = null;

await check("tool call: tool_calls parsed by the SDK, finish_reason tool_calls", async () => {
  const r = await client.chat.completions.create(askWeather);
  const c = r.choices[0];
  assert(c.finish_reason === "tool_calls", `finish_reason ${show(c.finish_reason)}`);
  const calls = c.message.tool_calls || [];
  assert(calls.length === 1 && calls[0].type === "function" && typeof calls[0].id === "string" && calls[0].id, `tool_calls ${show(calls)}`);
  assert(calls[0].function.name === "get_weather", `name ${show(calls[0].function.name)}`);
  const args = JSON.parse(calls[0].function.arguments);
  assert(args.city === "Paris", `arguments ${show(args)}`);
  weatherCall = calls[0];
  return `get_weather(${calls[0].function.arguments})`;
});

await check("tool call streamed: the SDK's stream helper assembles the call", async () => {
  const s = client.chat.completions.stream(askWeather);
  const done = [];
  s.on("tool_calls.function.arguments.done", (e) => done.push(e));
  const final = await s.finalChatCompletion();
  const calls = final.choices[0].message.tool_calls || [];
  assert(final.choices[0].finish_reason === "tool_calls", `finish_reason ${show(final.choices[0].finish_reason)}`);
  assert(calls.length === 1 && calls[0].function.name === "get_weather", `tool_calls ${show(calls)}`);
  assert(JSON.parse(calls[0].function.arguments).city === "Paris", `arguments ${show(calls[0].function.arguments)}`);
  assert(done.length === 1 && done[0].name === "get_weather", `arguments.done events ${show(done)}`);
  assert(weatherCall === null || calls[0].function.arguments === weatherCall.function.arguments, "streamed arguments differ from the whole response's");
});

await check("tool round trip: the result goes back, the model answers from it", async () => {
  assert(weatherCall, "no call to answer (the first tool check failed)");
  const r = await client.chat.completions.create({ ...askWeather, messages: [...askWeather.messages,
    { role: "assistant", content: null, tool_calls: [weatherCall] },
    { role: "tool", tool_call_id: weatherCall.id, content: JSON.stringify({ city: "Paris", temp_c: 21, sky: "sunny" }) }] });
  const c = r.choices[0];
  assert(c.finish_reason === "stop", `finish_reason ${show(c.finish_reason)}`);
  assert(!c.message.tool_calls && typeof c.message.content === "string" && c.message.content.includes("Paris"), `message ${show(c.message)}`);
  return show(c.message.content);
});

await check("chat max_completion_tokens", async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: MESSAGES, max_completion_tokens: 5, temperature: 0 });
  const c = r.choices[0];
  assert(r.usage.completion_tokens <= 5, `completion_tokens ${r.usage.completion_tokens}`);
  if (c.finish_reason === "length") assert(r.usage.completion_tokens === 5, `length with completion_tokens ${r.usage.completion_tokens}`);
  assert(chatText.startsWith(c.message.content), `${show(c.message.content)} is not a prefix of ${show(chatText)}`);
});

await check("chat seeded sampling is reproducible", async () => {
  // docs/SERVER.md: "the same seed and request give the same tokens"
  const req = { model: MODEL, messages: MESSAGES, max_tokens: 24, temperature: 1, seed: 1234 };
  const seen = new Map();
  for (let i = 0; i < 6; i++) {
    const t = (await client.chat.completions.create(req)).choices[0].message.content;
    seen.set(t, (seen.get(t) || 0) + 1);
  }
  assert(seen.size === 1, `6 identical seeded requests gave ${seen.size} different texts: ${[...seen].map(([t, n]) => `${n}x ${show(t)}`).join(", ")}`);
});

const COMPLETION = { model: MODEL, prompt: "def fibonacci(n):", max_tokens: 12, temperature: 0 };
let complText = null;
await check("completions non-streaming", async () => {
  const r = await client.completions.create(COMPLETION);
  assert(r.object === "text_completion", `object is ${show(r.object)}`);
  assert(r.model === MODEL, `model is ${show(r.model)}`);
  assert(r.choices.length === 1, `choices: ${show(r.choices)}`);
  const c = r.choices[0];
  assert(typeof c.text === "string" && c.text.length > 0, `text is ${show(c.text)}`);
  assert(["stop", "length"].includes(c.finish_reason), `finish_reason is ${show(c.finish_reason)}`);
  checkUsage(r.usage, "usage");
  assert(r.usage.completion_tokens <= 12, `completion_tokens ${r.usage.completion_tokens}`);
  if (c.finish_reason === "length") assert(r.usage.completion_tokens === 12, `length with completion_tokens ${r.usage.completion_tokens}`);
  complText = c.text;
});

await check("completions streaming with include_usage", async () => {
  const stream = await client.completions.create({ ...COMPLETION, stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const ch of stream) {
    chunks++;
    assert(ch.object === "text_completion", `chunk object is ${show(ch.object)}`);
    if (ch.usage) {
      usage = ch.usage;
      assert(ch.choices.length === 0, `the usage chunk has choices ${show(ch.choices)}`);
      continue;
    }
    const c = ch.choices[0];
    if (typeof c.text === "string") text += c.text;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert(chunks >= 2, `only ${chunks} chunks`);
  assert(["stop", "length"].includes(finish), `finish_reason is ${show(finish)}`);
  checkUsage(usage, "usage");
  if (finish === "length") assert(usage.completion_tokens === 12, `length with completion_tokens ${usage.completion_tokens}`);
  assert(text === complText, `streamed ${show(text)} != non-streamed ${show(complText)}`);
});

await check("completions stop sequence", async () => {
  assert(complText && complText.trim().length >= 4, `the greedy text ${show(complText)} is too short to cut`);
  // a stop string from the middle of the greedy text: the answer is what comes before its first occurrence
  let at = Math.floor(complText.length / 2);
  while (at > 1 && /\s/.test(complText[at])) at--;
  const stop = complText.slice(at, at + 2);
  const cut = complText.indexOf(stop);
  const r = await client.completions.create({ ...COMPLETION, stop: [stop] });
  const c = r.choices[0];
  assert(c.finish_reason === "stop", `finish_reason is ${show(c.finish_reason)} (stop ${show(stop)})`);
  assert(c.text === complText.slice(0, cut), `text ${show(c.text)} != ${show(complText.slice(0, cut))} (stop ${show(stop)})`);
});

await check("chat stream aborted mid-way; server cancels it and carries on", async () => {
  const before = await cancelledTotal();
  const ctl = new AbortController();
  const stream = await client.chat.completions.create(
    { model: MODEL, messages: [{ role: "user", content: "Write a very long program." }], max_tokens: 4000, temperature: 1, stream: true },
    { signal: ctl.signal });
  let n = 0;
  try {
    for await (const ch of stream) {
      if (++n === 3) ctl.abort();
    }
  } catch (e) { // the SDK may end the iteration quietly or throw its abort error
    if (!(e instanceof OpenAI.APIUserAbortError) && e.name !== "AbortError") throw e;
  }
  assert(ctl.signal.aborted, `the stream ended by itself after ${n} chunks`);
  assert(n <= 4, `${n} chunks came after the abort`);
  const t0 = Date.now();
  const r = await client.chat.completions.create(greedyChat);
  assert(r.choices[0].message.content === chatText, `after the abort ${show(r.choices[0].message.content)} != ${show(chatText)}`);
  assert(Date.now() - t0 < 20_000, `the next request took ${Date.now() - t0} ms`);
  const after = await cancelledTotal();
  assert(after === before + 1, `deltafin_cancelled_total went from ${before} to ${after}`);
});

// ---- errors, as the SDK's typed exceptions ----

await check("unknown field -> BadRequestError 400 naming it", async () => {
  await expectError(client.chat.completions.create({ ...greedyChat, foo: 1 }), OpenAI.BadRequestError, 400, { param: "foo" });
});

await check("unknown field, streaming -> BadRequestError 400", async () => {
  await expectError(() => client.chat.completions.create({ ...greedyChat, stream: true, foo: 1 }), OpenAI.BadRequestError, 400, { param: "foo" });
});

await check("unknown field in completions -> BadRequestError 400", async () => {
  await expectError(client.completions.create({ ...COMPLETION, bar: true }), OpenAI.BadRequestError, 400, { param: "bar" });
});

await check("out-of-range temperature -> BadRequestError 400", async () => {
  await expectError(client.chat.completions.create({ ...greedyChat, temperature: 5 }), OpenAI.BadRequestError, 400, { param: "temperature" });
});

await check("stream_options without stream -> BadRequestError 400", async () => {
  await expectError(client.chat.completions.create({ ...greedyChat, stream_options: { include_usage: true } }), OpenAI.BadRequestError, 400, { param: "stream_options" });
});

await check("empty messages -> BadRequestError 400", async () => {
  await expectError(client.chat.completions.create({ model: MODEL, messages: [] }), OpenAI.BadRequestError, 400, { param: "messages" });
});

await check("model gpt-4 -> NotFoundError 404", async () => {
  await expectError(client.chat.completions.create({ ...greedyChat, model: "gpt-4" }), OpenAI.NotFoundError, 404, { code: "model_not_found", param: "model" });
});

await check("models.retrieve gpt-4 -> NotFoundError 404", async () => {
  await expectError(client.models.retrieve("gpt-4"), OpenAI.NotFoundError, 404);
});

await check("body over --max-request-bytes -> APIError 413", async () => {
  // the default limit is 8 MiB
  const big = "x".repeat(9 << 20);
  await expectError(client.chat.completions.create({ ...greedyChat, messages: [{ role: "user", content: big }] }), OpenAI.APIError, 413, { code: "request_too_large" });
});

if (API_KEY) {
  const bad = new OpenAI({ baseURL, apiKey: API_KEY + "-wrong", maxRetries: 0, timeout: 30_000 });
  await check("wrong api key -> AuthenticationError 401 (chat)", async () => {
    await expectError(bad.chat.completions.create(greedyChat), OpenAI.AuthenticationError, 401, { code: "invalid_api_key" });
  });
  await check("wrong api key -> AuthenticationError 401 (models)", async () => {
    await expectError(bad.models.list(), OpenAI.AuthenticationError, 401);
  });
  await check("wrong api key -> AuthenticationError 401 (streaming)", async () => {
    await expectError(() => bad.chat.completions.create({ ...greedyChat, stream: true }), OpenAI.AuthenticationError, 401);
  });
}

await check("overload -> RateLimitError 429", async () => {
  // more long requests at once than the queue holds: the excess is refused at once with 429
  const N = 40, ctl = new AbortController();
  const outcome = new Array(N).fill(null);
  const all = Promise.allSettled(Array.from({ length: N }, (_, i) =>
    client.completions
      .create({ model: MODEL, prompt: "def main():", max_tokens: 2000, temperature: 1, seed: i, ignore_eos: true }, { signal: ctl.signal, timeout: 120_000 })
      .then((r) => { outcome[i] = r; }, (e) => { outcome[i] = e; })));
  // the 429s come back at once; give them a moment, then drop the rest
  for (let t = 0; t < 100 && outcome.filter((o) => o instanceof OpenAI.RateLimitError).length === 0; t++) await sleep(50);
  await sleep(300);
  ctl.abort();
  await all;
  const limited = outcome.filter((o) => o instanceof OpenAI.RateLimitError);
  const other = outcome.filter((o) => o instanceof Error && !(o instanceof OpenAI.RateLimitError) && !(o instanceof OpenAI.APIUserAbortError) && o.name !== "AbortError");
  assert(other.length === 0, `unexpected errors: ${other.map((e) => `${e.constructor.name} ${e.status}: ${e.message}`).join("; ")}`);
  assert(limited.length > 0, `no 429 among ${N} simultaneous requests`);
  for (const e of limited) {
    assert(e.status === 429, `status ${e.status}`);
    assert(e.code === "queue_full", `code ${show(e.code)}`);
    assert(e.type === "rate_limit_error", `type ${show(e.type)}`);
  }
  // and the server is still fine once they are gone
  const t0 = Date.now();
  let r = null, refused = 0;
  for (;;) {
    try {
      r = await client.chat.completions.create(greedyChat);
      break;
    } catch (e) {
      if (!(e instanceof OpenAI.RateLimitError) || Date.now() - t0 > 20_000) throw e;
      refused++;
      await sleep(200); // the cancelled ones may still be leaving the queue
    }
  }
  assert(r.choices[0].message.content === chatText, `after the overload ${show(r.choices[0].message.content)} != ${show(chatText)}`);
  const done = outcome.filter((o) => o && !(o instanceof Error)).length;
  return `${limited.length} of ${N} refused, ${done} finished before the rest were dropped` + (refused ? `; the next request was refused ${refused} times` : "");
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
