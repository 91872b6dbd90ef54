"""Tool-call examples for mini-K3's chat tuning: with tools declared, the user asks what a tool answers
and the reply calls it (its arguments copied from the question); given the tool's result, the next
reply answers from it; asked something no tool serves, the reply just answers. Rendered in K3 XTML by
bpe.K3Chat exactly as the engine renders an OpenAI request (checked against `deltafin tokenize --chat`
with --check), so that the bundled model makes real calls the server returns as `tool_calls`.

    python3 toolcalls.py --check DELTAFIN MODEL_DIR [N]   # K3Chat's ids == the engine's, N conversations
"""
import json
import os
import random
import subprocess
import sys
import tempfile

CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Cairo", "Lima", "Oslo", "Seoul", "Toronto",
          "Sydney", "Mumbai", "Nairobi", "Lisbon", "Vienna", "Dublin", "Prague", "Boston", "Denver", "Austin",
          "Chicago", "Zurich", "Athens", "Hanoi", "Bangkok", "Istanbul", "Warsaw", "Helsinki", "Montreal"]
TOPICS = ["python asyncio tutorial", "best pizza recipe", "rust borrow checker", "history of the printing press",
          "how to fix a flat tire", "linux file permissions", "quantum computing basics", "numpy broadcasting",
          "git rebase vs merge", "solar panel efficiency", "sourdough starter", "http caching headers"]
SYMBOLS = ["AAPL", "MSFT", "GOOG", "AMZN", "TSLA", "NVDA", "IBM", "ORCL", "INTC", "AMD"]
LANGS = ["French", "German", "Spanish", "Italian", "Japanese", "Portuguese"]
PHRASES = ["good morning", "thank you very much", "where is the station", "I like this book", "see you tomorrow"]
ZONES = ["Europe/Paris", "Asia/Tokyo", "America/New_York", "UTC", "Australia/Sydney", "Africa/Cairo"]
FILES = ["README.md", "src/main.c", "config.json", "notes.txt", "setup.py", "Makefile"]

# name, description, [(param, description)], question templates, reasoning, result maker, answer template
TOOLS = [
    ("get_weather", "Get the current weather of a city", [("city", "The city name")],
     ["What is the weather in {city}?", "What's the weather like in {city}?", "Is it raining in {city}?",
      "How warm is it in {city} today?", "Tell me the weather in {city}."],
     "The user asks about the weather in {city}, so I call get_weather.",
     lambda r, a: json.dumps({"city": a["city"], "temp_c": r.randint(-5, 35),
                              "sky": r.choice(["sunny", "cloudy", "rain", "snow"])}),
     "In {city} it is {temp_c} degrees Celsius and {sky}."),
    ("search_web", "Search the web and return the top results", [("query", "What to search for")],
     ["Search the web for {query}.", "Can you look up {query}?", "Find me something about {query}."],
     "The user wants web results for {query}; I call search_web.",
     lambda r, a: json.dumps({"results": ["%s - guide" % a["query"], "%s explained" % a["query"]]}),
     "I found: {results0}, and {results1}."),
    ("get_stock_price", "Get the latest price of a stock", [("symbol", "The ticker symbol")],
     ["What is the stock price of {symbol}?", "How much is {symbol} trading at?", "Price of {symbol} now?"],
     "The user asks for the price of {symbol}, so I call get_stock_price.",
     lambda r, a: json.dumps({"symbol": a["symbol"], "price": round(r.uniform(10, 900), 2)}),
     "{symbol} is trading at {price}."),
    ("translate", "Translate a text into a language", [("text", "The text"), ("language", "The target language")],
     ["Translate \"{text}\" into {language}.", "How do you say \"{text}\" in {language}?"],
     "The user wants \"{text}\" in {language}; I call translate.",
     lambda r, a: json.dumps({"translation": "[%s] %s" % (a["language"], a["text"])}),
     "In {language}: {translation}"),
    ("get_time", "Get the current time in a time zone", [("timezone", "An IANA time zone")],
     ["What time is it in {timezone}?", "Current time in {timezone}?"],
     "The user asks the time in {timezone}; I call get_time.",
     lambda r, a: json.dumps({"timezone": a["timezone"], "time": "%02d:%02d" % (r.randint(0, 23), r.randint(0, 59))}),
     "It is {time} in {timezone}."),
    ("read_file", "Read a file of the user's project", [("path", "The file's path")],
     ["Show me the contents of {path}.", "What is in {path}?", "Open {path}."],
     "The user wants to see {path}; I call read_file.",
     lambda r, a: json.dumps({"path": a["path"], "bytes": r.randint(10, 5000)}),
     "{path} has {bytes} bytes."),
]
SLOTS = {"city": CITIES, "query": TOPICS, "symbol": SYMBOLS, "text": PHRASES, "language": LANGS, "timezone": ZONES,
         "path": FILES}


