#!/usr/bin/env python3
"""gen_extra.py — more reference data for the tokenizer tests, made with the reference libraries.

Runs where tiktoken, tokenizers and transformers are installed (the GPU machine):
    python3 tests/data/tokenizers/gen_extra.py build/testdata/tokenizers OUTDIR
(TOKDIR holds the unpacked vocabulary folders: tests/testdata.sh unpacks tests/data/tokenizers/*.tar.xz;
the result was packed as tests/data/tokenizers/extra.tar.xz.)
Writes OUTDIR/extra.json (random multilingual texts and their ids from tiktoken with Kimi's
pre-tokenizer over the kimi-k3-standin ranks, tiktoken cl100k, HF tokenizers qwen3; long
inputs as a recipe + an FNV-1a hash of the ids; extra Qwen3 chats rendered by transformers) and
OUTDIR/props.json (which code points the reference regex engines put in each Unicode class, as
ranges, to check the tables in src/tokenizer/tok_unicode.c against) and OUTDIR/versions.txt.
"""
import json, os, random, sys

KIMI_PAT = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])


def fnv(ids):
    h = 0xcbf29ce484222325
    for t in ids:
        for k in range(4):
            h ^= (t >> (8 * k)) & 0xff
            h = (h * 0x100000001b3) & 0xffffffffffffffff
    return "%016x" % h


def ranges(cps):
    out, start, prev = [], None, None
    for c in sorted(cps):
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            out.append([start, prev]); start = prev = c
    if start is not None:
        out.append([start, prev])
    return out


ALL = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def probe_tiktoken(tiktoken):
    ranks = {bytes([i]): i for i in range(256)}
    props = {}
    for name, pat in (("L", r"\p{L}"), ("Lu", r"\p{Lu}"), ("Ll", r"\p{Ll}"), ("Lt", r"\p{Lt}"),
                      ("Lm", r"\p{Lm}"), ("Lo", r"\p{Lo}"), ("M", r"\p{M}"), ("N", r"\p{N}"),
                      ("Han", r"\p{Han}"), ("s", r"\s"), ("P", r"\p{P}"), ("S", r"\p{S}")):
        enc = tiktoken.Encoding(name="probe_" + name, pat_str=pat, mergeable_ranks=ranks, special_tokens={})
        got = set()
        for i in range(0, len(ALL), 50000):
            chunk = "".join(chr(c) for c in ALL[i:i + 50000])
            got.update(ord(ch) for ch in bytes(enc.encode(chunk)).decode("utf-8"))
        props[name] = ranges(got)
    ci = tiktoken.Encoding(name="ci", pat_str=r"(?i:'s|'t|'re|'ve|'m|'ll|'d)", mergeable_ranks=ranks, special_tokens={})
    props["ci_apostrophe"] = [c for c in ALL if ci.encode("'" + chr(c)) and len(bytes(ci.encode("'" + chr(c)))) > 1]
    return props


def probe_hf():
    from tokenizers import Regex, normalizers, pre_tokenizers
    props = {}
    for name, pat in (("L", r"\p{L}"), ("N", r"\p{N}"), ("M", r"\p{M}"), ("P", r"\p{P}"),
                      ("S", r"\p{S}"), ("s", r"\s")):
        sp = pre_tokenizers.Split(Regex(pat), behavior="removed")
        got = set()
        for i in range(0, len(ALL), 50000):
            chunk = "".join(chr(c) for c in ALL[i:i + 50000])
            kept = set()
            for piece, _ in sp.pre_tokenize_str(chunk):
                kept.update(ord(ch) for ch in piece)
            got.update(ord(ch) for ch in chunk if ord(ch) not in kept)
        props[name] = ranges(got)
    nfc = normalizers.NFC()
    props["nfc_changes"] = {str(c): nfc.normalize_str(chr(c)) for c in ALL if nfc.normalize_str(chr(c)) != chr(c)}
    return props


