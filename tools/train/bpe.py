"""Byte-level BPE for the bundled models: training, Kimi's tiktoken.model / tokenizer_config.json, a Qwen3-style
tokenizer.json, a reference encoder (rank BPE over Kimi's pre-tokenizer, as tiktoken and the engine encode), and
K3's XTML chat rendering (segment by segment, as Moonshot's encoding_k3.py and src/tokenizer/tok_chat_k3.c do).

Ranks: byte b has rank b; merge i (in training order) makes the token of rank 256 + i. Encoding a piece merges,
again and again, the adjacent pair whose concatenation has the lowest rank, so the ranks reproduce the BPE.
"""
import base64
import collections
import json
import os
import unicodedata

try:
    import regex as _re
except ImportError:  # pragma: no cover
    _re = None

KIMI_PAT = (
    r"[\p{Han}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    r"\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|"
    r"\s+(?!\S)|"
    r"\s+"
)
QWEN_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
            r"\s+(?!\S)|\s+")

# K3's named special tokens: offset from the number of BPE ranks (the slot at 21 is named as in
# the kimi-k3 stand-in tokenizer the engine is tested with). All other slots up to 255 are <|reserved_token_ID|>.
K3_SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
               6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 18: "<|media_begin|>",
               19: "<|media_content|>", 20: "<|media_end|>", 21: "<|kimi_image_placeholder|>", 65: "<osagent_mode>",
               254: "[UNK]", 255: "[PAD]"}
K3_NSPECIAL = 256
K3_MASK_OFFSET = 253          # DSpark's mask token: a reserved slot (163837 = 163584 + 253 in K3)

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                 "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                 "<tool_response>", "</tool_response>", "<think>", "</think>"]


def compile_pat(pat):
    return _re.compile(pat, _re.V1)


def bytes_to_unicode():
    """GPT-2's printable stand-ins for the 256 bytes (what HF's ByteLevel pre-tokenizer maps bytes to)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


# ---------------------------------------------------------------------------------------------- training

def word_counts(texts, pat, normalize=None):
    rx = compile_pat(pat)
    cnt = collections.Counter()
    for t in texts:
        if normalize:
            t = unicodedata.normalize(normalize, t)
        cnt.update(rx.findall(t))
    return cnt


def train_bpe_python(counts, n_merges, min_freq=2):
    """Plain BPE over pre-tokenized word counts; returns merges as (bytes, bytes) in order. Ties break by the
    smallest pair (bytes order), so the result is deterministic."""
    words = []
    for w, c in counts.items():
        b = w.encode("utf-8")
        if len(b) > 1:
            words.append([[bytes([x]) for x in b], c])
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for wi, (syms, c) in enumerate(words):
        for a, b in zip(syms, syms[1:]):
            pairs[(a, b)] += c
            where[(a, b)].add(wi)
    merges = []
    import heapq
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    while len(merges) < n_merges and heap:
        negc, p = heapq.heappop(heap)
        if pairs.get(p, 0) != -negc:
            if pairs.get(p, 0) > 0:
                heapq.heappush(heap, (-pairs[p], p))
            continue
        if -negc < min_freq:
            break
        merges.append(p)
        new = p[0] + p[1]
        touched = set()
        for wi in list(where[p]):
            syms, c = words[wi]
            for a, b in zip(syms, syms[1:]):
                pairs[(a, b)] -= c
            i, out = 0, []
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == p[0] and syms[i + 1] == p[1]:
                    out.append(new)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[wi][0] = out
            for a, b in zip(out, out[1:]):
                pairs[(a, b)] += c
                where[(a, b)].add(wi)
                touched.add((a, b))
        del pairs[p]
        where.pop(p, None)
        for q in touched:
            if pairs.get(q, 0) > 0:
                heapq.heappush(heap, (-pairs[q], q))
    return merges


def train_bpe_hf(texts, n_merges, pat):
    """The same with HF tokenizers (fast, Rust). Returns merges as (bytes, bytes)."""
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pat), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tr = trainers.BpeTrainer(vocab_size=256 + n_merges, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             special_tokens=[], show_progress=False, min_frequency=2)
    tk.train_from_iterator(texts, tr)
    js = json.loads(tk.to_str())
    dec = {v: k for k, v in bytes_to_unicode().items()}
    out = []
    for m in js["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        out.append((bytes(dec[ch] for ch in a), bytes(dec[ch] for ch in b)))
    return out


def bl_len(b):
    """Length in UTF-8 bytes of a token's ByteLevel spelling (bytes outside printable ASCII take 2)."""
    m = bytes_to_unicode()
    return sum(len(m[x].encode("utf-8")) for x in b)