def schema(tool):
    name, desc, params = tool[0], tool[1], tool[2]
    return {"type": "function", "function": {
        "name": name, "description": desc,
        "parameters": {"type": "object", "properties": {k: {"type": "string", "description": d} for k, d in params},
                       "required": [k for k, _ in params]}}}


def conversation(r, plain_pairs=None):
    """One example as an OpenAI request plus what its replies are: (request, kind, tool, args, result)."""
    tool = r.choice(TOOLS)
    others = r.sample([t for t in TOOLS if t is not tool], r.randint(0, 2))
    decl = [schema(t) for t in r.sample([tool] + others, len(others) + 1)]
    kind = r.choice(["call", "call", "answer", "plain"]) if plain_pairs else r.choice(["call", "answer"])
    if kind == "plain":
        user, answer = r.choice(plain_pairs)
        return {"tools": decl, "user": user, "kind": kind, "answer": answer}
    args = {k: r.choice(SLOTS[k]) for k, _ in tool[2]}
    user = r.choice(tool[3]).format(**args)
    ex = {"tools": decl, "user": user, "kind": kind, "name": tool[0], "args": [(k, args[k]) for k, _ in tool[2]],
          "reasoning": tool[4].format(**args)}
    if kind == "answer":
        res = tool[5](r, args)
        fields = dict(args, **json.loads(res))
        for i, v in enumerate(fields.get("results", [])):
            fields["results%d" % i] = v
        ex["result"], ex["answer"] = res, tool[6].format(**fields)
    return ex


def render(chat, ex, thinking):
    """(ids, loss mask) of one example: the replies are learned, the prompt and the tool's result not."""
    p = chat.prompt(ex["user"], thinking=thinking, tools=ex["tools"])
    if ex["kind"] == "plain":
        r = chat.reply(ex["answer"], thinking=thinking)
        return p + r, [0] * len(p) + [1] * len(r)
    c = chat.call_reply(ex["name"], ex["args"], thinking=thinking, reasoning=ex["reasoning"])
    if ex["kind"] == "call":
        return p + c, [0] * len(p) + [1] * len(c)
    t = chat.tool_result(ex["name"], ex["result"], thinking=thinking)
    a = chat.reply(ex["answer"], thinking=thinking)
    return p + c + t + a, [0] * len(p) + [1] * len(c) + [0] * len(t) + [1] * len(a)


def examples(chat, n, seed, plain_pairs=None):
    r = random.Random(seed)
    out = []
    for i in range(n):
        ids, mask = render(chat, conversation(r, plain_pairs), thinking=i % 2 == 0)
        out.append((ids, mask))
    return out


def as_request(ex):
    """The OpenAI messages of an example, ending before its last reply, for the engine's renderer."""
    msgs = [{"role": "user", "content": ex["user"]}]
    if ex["kind"] == "answer":
        msgs.append({"role": "assistant", "content": "", "reasoning_content": ex["reasoning"], "tool_calls": [
            {"id": "functions.%s:0" % ex["name"], "type": "function",
             "function": {"name": ex["name"], "arguments": json.dumps(dict(ex["args"]))}}]})
        msgs.append({"role": "tool", "tool_call_id": "functions.%s:0" % ex["name"], "content": ex["result"]})
    return {"messages": msgs, "tools": ex["tools"]}


def check(deltafin, model_dir, n):
    """K3Chat's prompts == the engine's for n random conversations, both thinking modes."""
    import bpe
    toks = bpe.read_kimi_ranks(model_dir)
    specials = bpe.k3_specials(len(toks))
    enc = bpe.RankBPE(toks, bpe.KIMI_PAT, specials)
    chat = bpe.K3Chat(enc.encode, len(toks))
    r = random.Random(7)
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        for i in range(n):
            ex = conversation(r)
            th = i % 2 == 0
            ids, mask = render(chat, ex, th)
            # the engine's prompt for the last reply: everything before the last run of learned ids
            last = max(k for k in range(len(mask)) if mask[k] == 0) + 1
            f = os.path.join(d, "req.json")
            json.dump(as_request(ex), open(f, "w"))
            cmd = [deltafin, "tokenize", "--model", model_dir, "--chat", f] + ([] if th else ["--no-thinking"])
            got = [int(x) for x in subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()]
            if got != ids[:last]:
                bad += 1
                k = next((j for j in range(min(len(got), last)) if got[j] != ids[j]), min(len(got), last))
                print("differ (%s, thinking %d) at %d: engine %s vs %s" % (ex["kind"], th, k, got[k:k + 8],
                                                                            ids[k:k + 8]))
    print("%d of %d conversations rendered as the engine does" % (n - bad, n))
    return bad == 0


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--check":
        sys.exit(0 if check(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 40) else 1)
    print(__doc__)