POOLS = [
    list("abcdefghijklmnopqrstuvwxyz"), list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"), list("0123456789"),
    list(" \t\n\r") + ["\u00a0", "\u2009", "\u3000", "\u0085", "\u2028", "\x0b", "\x0c", "\x1c", "\u1680", "\u180e", "\u200b"],
    list(".,;:!?'\"()[]{}<>/\\|@#$%^&*-_+=~`"),
    [chr(c) for c in range(0x4E00, 0x4E00 + 400)] + list("，。、！？：；「」《》"),
    [chr(c) for c in range(0x3041, 0x3097)] + [chr(c) for c in range(0x30A1, 0x30FB)] + ["ー", "々", "〇", "〻"],
    [chr(c) for c in range(0xAC00, 0xAC00 + 200)],
    [chr(c) for c in range(0x0410, 0x0450)] + [chr(c) for c in range(0x0391, 0x03CA)],
    [chr(c) for c in range(0x0621, 0x064B)] + [chr(c) for c in range(0x0660, 0x066A)],
    [chr(c) for c in range(0x0905, 0x0940)] + ["\u093f", "\u0940", "\u094d", "\u0902"],
    [chr(c) for c in range(0x0E01, 0x0E30)] + ["\u0e31", "\u0e34", "\u0e48"],
    ["\u0301", "\u0308", "\u0327", "\u20dd", "\u302a", "\U00016ff0", "\u1ab0"],
    ["😀", "👍", "🏽", "\u200d", "👩", "💻", "🇳", "🇱", "🦀", "\ufe0f", "❤"],
    ["é", "e\u0301", "Å", "A\u030a", "ǅ", "ǈ", "ß", "ẞ", "ſ", "ﬁ", "Ⅻ", "½", "²", "\u212a", "İ", "ı"],
    ["'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'ſ", "'x"],
    ["<|end_of_msg|>", "<|open|>", "<|sep|>", "[BOS]", "<|im_end|>", "<|im_start|>", "<think>", "<tool_call>",
     "<|endoftext|>", "<|reserved_token_200100|>", "<|fim_prefix|>"],
    ["\U00020000", "\U0002a700", "\U00031350", "\U0002ebf0", "\U0001cc00", "\u1c89", "\U00011f04", "\uffff", "\U0010ffff", "\U000e0001"],
]


def rand_text(rng):
    n = rng.choice([1, 2, 3, 5, 8, 13, 30, 60, 120, 250])
    pools = rng.sample(range(len(POOLS)), rng.choice([1, 2, 3, 5]))
    out = []
    for _ in range(n):
        p = POOLS[rng.choice(pools)]
        out.append(rng.choice(p) * (rng.choice([1, 1, 1, 2, 3, 7]) if rng.random() < 0.2 else 1))
    return "".join(out)


LONG = [
    [["a", 30000]], [[" ", 30000], ["x", 1]], [["A", 25001], ["b", 2]], [["\n", 26000], ["z", 3]],
    [["é", 30000]], [["中", 30000]], [["ab ", 133400]], [["Hello wörld, 中文 123  ", 20001]],
    [["x", 24999], [" ", 2], ["y", 25001], ["\t", 25000], ["q", 1]], [["word ", 80001]],
    [["😀", 26000]], [["1", 30001]], [["'s", 13000]], [[" \u00a0", 13000], ["k", 1]],
]


def build(parts):
    return "".join(s * k for s, k in parts)


def kimi_encode(enc, text, allow_special):
    def split(s, m):
        cur, is_sp, start = 0, (s[0].isspace() if s else False), 0
        for i, ch in enumerate(s):
            now = ch.isspace()
            if is_sp ^ now:
                cur, is_sp = 1, now
            else:
                cur += 1
                if cur > m:
                    yield s[start:i]; start, cur = i, 1
        yield s[start:]
    out = []
    for i in range(0, len(text), 400000):
        for sub in split(text[i:i + 400000], 25000):
            out.extend(enc.encode(sub, allowed_special="all") if allow_special else enc.encode(sub, disallowed_special=()))
    return out