def filter_merges(merges, n, lim=20):
    """Keeps, in order, the merges whose two parts are spelled in at most `lim` bytes in tokenizer.json (a merge
    whose part is dropped is dropped too), up to n merges. Deltafin's tokenizer.json reader bounds a merge part's
    spelling by the longest token (an added token such as <|object_ref_start|> is 20 bytes)."""
    have = set(bytes([b]) for b in range(256))
    out = []
    for a, b in merges:
        if a in have and b in have and bl_len(a) <= lim and bl_len(b) <= lim:
            out.append((a, b))
            have.add(a + b)
            if len(out) == n:
                break
    return out


def ranks_from_merges(merges):
    toks = [bytes([b]) for b in range(256)]
    seen = set(toks)
    for a, b in merges:
        t = a + b
        assert t not in seen, "duplicate merge result"
        seen.add(t)
        toks.append(t)
    return toks


def read_kimi_ranks(d):
    toks = []
    for i, line in enumerate(open(os.path.join(d, "tiktoken.model"))):
        t, r = line.split()
        assert int(r) == i
        toks.append(base64.b64decode(t))
    return toks


def read_hf_bpe(d):
    """(tokens in id order, merges) of a byte-level tokenizer.json written by write_qwen_tokenizer."""
    tj = json.load(open(os.path.join(d, "tokenizer.json")))
    dec = {v: k for k, v in bytes_to_unicode().items()}
    vb = lambda s: bytes(dec[c] for c in s)
    vocab = tj["model"]["vocab"]
    toks = [None] * len(vocab)
    for s, i in vocab.items():
        toks[i] = vb(s)
    return toks, [(vb(a), vb(b)) for a, b in tj["model"]["merges"]]


# ---------------------------------------------------------------------------------------------- encoding

class RankBPE:
    """Rank-based byte-level BPE over a pre-tokenizer regex: tiktoken's algorithm (and the engine's)."""

    def __init__(self, toks, pat, specials=None, normalize=None):
        self.toks = toks
        self.rank = {t: i for i, t in enumerate(toks)}
        self.rx = compile_pat(pat)
        self.cache = {}
        self.specials = specials or {}          # name -> id
        self.normalize = normalize
        self.id2special = {v: k for k, v in self.specials.items()}

    def _piece(self, b):
        r = self.rank.get(b)
        if r is not None:
            return [r]
        parts = [bytes([x]) for x in b]
        while len(parts) > 1:
            best, bi = None, -1
            for i in range(len(parts) - 1):
                rr = self.rank.get(parts[i] + parts[i + 1])
                if rr is not None and (best is None or rr < best):
                    best, bi = rr, i
            if best is None:
                break
            parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
        return [self.rank[p] for p in parts]

    def encode(self, text):
        if self.normalize:
            text = unicodedata.normalize(self.normalize, text)
        out = []
        for piece in self.rx.findall(text):
            ids = self.cache.get(piece)
            if ids is None:
                ids = self._piece(piece.encode("utf-8"))
                if len(self.cache) < 2_000_000:
                    self.cache[piece] = ids
            out.extend(ids)
        return out

    def decode_bytes(self, ids):
        return b"".join(self.toks[i] if i < len(self.toks) else self.id2special.get(i, "").encode() for i in ids)

    def decode(self, ids):
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def fast_encoder(toks, pat, specials):
    """tiktoken's Encoding over our ranks when tiktoken is installed (same ids as RankBPE, much faster)."""
    try:
        import tiktoken
    except ImportError:
        return None
    return tiktoken.Encoding(name="deltafin-mini", pat_str=pat, mergeable_ranks={t: i for i, t in enumerate(toks)},
                             special_tokens=dict(specials))


# ---------------------------------------------------------------------------------------------- writers

def k3_specials(n):
    return {(K3_SPECIALS.get(i) or f"<|reserved_token_{n + i}|>"): n + i for i in range(K3_NSPECIAL)}