QWEN_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
QWEN_CHATS = [
    {"tools": QWEN_TOOLS, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}]},
    {"tools": QWEN_TOOLS, "messages": [{"role": "user", "content": "Weather in Oslo?"}]},
    {"tools": QWEN_TOOLS, "messages": [
        {"role": "user", "content": "Weather in Oslo and Rome?"},
        {"role": "assistant", "content": "", "reasoning_content": "Two calls.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
            {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome", "n": 1.5}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "cold"},
        {"role": "tool", "tool_call_id": "b", "content": "warm"}], "kwargs": {"enable_thinking": True}},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"},
                  {"role": "user", "content": "Again"}], "kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "r1"}, {"role": "assistant", "content": "done", "reasoning_content": "\nthought\n"}]},
    {"messages": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "café 中文 <|im_end|> x"},
                  {"role": "system", "content": "late system"}, {"role": "user", "content": "  spaced\n\n"}]},
]


def main():
    tokdir, outdir = sys.argv[1:3]
    os.makedirs(outdir, exist_ok=True)
    import tiktoken, tokenizers, transformers
    from tiktoken.load import load_tiktoken_bpe
    with open(os.path.join(outdir, "versions.txt"), "w") as f:
        f.write("tiktoken %s\ntokenizers %s\ntransformers %s\n" % (tiktoken.__version__, tokenizers.__version__, transformers.__version__))
    props = {"tiktoken": probe_tiktoken(tiktoken), "hf": probe_hf()}
    json.dump(props, open(os.path.join(outdir, "props.json"), "w"))

    cfg = json.load(open(os.path.join(tokdir, "kimi-k3-standin", "tokenizer_config.json")))
    ranks = load_tiktoken_bpe(os.path.join(tokdir, "kimi-k3-standin", "tiktoken.model"))
    n = len(ranks)
    names = {int(k): v["content"] for k, v in cfg["added_tokens_decoder"].items()}
    specials = {names.get(i, "<|reserved_token_%d|>" % i): i for i in range(n, n + 256)}
    kimi = tiktoken.Encoding(name="kimi", pat_str=KIMI_PAT, mergeable_ranks=ranks, special_tokens=specials)
    pats = json.load(open(os.path.join(tokdir, "cl100k", "tiktoken_config.json")))
    cl = tiktoken.Encoding(name="cl", pat_str=pats["pat_str"],
                           mergeable_ranks=load_tiktoken_bpe(os.path.join(tokdir, "cl100k", "tiktoken.model")),
                           special_tokens=pats["special_tokens"])
    qw = tokenizers.Tokenizer.from_file(os.path.join(tokdir, "qwen3", "tokenizer.json"))

    rng = random.Random(1234)
    texts = [rand_text(rng) for _ in range(600)]
    res = {"kimi": [], "kimi_special": [], "cl100k": [], "qwen3": [], "long": [], "qwen3_chat": []}
    for t in texts:
        res["kimi"].append({"text": t, "ids": kimi_encode(kimi, t, False)})
        res["kimi_special"].append({"text": t, "ids": kimi_encode(kimi, t, True)})
        res["cl100k"].append({"text": t, "ids": cl.encode(t, disallowed_special=())})
        res["qwen3"].append({"text": t, "ids": qw.encode(t, add_special_tokens=False).ids})
    for parts in LONG:
        t = build(parts)
        k = kimi_encode(kimi, t, False)
        c = cl.encode(t, disallowed_special=())
        q = qw.encode(t, add_special_tokens=False).ids
        res["long"].append({"parts": parts, "kimi": [len(k), fnv(k)], "cl100k": [len(c), fnv(c)], "qwen3": [len(q), fnv(q)]})
    from transformers import PreTrainedTokenizerFast
    qcfg = json.load(open(os.path.join(tokdir, "qwen3", "tokenizer_config.json")))
    q = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tokdir, "qwen3", "tokenizer.json"))
    for c in QWEN_CHATS:
        r = q.apply_chat_template(c["messages"], tools=c.get("tools"), chat_template=qcfg["chat_template"], tokenize=False,
                                  add_generation_prompt=True, **c.get("kwargs", {}))
        case = {"messages": c["messages"], "kwargs": c.get("kwargs", {}), "rendered": r,
                "ids": q(r, add_special_tokens=False)["input_ids"]}
        if c.get("tools"):
            case["tools"] = c["tools"]
        res["qwen3_chat"].append(case)
    json.dump(res, open(os.path.join(outdir, "extra.json"), "w"), ensure_ascii=False)
    print("ok", {k: len(v) for k, v in res.items()})


if __name__ == "__main__":
    main()