def write_kimi_tokenizer(d, toks):
    """tiktoken.model (base64 bytes + rank per line) + tokenizer_config.json with K3's special ids at N + offset."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tiktoken.model"), "w") as f:
        for i, t in enumerate(toks):
            f.write(f"{base64.b64encode(t).decode()} {i}\n")
    n = len(toks)
    dec = {}
    for off in sorted(K3_SPECIALS):
        dec[str(n + off)] = {"content": K3_SPECIALS[off], "lstrip": False, "normalized": False, "rstrip": False,
                             "single_word": False, "special": True}
    cfg = {"tokenizer_class": "TikTokenTokenizer", "bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]",
           "pad_token": "[PAD]", "model_max_length": 1048576, "added_tokens_decoder": dec,
           "note": "mini-K3 vocabulary trained by tools/train (byte-level BPE, Kimi's pre-tokenizer); special ids "
                   "at len(ranks)+offset as in Kimi K3; unnamed slots are <|reserved_token_ID|>"}
    json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w"), indent=1)


def write_qwen_tokenizer(d, toks, merges, chat_template=None):
    """tokenizer.json (HF byte-level BPE, Qwen3's pre-tokenizer and layout) + tokenizer_config.json."""
    os.makedirs(d, exist_ok=True)
    b2u = bytes_to_unicode()
    u = lambda b: "".join(b2u[x] for x in b)
    vocab = {u(t): i for i, t in enumerate(toks)}
    n = len(toks)
    added = [{"id": n + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(QWEN_SPECIALS)]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
          "normalizer": {"type": "NFC"},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": QWEN_PAT}, "behavior": "Isolated", "invert": False}, bl]},
          "post_processor": bl, "decoder": bl,
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                    "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                    "vocab": vocab, "merges": [[u(a), u(b)] for a, b in merges]}}
    json.dump(tj, open(os.path.join(d, "tokenizer.json"), "w"), ensure_ascii=False, separators=(",", ":"))
    dec = {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
           for a in added}
    cfg = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": dec,
           "additional_special_tokens": QWEN_SPECIALS[1:14], "bos_token": None, "clean_up_tokenization_spaces": False,
           "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
           "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    if chat_template:
        cfg["chat_template"] = chat_template
    json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w"), indent=1, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------- K3 chat

EFFORT_BODY = ("`thinking_effort` guides on how much to think in your thinking channel (not including the response "
               "channel), supported values include `low`, `medium`, `high`, and `max`.\n"
               "Now the system is invoked with `thinking_effort={}`.")


class K3Chat:
    """Renders K3 XTML as ids: control markers are single special ids, every text segment is encoded alone."""

    def __init__(self, enc, n):
        self.enc, self.n = enc, n
        self.OPEN, self.CLOSE, self.SEP, self.EOM = n + 3, n + 4, n + 5, n + 2

    def _open(self, out, tag, attrs=()):
        out.append(self.OPEN)
        out += self.enc(tag)
        for k, v in attrs:
            out += self.enc(" " + k)
            out += self.enc('="')
            if v:
                out += self.enc(v.replace("&", "&amp;").replace('"', "&quot;"))
            out += self.enc('"')
        out.append(self.SEP)

    def _close(self, out, tag):
        out.append(self.CLOSE)
        out += self.enc(tag)
        out.append(self.SEP)

    def tools_declare(self, out, tools):
        """The tool-declare system message, as the engine (and Moonshot's encoder) renders `tools`."""
        self._open(out, "message", [("role", "system"), ("type", "tool-declare")])
        out += self.enc("# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n" +
                        json.dumps(tools, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n```")
        self._close(out, "message")
        out.append(self.EOM)

    def prompt(self, user, thinking=True, effort="max", system=None, tools=None):
        out = []
        if tools:
            self.tools_declare(out, tools)
        if thinking:
            self._open(out, "message", [("role", "system"), ("type", "thinking-effort")])
            out += self.enc(EFFORT_BODY.format(effort))
            self._close(out, "message")
            out.append(self.EOM)
        for role, text in ([("system", system)] if system else []) + [("user", user)]:
            self._open(out, "message", [("role", role)])
            if text:
                out += self.enc(text)
            self._close(out, "message")
            out.append(self.EOM)
        self._open(out, "message", [("role", "assistant")])
        self._open(out, "think" if thinking else "response")
        return out

    def _end_think(self, thinking, reasoning):
        """The start of a reply after prompt(): with thinking, the reasoning, then the think channel
        closed and the response opened (without, prompt() opened the response itself)."""
        out = []
        if thinking:
            if reasoning:
                out += self.enc(reasoning)
            self._close(out, "think")
            self._open(out, "response")
        return out

    def reply(self, answer, thinking=True, reasoning=""):
        """What the model should write after prompt(): (reasoning) close think, open response, answer, closes, EOM."""
        out = self._end_think(thinking, reasoning)
        if answer:
            out += self.enc(answer)
        self._close(out, "response")
        self._close(out, "message")
        out.append(self.EOM)
        return out

    def call_reply(self, name, args, thinking=True, reasoning=""):
        """What the model writes after prompt() to call a tool: (reasoning) an empty response, then the
        call with its string arguments [(key, value)], closes, EOM."""
        out = self._end_think(thinking, reasoning)
        self._close(out, "response")
        self._open(out, "tools")
        self._open(out, "call", [("tool", name), ("index", "1")])
        for k, v in args:
            self._open(out, "argument", [("key", k), ("type", "string")])
            out += self.enc(v)
            self._close(out, "argument")
        self._close(out, "call")
        self._close(out, "tools")
        self._close(out, "message")
        out.append(self.EOM)
        return out

    def tool_result(self, name, content, thinking=True):
        """The tool's answer to call_reply's call, then the opening of the assistant's next turn."""
        out = []
        self._open(out, "message", [("role", "tool"), ("tool", name), ("index", "1")])
        out += self.enc(content)
        self._close(out, "message")
        out.append(self.EOM)
        self._open(out, "message", [("role", "assistant")])
        self._open(out, "think" if thinking else "response")
        return out
