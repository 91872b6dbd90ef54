#!/usr/bin/env python3
"""Builds Deltafin's bundled models end to end, inside one time budget (README.md says how to run it):

  corpus -> BPE vocabularies (K3's tiktoken format; the Qwen3 drafter's tokenizer.json) -> token streams
  -> mini-K3 pre-training (+ chat pairs), MXFP4 quantization-aware finish of the routed experts -> export in
  K3's release layout -> sample completions -> DSpark drafter distilled from mini-K3 -> Qwen3 drafter (trained
  in a parallel process on its own tokenization, then on mini-K3's own outputs) -> acceptance rates in torch ->
  reference logits from Moonshot's modeling code (a parallel CPU process, float64) -> everything under --out.

usage: train.py --out DIR [--work DIR] [--budget SECONDS] [--small] [--k3src DIR --shim DIR]
                [--resume MODELS [--fresh-k3]] [--k3-seconds S] [--batch ROWS] [--ds-prompts N] [--ds-seconds S]
Stages write results.json and log.txt as they finish, so a run cut short still reports what it did.
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import tarfile
import time
import traceback
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch                                   # noqa: E402
import torch.nn.functional as F                # noqa: E402

import bpe                                     # noqa: E402
import corpus as corpus_mod                    # noqa: E402
import dspark as dspark_mod                    # noqa: E402
import k3model                                 # noqa: E402
import qwen3 as qwen_mod                       # noqa: E402

T0 = time.time()
LOG = None
RESULTS = {}
OUT = WORK = None


def log(*a):
    s = "[%6.1fs] " % (time.time() - T0) + " ".join(str(x) for x in a)
    print(s, flush=True)
    if LOG:
        LOG.write(s + "\n")
        LOG.flush()


def save_results():
    json.dump(RESULTS, open(os.path.join(OUT, "results.json"), "w"), indent=1)


def dev():
    return "cuda" if torch.cuda.is_available() else "cpu"


# ---------------------------------------------------------------------------------------------- sizes

K3_RANKS = 3840            # BPE ranks; + 256 K3 specials = vocab 4096
QWEN_RANKS = 3072          # BPE ranks; + 26 Qwen3 specials, vocab padded to 3104
QWEN_VOCAB = 3104


def plan(small):
    if small:
        return dict(corpus_bytes=3_000_000, per_dist=600_000, bpe_sample=1_000_000, k3_ranks=640, qwen_ranks=512,
                    seq=64, batch=4, qwen_seq=64, qwen_batch=4, chat_frac=0.1, ds_prompts=8, ds_new=24,
                    acc_prompts=3, acc_new=16, eval_tokens=4096, bpe_py=True)
    return dict(corpus_bytes=160_000_000, per_dist=12_000_000, bpe_sample=20_000_000, k3_ranks=K3_RANKS,
                qwen_ranks=QWEN_RANKS, seq=512, batch=64, qwen_seq=512, qwen_batch=64, chat_frac=0.08,
                ds_prompts=3072, ds_new=64, acc_prompts=16, acc_new=48, eval_tokens=400_000, bpe_py=False)


# ---------------------------------------------------------------------------------------------- tokenizers

def train_merges(texts, n, pat, normalize, use_py, sample_py=4_000_000):
    if not use_py:
        # HF's regex engine (Oniguruma) may not take Kimi's class intersections; the same pattern without the
        # Han exclusion splits this (almost all ASCII) corpus identically, and only the training pre-split uses it
        for p in (pat, pat.replace("&&[^\\p{Han}]", "")):
            try:
                t = time.time()
                texts2 = [unicodedata.normalize(normalize, x) for x in texts] if normalize else texts
                m = bpe.train_bpe_hf(texts2, n, p)
                log("BPE (HF tokenizers%s): %d merges in %.1fs" % ("" if p == pat else ", Han-less pattern",
                                                                  len(m), time.time() - t))
                return m, "hf-tokenizers"
            except Exception as e:  # noqa: BLE001 — fall back to the pure-Python trainer
                log("HF BPE trainer failed (%s: %s)" % (type(e).__name__, e))
    t = time.time()
    got, sub = 0, []
    for x in texts:
        sub.append(x)
        got += len(x)
        if got >= sample_py:
            break
    counts = bpe.word_counts(sub, pat, normalize)
    m = bpe.train_bpe_python(counts, n)
    log("BPE (python): %d merges in %.1fs" % (len(m), time.time() - t))
    return m, "python"


def encode_all(docs, toks, pat, specials, normalize=None, procs=16):
    """List of id lists. tiktoken when present (the engine's algorithm, fast); else RankBPE in a process pool."""
    texts = [t for _, t in docs]
    if normalize is None:
        fe = bpe.fast_encoder(toks, pat, specials)
        if fe is not None:
            return fe.encode_ordinary_batch(texts, num_threads=procs), "tiktoken"
    enc = bpe.RankBPE(toks, pat, specials, normalize)
    if len(texts) < 64:
        return [enc.encode(t) for t in texts], "python"
    import multiprocessing as mp
    global _POOL_ENC
    _POOL_ENC = enc
    with mp.get_context("fork").Pool(procs) as pool:
        out = pool.map(_enc_one, texts, chunksize=16)
    return out, "python"


_POOL_ENC = None


def _enc_one(t):
    return _POOL_ENC.encode(t)


# ---------------------------------------------------------------------------------------------- data

class Stream:
    """Concatenated token ids (+ loss mask) with the offsets where documents start."""

    def __init__(self, seqs, sep, masks=None):
        ids, starts, mask = [], [], []
        for i, s in enumerate(seqs):
            starts.append(len(ids))
            ids.extend(s)
            ids.append(sep)
            if masks is not None:
                mask.extend(masks[i])
                mask.append(1)
        self.ids = torch.tensor(ids, dtype=torch.int32)
        self.mask = torch.tensor(mask, dtype=torch.bool) if masks is not None else None
        self.starts = torch.tensor(starts, dtype=torch.int64)

    def to(self, d):
        self.ids = self.ids.to(d)
        self.starts = self.starts.to(d)
        if self.mask is not None:
            self.mask = self.mask.to(d)
        return self

    def batch(self, B, T, g, doc_frac=0.5):
        n = self.ids.numel()
        nd = int(B * doc_frac)
        r = torch.randint(0, max(1, n - T - 1), (B - nd,), generator=g)
        s = self.starts[torch.randint(0, len(self.starts), (nd,), generator=g)].cpu().clamp(max=n - T - 1)
        off = torch.cat([r, s]).to(self.ids.device)
        idx = off.unsqueeze(1) + torch.arange(T + 1, device=self.ids.device)
        x = self.ids[idx].long()
        m = self.mask[idx[:, 1:]] if self.mask is not None else None
        return x[:, :-1], x[:, 1:], m


def lm_loss(logits, y, mask=None):
    l = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
    if mask is None:
        return l.mean()
    m = mask.reshape(-1).float()
    return (l * m).sum() / m.sum().clamp(min=1)


@torch.no_grad()
def eval_loss(model, stream, T, max_tokens, B=16):
    """Mean next-token loss over consecutive windows of the held-out stream."""
    model.eval()
    tot, n = 0.0, 0
    ids = stream.ids
    pos = 0
    while n < max_tokens and pos + T + 1 <= ids.numel():
        rows = []
        for _ in range(B):
            if pos + T + 1 > ids.numel():
                break
            rows.append(ids[pos:pos + T + 1])
            pos += T
        x = torch.stack(rows).long()
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=x.device.type == "cuda"):
            logits = model(x[:, :-1])
        l = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        tot += float(l)
        n += x[:, 1:].numel()
    model.train()
    return tot / max(n, 1), n


def lr_at(step, frac, peak, warm):
    w = min(1.0, (step + 1) / warm)
    return peak * w * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def make_opt(model, lr, wd=0.1):
    decay, no = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and "embed" not in n and "conv1d" not in n else no).append(p)
    kw = dict(lr=lr, betas=(0.9, 0.95), eps=1e-8)
    if torch.cuda.is_available():
        kw["fused"] = True
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no, "weight_decay": 0.0}], **kw)


# ---------------------------------------------------------------------------------------------- generation

@torch.no_grad()
def greedy(model, ids, n, stop=()):
    model.eval()
    x = torch.tensor([ids], device=next(model.parameters()).device)
    out = []
    for _ in range(n):
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=x.device.type == "cuda"):
            nxt = int(model(x)[0, -1].float().argmax())
        out.append(nxt)
        if nxt in stop:
            break
        x = torch.cat([x, torch.tensor([[nxt]], device=x.device)], 1)
    return out


@torch.no_grad()
def greedy_batch(model, x, n):
    """x [B,T] (same-length prompts) -> [B,T+n] greedy, recomputing the whole prefix each step."""
    model.eval()
    for _ in range(n):
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=x.device.type == "cuda"):
            nxt = model(x)[:, -1].float().argmax(-1, keepdim=True)
        x = torch.cat([x, nxt], 1)
    return x


def ds_prompts(args, P, train_st, pairs, chat, chat_lengths=8):
    """The prompts whose greedy continuations DSpark learns from: raw [(plen, [G,plen] ids)], --ds-prompts of
    them in equal groups of the --ds-plens lengths, and chat [(plen, rows)], --ds-chat questions of the chat
    pairs (half of them with thinking on).
    Many short continuations rather than few long ones: run 2's 384 x 160 tokens were learnt by heart (training
    accuracy 1.0, held-out acceptance 0.40). Several lengths: a drafter that only ever saw 32-token contexts
    accepts far less after 100-token prompts (bench/results/train.md, "DSpark, run 5"). Distilled on code and
    prose alone, DSpark kept about half its first guesses on chat (bench/results/drafting.md). Chat replies
    come from chat_lengths lengths at most (None: all) because greedy_batch wants equal lengths and a group
    costs about the same whatever its rows: 54 lengths took 388 s on an H100 (bench/results/train.md, run 9)."""
    gsz = args.ds_prompts or P["ds_prompts"]
    plens = [int(x) for x in args.ds_plens.split(",")] if not args.small else [16]
    raw = []
    for gi, plen in enumerate(plens):
        x0, _, _ = train_st.batch(gsz // len(plens), plen, torch.Generator().manual_seed(9 + gi), doc_frac=0.5)
        raw.append((plen, x0.cpu()))
    byl = {}
    for i, (u, _) in enumerate(pairs if args.ds_chat else []):
        ids = chat.prompt(u, thinking=i % 2 == 0)
        if len(ids) + args.ds_chat_new <= 512:
            byl.setdefault(len(ids), []).append(ids)
    out, got = [], 0
    for plen, rows in sorted(byl.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:chat_lengths]:
        rows = rows[:args.ds_chat - got]
        got += len(rows)
        if rows:
            out.append((plen, rows))
    return raw, out


# ---------------------------------------------------------------------------------------------- stages

def stage_failed(name):
    """Records a stage that raised (called from its except clause): the traceback in the log, the name in results."""
    log("%s FAILED:\n%s" % (name, traceback.format_exc()))
    RESULTS.setdefault("failed", []).append(name)


def stage_qwen(args):
    """Parallel process: the Qwen3 drafter's LM training on its own tokenization."""
    global OUT, LOG
    OUT = args.work
    LOG = open(os.path.join(args.work, "qwen_log.txt"), "a")
    d = dev()
    P = plan(args.small)
    if args.chat_frac is not None:
        P["chat_frac"] = args.chat_frac
    data = torch.load(os.path.join(args.work, "qwen_data.pt"))
    st = Stream([], 0)
    st.ids, st.starts, st.mask = data["ids"], data["starts"], None
    st.to(d)
    vst = Stream([], 0)
    vst.ids, vst.starts, vst.mask = data["vids"], data["vstarts"], None
    vst.to(d)
    c = qwen_mod.default_config(data["vocab_size"])
    torch.manual_seed(1)
    model = qwen_mod.Qwen3(c).to(d)
    opt = make_opt(model, 3e-3)
    g = torch.Generator().manual_seed(2)
    t0, step, toks = time.time(), 0, 0
    budget = args.budget
    while time.time() - t0 < budget:
        frac = (time.time() - t0) / budget
        for pg in opt.param_groups:
            pg["lr"] = lr_at(step, frac, 3e-3, 100)
        x, y, _ = st.batch(P["qwen_batch"], P["qwen_seq"], g)
        with torch.autocast(device_type=d, dtype=torch.bfloat16, enabled=d == "cuda"):
            loss = lm_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        toks += x.numel()
        if step % 200 == 0:
            log("qwen step %d loss %.3f %.0f tok/s" % (step, float(loss), toks / (time.time() - t0)))
    vl, vn = eval_loss(model, vst, P["qwen_seq"], P["eval_tokens"] // 2)
    model.cpu()
    torch.save(model.state_dict(), os.path.join(args.work, "qwen_state.pt"))
    json.dump({"steps": step, "tokens": toks, "seconds": time.time() - t0, "val_loss": vl, "val_tokens": vn,
               "config": c}, open(os.path.join(args.work, "qwen_result.json"), "w"))
    log("qwen done: %d steps, %.1fM tokens, val loss %.3f" % (step, toks / 1e6, vl))


def stage_oracle(args):
    """Parallel CPU process: reference logits from Moonshot's modeling code (float64) for the exported model."""
    import oracle
    oracle.run(args.k3src, args.shim, os.path.join(args.work, "models", "default"),
               os.path.join(args.work, "oracle_case"), json.load(open(os.path.join(args.work, "oracle_prompts.json"))))


def main():
    global OUT, WORK, LOG
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=None)
    ap.add_argument("--budget", type=float, default=560)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--stage", default="all")
    ap.add_argument("--k3src", default=None)
    ap.add_argument("--shim", default=None)
    ap.add_argument("--k3-seconds", type=float, default=None)
    ap.add_argument("--resume", default=None, help="models/ folder of an earlier run: continue mini-K3 from it")
    ap.add_argument("--fresh-k3", action="store_true",
                    help="with --resume: keep its vocabularies and Qwen3 drafter, train a new mini-K3 from scratch")
    ap.add_argument("--ds-seconds", type=float, default=100.0, help="most seconds of DSpark distillation")
    ap.add_argument("--ds-prompts", type=int, default=None, help="greedy continuations DSpark learns from")
    ap.add_argument("--batch", type=int, default=None, help="mini-K3 batch rows (default: the plan's)")
    ap.add_argument("--only-dspark", action="store_true",
                    help="with --resume: keep its mini-K3 and Qwen3 drafter byte for byte, continue its DSpark only")
    ap.add_argument("--tool-pairs", type=int, default=0, help="tool-call examples in the chat tuning (toolcalls.py)")
    ap.add_argument("--chat-frac", type=float, default=None, help="share of each batch's rows that are chat")
    ap.add_argument("--ds-chat", type=int, default=0,
                    help="chat replies DSpark also learns from: the target's greedy replies to the chat pairs' questions")
    ap.add_argument("--ds-chat-new", type=int, default=96, help="tokens of each of those replies")
    ap.add_argument("--ds-greedy", default=None,
                    help="DSpark's greedy sequences from a file (engine_greedy.py) instead of generating them")
    ap.add_argument("--ds-plens", default="32",
                    help="prompt lengths of DSpark's greedy continuations, comma-separated (equal groups)")
    ap.add_argument("--no-acceptance", action="store_true",
                    help="skip the torch acceptance measurements (the engine measures the drafter afterwards): "
                         "their greedy generation took 208 s of run 10's 450")
    args = ap.parse_args()
    if args.stage == "qwen":
        return stage_qwen(args)
    if args.stage == "oracle":
        return stage_oracle(args)
    OUT = args.out
    WORK = args.work or os.path.join(args.out, "work")
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(WORK, exist_ok=True)
    LOG = open(os.path.join(OUT, "log.txt"), "a")
    P = plan(args.small)
    deadline = T0 + args.budget
    d = dev()
    torch.manual_seed(0)
    random.seed(0)
    if d == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    log("device", d, torch.__version__, "budget %.0fs" % args.budget)
    RESULTS["device"] = torch.cuda.get_device_name(0) if d == "cuda" else "cpu"
    RESULTS["torch"] = torch.__version__

    # ---- corpus
    train_docs, valid_docs, manifest = corpus_mod.build(P["corpus_bytes"], P["per_dist"], log=log)
    random.Random(0).shuffle(train_docs)
    json.dump(manifest, open(os.path.join(OUT, "corpus_manifest.json"), "w"), indent=1)
    RESULTS["corpus"] = {"train_files": len(train_docs), "valid_files": len(valid_docs),
                         "train_chars": sum(len(t) for _, t in train_docs),
                         "valid_chars": sum(len(t) for _, t in valid_docs),
                         "distributions": len(manifest["kept"]), "skipped_distributions": len(manifest["skipped"])}
    save_results()

    # ---- tokenizers
    sample, got = [], 0
    for _, t in train_docs:
        sample.append(t)
        got += len(t)
        if got >= P["bpe_sample"]:
            break
    mdir = os.path.join(WORK, "models")
    k3dir, dsdir, qdir = (os.path.join(mdir, x) for x in ("default", "default-dspark", "default-qwen3-drafter"))
    cont = args.resume and not args.fresh_k3       # continue mini-K3's weights (else only the vocabularies)
    if args.resume:                 # a finished run's vocabularies and Qwen3 drafter (and maybe its mini-K3)
        import shutil
        shutil.rmtree(mdir, ignore_errors=True)
        shutil.copytree(args.resume, mdir)
        k3_toks, (q_toks, q_merges) = bpe.read_kimi_ranks(k3dir), bpe.read_hf_bpe(qdir)
        how = qhow = "resumed from " + args.resume
    else:
        k3_merges, how = train_merges(sample, P["k3_ranks"] - 256, bpe.KIMI_PAT, None, P["bpe_py"])
        k3_toks = bpe.ranks_from_merges(k3_merges)
        q_merges, qhow = train_merges(sample, P["qwen_ranks"] - 256 + 300, bpe.QWEN_PAT, "NFC", P["bpe_py"])
        q_merges = bpe.filter_merges(q_merges, P["qwen_ranks"] - 256)
        q_toks = bpe.ranks_from_merges(q_merges)
        bpe.write_kimi_tokenizer(k3dir, k3_toks)
        bpe.write_qwen_tokenizer(qdir, q_toks, q_merges)
    N, NQ = len(k3_toks), len(q_toks)
    specials = bpe.k3_specials(N)
    EOS, EOM, BOS, PAD = N + 1, N + 2, N, N + 255
    qspecial = {s: NQ + i for i, s in enumerate(bpe.QWEN_SPECIALS)}
    RESULTS["tokenizers"] = {"k3": {"ranks": N, "vocab_size": N + 256, "trainer": how},
                             "qwen": {"ranks": NQ, "specials": len(bpe.QWEN_SPECIALS), "trainer": qhow}}
    # check: rank encoding == the BPE that produced it (HF's own model, where it trained), on held-out text
    py_k3 = bpe.RankBPE(k3_toks, bpe.KIMI_PAT, specials)
    py_q = bpe.RankBPE(q_toks, bpe.QWEN_PAT, qspecial, "NFC")
    checks = {}
    vtexts = [t for _, t in valid_docs[:40]]
    fe = bpe.fast_encoder(k3_toks, bpe.KIMI_PAT, specials)
    if fe is not None:
        a = [fe.encode_ordinary(t) for t in vtexts]
        b = [py_k3.encode(t) for t in vtexts]
        checks["k3_tiktoken_eq_python"] = sum(x == y for x, y in zip(a, b)) / max(1, len(a))
    try:
        from tokenizers import Tokenizer
        hq = Tokenizer.from_file(os.path.join(qdir, "tokenizer.json"))
        a = [hq.encode(t, add_special_tokens=False).ids for t in vtexts]
        b = [py_q.encode(t) for t in vtexts]
        checks["qwen_hf_eq_python"] = sum(x == y for x, y in zip(a, b)) / max(1, len(a))
    except Exception as e:  # noqa: BLE001
        checks["qwen_hf_error"] = repr(e)[:200]
    RESULTS["tokenizers"]["checks"] = checks
    samples = [{"text": t[:3000], "k3": py_k3.encode(t[:3000]), "qwen": py_q.encode(t[:3000])} for t in vtexts[:12]]
    json.dump(samples, open(os.path.join(WORK, "tok_samples.json"), "w"))
    log("tokenizers: K3 %d ranks, Qwen %d ranks; checks %s" % (N, NQ, checks))
    save_results()

    # ---- token streams
    t = time.time()
    tr_ids, encw = encode_all(train_docs, k3_toks, bpe.KIMI_PAT, specials)
    va_ids, _ = encode_all(valid_docs, k3_toks, bpe.KIMI_PAT, specials)
    train_st, valid_st = Stream(tr_ids, EOS), Stream(va_ids, EOS)
    log("K3 tokens: train %.1fM valid %.2fM (%s, %.1fs, %.2f chars/token)" % (
        train_st.ids.numel() / 1e6, valid_st.ids.numel() / 1e6, encw, time.time() - t,
        RESULTS["corpus"]["train_chars"] / max(1, train_st.ids.numel())))
    chat = bpe.K3Chat(lambda s: py_k3.encode(s) if len(s) < 64 else (fe.encode_ordinary(s) if fe else py_k3.encode(s)), N)
    pairs = corpus_mod.chat_pairs(train_docs[: len(train_docs) // (4 if cont else 2)],
                                   limit=20000 if not args.small else 200)
    cseqs, cmasks = [], []
    for i, (u, a) in enumerate(pairs):
        th = i % 2 == 0
        p = chat.prompt(u, thinking=th)
        r = chat.reply(a, thinking=th)
        cseqs.append(p + r)
        cmasks.append([0] * len(p) + [1] * len(r))
    if args.tool_pairs:             # tool calls: call when a declared tool serves, answer from its result
        import toolcalls
        for ids, mask in toolcalls.examples(chat, args.tool_pairs, 11, plain_pairs=pairs[:4000]):
            cseqs.append(ids)
            cmasks.append(mask)
        log("tool-call examples: %d" % args.tool_pairs)
    chat_st = Stream(cseqs, EOS, cmasks) if cseqs else None
    RESULTS["data"] = {"train_tokens": train_st.ids.numel(), "valid_tokens": valid_st.ids.numel(),
                       "chat_pairs": len(pairs), "chat_tokens": chat_st.ids.numel() if chat_st else 0,
                       "encoder": encw}
    log("chat pairs: %d (%d tokens)" % (len(pairs), RESULTS["data"]["chat_tokens"]))
    save_results()
    if args.stage == "ds-prompts":  # for engine_greedy.py: DSpark's prompts, the engine continues them
        # every length (the engine needs no equal ones) and the chat pairs of all the training files
        raw, chat_rows = ds_prompts(args, P, train_st, corpus_mod.chat_pairs(train_docs, limit=20000), chat, None)
        json.dump({"new": P["ds_new"], "chat_new": args.ds_chat_new,
                   "raw": [{"plen": plen, "prompts": x0.tolist()} for plen, x0 in raw],
                   "chat": [{"plen": plen, "prompts": rows} for plen, rows in chat_rows]},
                  open(os.path.join(OUT, "ds_prompts.json"), "w"))
        log("DSpark prompts: %d raw, %d chat -> %s" % (sum(len(x) for _, x in raw),
                                                        sum(len(r) for _, r in chat_rows), OUT))
        return

    # ---- the Qwen3 drafter trains in a parallel process meanwhile
    t = time.time()
    qdocs, got = [], 0
    if args.resume:
        qdocs = []
    for doc in train_docs:                       # the small drafter needs less text than mini-K3
        qdocs.append(doc)
        got += len(doc[1])
        if got >= 60_000_000:
            break
    if args.resume:
        pass
    elif d == "cuda":
        try:
            from tokenizers import Tokenizer
            hq = Tokenizer.from_file(os.path.join(qdir, "tokenizer.json"))
            qtr = [e.ids for e in hq.encode_batch([x for _, x in qdocs], add_special_tokens=False)]
            qva = [e.ids for e in hq.encode_batch([x for _, x in valid_docs], add_special_tokens=False)]
            qenc = "hf-tokenizers"
        except Exception:  # noqa: BLE001
            qtr, _ = encode_all(qdocs, q_toks, bpe.QWEN_PAT, qspecial, "NFC")
            qva, _ = encode_all(valid_docs, q_toks, bpe.QWEN_PAT, qspecial, "NFC")
            qenc = "python"
    else:
        qtr, _ = encode_all(qdocs, q_toks, bpe.QWEN_PAT, qspecial, "NFC")
        qva, _ = encode_all(valid_docs, q_toks, bpe.QWEN_PAT, qspecial, "NFC")
        qenc = "python"
    if not args.resume:
        qst, qvst = Stream(qtr, NQ), Stream(qva, NQ)       # <|endoftext|> between documents
        torch.save({"ids": qst.ids, "starts": qst.starts, "vids": qvst.ids, "vstarts": qvst.starts,
                "vocab_size": QWEN_VOCAB if not args.small else NQ + 32}, os.path.join(WORK, "qwen_data.pt"))
        RESULTS["data"]["qwen_train_tokens"] = qst.ids.numel()
        RESULTS["data"]["qwen_encoder"] = qenc
        log("Qwen tokens: train %.1fM (%s, %.1fs)" % (qst.ids.numel() / 1e6, qenc, time.time() - t))
    if args.only_dspark and not (args.resume and not args.fresh_k3):
        raise SystemExit("--only-dspark continues a resumed run's DSpark: give --resume, not --fresh-k3")
    k3_seconds = 0.0 if args.only_dspark else args.k3_seconds or max(30.0, (deadline - time.time()) * 0.62)
    qwen_seconds = k3_seconds * 0.9
    qproc = None
    if not args.resume:
        qproc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--stage", "qwen", "--out", OUT,
                                  "--work", WORK, "--budget", str(qwen_seconds)] + (["--small"] if args.small else []))

    # ---- mini-K3
    cfg = k3model.default_config()
    cfg.update(vocab_size=N + 256, bos_token_id=BOS, eos_token_id=EOM, pad_token_id=PAD,
               media_placeholder_token_id=N + 21)
    if args.small:
        cfg.update(hidden_size=64, kda_heads=2, kda_head_dim=32, num_attention_heads=2, q_lora_rank=32,
                   kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=32, intermediate_size=128,
                   num_experts=16, num_experts_per_token=4, routed_expert_hidden_size=32, moe_intermediate_size=32)
    model = k3model.MiniK3(cfg).to(d) if not cont else k3model.load_exported(k3dir, cfg, d)
    total, experts = k3model.count_params(model)
    RESULTS["mini_k3"] = {"config": cfg, "params": total, "expert_params": experts}
    log("mini-K3: %.2fM params (%.2fM in routed experts)" % (total / 1e6, experts / 1e6))
    train_st.to(d)
    valid_st.to(d)
    if chat_st:
        chat_st.to(d)
    B, T = args.batch or P["batch"], P["seq"]
    peak, warm = (2e-3, max(20, 150 * 64 // B)) if not cont else (1e-3, 50)   # warmup: ~5 M tokens
    opt = make_opt(model, peak)
    g = torch.Generator().manual_seed(3)
    nchat = max(1, int(round(B * P["chat_frac"]))) if chat_st else 0
    t_start = time.time()
    step, toks, qat_on = 0, 0, False
    if cont:                        # the experts are on the MXFP4 grid already: keep them there
        model.set_qat(True)
        qat_on = True
        RESULTS["mini_k3"]["resumed_from"] = args.resume
    RESULTS["mini_k3"]["batch"] = [B, T]
    hist = []
    last_eval = time.time()
    while True:
        el = time.time() - t_start
        if el >= k3_seconds:
            break
        frac = el / k3_seconds
        if not qat_on and frac >= 0.86:
            model.set_qat(True)
            qat_on = True
            RESULTS["mini_k3"]["qat_from_step"] = step
            log("QAT on (MXFP4 fake-quant of routed experts) at step %d" % step)
        lr = lr_at(step, frac, peak, warm)
        for pg in opt.param_groups:
            pg["lr"] = lr
        x, y, _ = train_st.batch(B - nchat, T, g)
        if nchat:                   # chat rows ride in the same batch, loss on the replies only
            xc, yc, mc = chat_st.batch(nchat, T, g, doc_frac=1.0)
            x, y = torch.cat([x, xc]), torch.cat([y, yc])
        with torch.autocast(device_type=d, dtype=torch.bfloat16, enabled=d == "cuda"):
            logits = model(x)
            loss = lm_loss(logits[:B - nchat], y[:B - nchat])
            if nchat:
                closs = lm_loss(logits[B - nchat:], yc, mc)
                tot = loss * (B - nchat) / B + closs * nchat / B
            else:
                tot = loss
        opt.zero_grad(set_to_none=True)
        tot.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.update_router_bias(1e-3)
        step += 1
        toks += B * T
        if step % 50 == 0 or step == 1:
            rate = toks / (time.time() - t_start)
            log("step %d loss %.3f%s lr %.2e gn %.2f %.0f tok/s" % (
                step, float(loss), (" chat %.3f" % float(closs)) if nchat else "", lr, float(gn), rate))
            hist.append([step, round(time.time() - t_start, 1), float(loss)])
        if time.time() - last_eval > 75:
            vl, _ = eval_loss(model, valid_st, T, 65536)
            log("  val loss %.3f (ppl %.1f)" % (vl, math.exp(vl)))
            hist.append([step, round(time.time() - t_start, 1), float(loss), vl])
            last_eval = time.time()
    if not qat_on:
        model.set_qat(True)
    RESULTS["mini_k3"].update(steps=step, tokens=toks, seconds=round(time.time() - t_start, 1), history=hist)
    loads = [m.last_load.tolist() for m in model.moe_layers() if m.last_load is not None]
    RESULTS["mini_k3"]["last_batch_expert_load_minmax"] = [[min(l), max(l)] for l in loads]

    # ---- export and check what was exported (--only-dspark: the resumed export stays as it was)
    if not args.only_dspark:
        k3model.export(model, cfg, k3dir)
    model = k3model.load_exported(k3dir, cfg, d)
    model.set_qat(False)
    vl, vn = eval_loss(model, valid_st, T, P["eval_tokens"])
    RESULTS["mini_k3"].update(val_loss=vl, val_ppl=math.exp(vl), val_tokens=vn)
    RESULTS["mini_k3"]["file_bytes"] = os.path.getsize(os.path.join(k3dir, "model.safetensors"))
    log("exported mini-K3: val loss %.3f ppl %.2f over %d held-out tokens" % (vl, math.exp(vl), vn))
    sample_prompts = ["def fibonacci(n):", "import numpy as np\n", "class Stack:\n    def __init__(self):",
                      "The following example shows how to", "# Installation\n\nTo install the package,"]
    samp = []
    for s in sample_prompts:
        ids = py_k3.encode(s)
        out = greedy(model, ids, 40, stop=(EOS, EOM))
        samp.append({"prompt": s, "ids": ids, "greedy": out, "text": py_k3.decode(out)})
        log("sample %r -> %r" % (s, py_k3.decode(out)))
    for q in ["Write a Python function `reverse_string` that returns the string reversed.",
              "What does the Python function `mean` do?"]:
        ids = chat.prompt(q, thinking=True)
        out = greedy(model, ids, 60, stop=(EOM, EOS))
        samp.append({"chat": q, "ids": ids, "greedy": out, "text": py_k3.decode(out)})
        log("chat %r -> %r" % (q, py_k3.decode(out)))
    if args.tool_pairs:             # does it call a declared tool, with the argument from the question?
        import toolcalls
        tools = [toolcalls.schema(t) for t in toolcalls.TOOLS[:2]]
        for q, th in [("What's the weather like in Paris?", True), ("What is the weather in Oslo?", False),
                      ("Search the web for numpy broadcasting.", True)]:
            ids = chat.prompt(q, thinking=th, tools=tools)
            out = greedy(model, ids, 80, stop=(EOM, EOS))
            samp.append({"tool_chat": q, "thinking": th, "ids": ids, "greedy": out, "text": py_k3.decode(out)})
            log("tool chat %r -> %r" % (q, py_k3.decode(out)))
    RESULTS["samples"] = samp
    save_results()
    pack()

    # ---- reference logits from Moonshot's code, in parallel on the CPU
    oproc = None
    if args.k3src and args.shim and not args.only_dspark:
        oprompts = [py_k3.encode('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:'),
                    py_k3.encode("The module provides a simple way to read and write configuration files. "
                                 "It supports sections, comments and"),
                    chat.prompt("Write a Python function that adds two numbers.", thinking=True)]
        json.dump(oprompts, open(os.path.join(WORK, "oracle_prompts.json"), "w"))
        oproc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--stage", "oracle", "--out", OUT,
                                  "--work", WORK, "--k3src", args.k3src, "--shim", args.shim])

    drafter = qmodel = seqs = None
    taps_ids = dspark_mod.default_config(cfg, 0, 0)["target_layer_ids"]
    embed = model.model.embed_tokens.weight.detach()
    lm_head = model.lm_head.weight.detach()
    def dspark_steps(drafter, full, p):
        """DSpark's greedy verification of the target's own sequence full [L] from position p on (the anchor
        the newest target token; draft a block; accept the agreeing prefix, the target adds its own token):
        verify steps, draft tokens accepted, and steps whose first draft was kept."""
        with torch.no_grad(), torch.autocast(device_type=d, dtype=torch.bfloat16, enabled=d == "cuda"):
            _, taps = model.hidden(full.unsqueeze(0), taps=set(taps_ids))
            ctx = drafter.context(torch.cat([taps[j] for j in taps_ids], -1).float())[0]
        steps = accepted = first = 0
        while p < full.numel() - 1:
            with torch.autocast(device_type=d, dtype=torch.bfloat16, enabled=d == "cuda"):
                dr = drafter.draft(ctx, p, int(full[p]), embed, lm_head)
            a = 0
            while a < len(dr) and p + 1 + a < full.numel() and dr[a] == int(full[p + 1 + a]):
                a += 1
            steps += 1
            accepted += a
            first += a > 0
            p += a + 1
        return steps, accepted, first

    continuations = {}

    def target_continuation(prompt, n):
        """prompt [1,T] -> the target's greedy continuation [T+n], made once per prompt: --only-dspark measures
        before and after training, and torch's generation (prompt by prompt, the whole prefix each token) took
        208 s of run 10's H100 call before training alone (bench/results/train.md)."""
        key = (tuple(prompt[0].tolist()), n)
        if key not in continuations:
            continuations[key] = greedy_batch(model, prompt, n)[0]
        return continuations[key]

    def measure_acceptance(drafter, qmodel, plen_a):
        """Greedy verification of the target's own continuation of held-out prompts of plen_a tokens:
        per drafter, verify steps and the draft tokens they accept (tokens_per_step adds the target's own)."""
        va = valid_st.ids
        na = P["acc_prompts"]
        offs = valid_st.starts[torch.linspace(0, len(valid_st.starts) - 1, na).long()].tolist()
        acc = {"dspark": [], "qwen": []}
        for o in offs:
            if o + plen_a > va.numel():
                continue
            prompt = va[o:o + plen_a].long().unsqueeze(0)
            full = target_continuation(prompt, P["acc_new"])                      # target's greedy continuation
            if drafter is not None:
                steps, accepted, _ = dspark_steps(drafter, full, plen_a)
                acc["dspark"].append((accepted, steps))
            # Qwen3 (cross-tokenizer): draft 5 Qwen tokens from the text so far, re-tokenize with K3's tokenizer
            p = plen_a
            steps = accepted = 0
            fl = full.tolist()
            while qmodel is not None and p < len(fl) - 1:
                ctx_text = py_k3.decode(fl[:p + 1])
                qids = py_q.encode(ctx_text)[-400:]
                qnew = greedy(qmodel, qids, 5)
                dtext = py_q.decode_bytes(qnew).decode("utf-8", errors="ignore")
                k3ids = py_k3.encode(ctx_text + dtext)
                common = 0
                while common < min(len(k3ids), p + 1) and k3ids[common] == fl[common]:
                    common += 1
                a = 0
                if common == p + 1:
                    dr = k3ids[p + 1:p + 1 + 7]
                    while a < len(dr) and p + 1 + a < len(fl) and dr[a] == fl[p + 1 + a]:
                        a += 1
                steps += 1
                accepted += a
                p += a + 1
            acc["qwen"].append((accepted, steps))
        res = {}
        for k, v in acc.items():
            A_, S_ = sum(x for x, _ in v), sum(s for _, s in v)
            res[k] = {"prompts": len(v), "verify_steps": S_, "accepted_draft_tokens": A_,
                      "mean_accepted_per_step": A_ / max(1, S_), "mean_tokens_per_step": (A_ + S_) / max(1, S_)}
        res["prompt_tokens"] = plen_a
        return res

    CHAT_HELD_OUT = ["Write a Python function that reverses a linked list.",           # bench_draft.sh's three
                     "Explain what a Python generator is, with an example.",
                     "How do I read a CSV file in Python and sum one of its columns?"]

    def measure_chat(drafter):
        """DSpark's greedy verification of the target's own 128-token replies to held-out chat questions:
        bench_draft.sh's three (thinking on, as `run --chat`) and 16 of the validation files' chat pairs."""
        qs = [(q, True) for q in CHAT_HELD_OUT]
        qs += [(u, i % 2 == 0) for i, (u, _) in enumerate(corpus_mod.chat_pairs(valid_docs, limit=16))]
        steps = accepted = first = 0
        for q, th in qs:
            prompt = torch.tensor([chat.prompt(q, thinking=th)], dtype=torch.long, device=d)
            full = target_continuation(prompt, 128)
            s_, a_, f_ = dspark_steps(drafter, full, prompt.shape[1])
            steps, accepted, first = steps + s_, accepted + a_, first + f_
        return {"prompts": len(qs), "verify_steps": steps, "accepted_draft_tokens": accepted,
                "mean_accepted_per_step": accepted / max(1, steps), "first_guess_kept": first / max(1, steps)}

    # ---- DSpark: distilled from mini-K3's own greedy continuations
    try:
        t = time.time()
        dcfg = dspark_mod.default_config(cfg, N + bpe.K3_MASK_OFFSET, EOM)
        if args.small:
            dcfg.update(intermediate_size=128, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=32,
                        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=32, markov_rank=8)
        taps_ids = dcfg["target_layer_ids"]
        if args.ds_greedy:          # the engine's own greedy sequences (engine_greedy.py), prompts included
            gj = json.load(open(args.ds_greedy))
            raw_seqs = [(g["plen"], torch.tensor(g["seqs"], dtype=torch.long)) for g in gj["raw"]]
            chat_seqs = [(g["plen"], torch.tensor(g["seqs"], dtype=torch.long)) for g in gj["chat"]]
            log("DSpark data from %s" % args.ds_greedy)
        else:
            raw_p, chat_p = ds_prompts(args, P, train_st, pairs, chat)
            raw_seqs = [(plen, torch.cat([greedy_batch(model, x0[i:i + 512].to(d), P["ds_new"])
                                          for i in range(0, len(x0), 512)])) for plen, x0 in raw_p]
            chat_seqs = [(plen, torch.cat([greedy_batch(model, torch.tensor(rows[i:i + 512], dtype=torch.long,
                                                                            device=d), args.ds_chat_new)
                                           for i in range(0, len(rows), 512)])) for plen, rows in chat_p]

        def ds_group(parts, is_raw):
            """[(plen, seqs [G,plen+new])] -> (seqs [G,L], the taps of target_layer_ids concatenated [G,L,n*H],
            the target's logits [G,L,V], each row's anchor range lo, hi [G]). Rows of unequal length are
            padded at the end: an anchor's block ends inside its row, and DSpark's context is causal."""
            L = max(x.shape[1] for _, x in parts)
            seqs = torch.cat([F.pad(x, (0, L - x.shape[1]), value=PAD) for _, x in parts]).to(d)
            # --only-dspark: raw anchors from the 8th token on, inside the prompt too; chat ones in the reply
            lo = torch.cat([torch.full((x.shape[0],), min(8, plen - 1) if args.only_dspark and is_raw else plen - 1)
                            for plen, x in parts])
            hi = torch.cat([torch.full((x.shape[0],), x.shape[1] - K - 1) for _, x in parts])
            with torch.no_grad():
                feats, tlog = [], []
                for i in range(0, seqs.shape[0], 256):
                    with torch.autocast(device_type=d, dtype=torch.bfloat16, enabled=d == "cuda"):
                        hN, taps = model.hidden(seqs[i:i + 256], taps=set(taps_ids))
                        feats.append(torch.cat([taps[j] for j in taps_ids], -1).to(torch.bfloat16))
                        tlog.append(model.lm_head(hN).to(torch.bfloat16))
            return seqs, torch.cat(feats), torch.cat(tlog), lo.to(d), hi.to(d)

        K = dcfg["block_size"]
        plens = [plen for plen, _ in raw_seqs]
        groups = [ds_group([g], True) for g in raw_seqs]                  # a group per prompt length
        log("DSpark data: %d sequences x %d tokens (%.1fs)" % (
            sum(g[0].shape[0] for g in groups), groups[0][0].shape[1], time.time() - t))
        chat_groups = [ds_group(chat_seqs, False)] if chat_seqs else []   # one, its rows padded
        if chat_groups:
            log("DSpark chat data: %d replies, %d prompt lengths (%.1fs)" % (
                chat_groups[0][0].shape[0], len(chat_seqs), time.time() - t))
        seqs = groups[0][0]                                                       # what the Qwen3 re-tune reads
        init = os.path.join(dsdir, "model.safetensors")
        ds_from = args.resume if cont and os.path.exists(init) else None     # continue the earlier drafter
        drafter = (dspark_mod.load(dsdir, dcfg) if ds_from else dspark_mod.DSpark(dcfg)).to(d)
        dparams = sum(p.numel() for p in drafter.parameters())
        dopt = make_opt(drafter, 2e-3)
        if args.only_dspark and not args.no_acceptance:
            RESULTS["acceptance_before"] = {str(n): measure_acceptance(drafter.eval(), None, n) for n in (48, 128)}
            if chat_groups:
                RESULTS["acceptance_before"]["chat"] = measure_chat(drafter)
            log("acceptance before: %s" % json.dumps(RESULTS["acceptance_before"]))
            drafter.train()
        # (the rest of the budget is for the measurements after, unless they are skipped)
        ds_seconds = max(20.0, min(args.ds_seconds, (deadline - time.time()) * (0.9 if args.no_acceptance else 0.6)))
        dt0, dstep = time.time(), 0
        gen = torch.Generator(device="cpu").manual_seed(5)
        A, Bd = 16, 64 if not args.small else 4
        while time.time() - dt0 < ds_seconds:
            frac = (time.time() - dt0) / ds_seconds
            for pg in dopt.param_groups:
                pg["lr"] = lr_at(dstep, frac, 2e-3, 50)
            if chat_groups and dstep % 2 == 1:      # half the steps on chat replies
                seqs, feats, tlog, lo, hi = chat_groups[0]
            else:
                seqs, feats, tlog, lo, hi = groups[(dstep // (2 if chat_groups else 1)) % len(groups)]
            bi = torch.randint(0, seqs.shape[0], (Bd,), generator=gen).to(d)
            # anchors uniform in each row's range [lo, hi); each position's target with --only-dspark is
            # the target model's own argmax there (what greedy verification accepts)
            u = torch.rand((Bd, A), generator=gen).to(d)
            p = lo[bi, None] + (u * (hi[bi] - lo[bi])[:, None]).long()
            s, f, tl = seqs[bi], feats[bi], tlog[bi]
            ar = torch.arange(K, device=d)
            pos = p.unsqueeze(-1) + ar                                            # [Bd,A,K]
            bidx = torch.arange(Bd, device=d).view(Bd, 1, 1)
            inp = torch.full((Bd, A, K), dcfg["mask_token_id"], device=d, dtype=torch.long)
            inp[:, :, 0] = s[bidx[:, :, 0], p]
            tgt = s[bidx, pos + 1]                                                # token at p+k+1
            if args.only_dspark:
                tgt = tl[bidx, pos].argmax(-1)
            prev = s[bidx, pos]                                                   # teacher-forced previous token
            with torch.autocast(device_type=d, dtype=torch.bfloat16, enabled=d == "cuda"):
                ctx = drafter.context(f.float())
                h = drafter.blocks(ctx, p, embed[inp], pos)
                U = h @ lm_head.t().to(h.dtype)
                logits = (U.float() + drafter.markov(prev).float())
                teacher = tl[bidx, pos].float()
                ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
                kl = F.kl_div(logits.log_softmax(-1).reshape(-1, logits.shape[-1]),
                              teacher.log_softmax(-1).reshape(-1, logits.shape[-1]), log_target=True,
                              reduction="batchmean")
                conf_in = torch.cat([h.float(), drafter.markov_head.markov_w1.weight[prev].float()], -1)
                conf = drafter.confidence_head.proj(conf_in).squeeze(-1)
                hit = (logits.argmax(-1) == tgt).float()
                bce = F.binary_cross_entropy_with_logits(conf.float(), hit)
                dl = ce + kl + 0.1 * bce
            dopt.zero_grad(set_to_none=True)
            dl.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
            dopt.step()
            dstep += 1
            if dstep % 100 == 0 or dstep == 1:
                log("dspark step %d ce %.3f kl %.3f acc@k %s" % (dstep, float(ce), float(kl),
                                                                   [round(float(v), 2) for v in hit.mean((0, 1))]))
        dspark_mod.export(drafter, dsdir)
        drafter = dspark_mod.load(dsdir, dcfg).to(d).eval()
        RESULTS["dspark"] = {"config": dcfg, "params": dparams, "steps": dstep, "seconds": round(time.time() - dt0, 1),
                             "initialised_from": ds_from,
                             "train_sequences": sum(int(g[0].shape[0]) for g in groups),
                             "chat_replies": sum(int(g[0].shape[0]) for g in chat_groups),
                             "prompt_lengths": plens,
                             "file_bytes": os.path.getsize(os.path.join(dsdir, "model.safetensors"))}
        save_results()

    except Exception:  # noqa: BLE001 — a failed stage is reported; the others still run
        stage_failed("dspark")
    save_results()
    pack()
    # ---- Qwen3 drafter: join the parallel process, then distil on mini-K3's outputs (as text) briefly
    try:
        if args.only_dspark:  # the resumed Qwen3 drafter stays as it was
            qmodel = None
        else:
            if qproc is None:            # resumed: the earlier run's drafter, re-tuned below on this target's outputs
                qc = qwen_mod.default_config(json.load(open(os.path.join(qdir, "config.json")))["vocab_size"])
                qmodel = qwen_mod.load(qdir, qc).to(d)
                qres = {"resumed_from": args.resume}
            else:
                qproc.wait()
                qres = json.load(open(os.path.join(WORK, "qwen_result.json")))
                qc = qres["config"]
                qmodel = qwen_mod.Qwen3(qc)
                qmodel.load_state_dict(torch.load(os.path.join(WORK, "qwen_state.pt")))
                qmodel.to(d)
            qmodel.train()
            texts = [py_k3.decode(s.tolist()) for s in seqs.cpu()] if seqs is not None else ["x" * 4000]
            qseqs = [py_q.encode(tx) for tx in texts]
            qdist = Stream(qseqs, NQ).to(d)
            qopt = make_opt(qmodel, 5e-4)
            qt0, qstep = time.time(), 0
            q2_seconds = max(5.0, min(30.0, (deadline - time.time()) * 0.2))
            gq = torch.Generator().manual_seed(11)
            while seqs is not None and time.time() - qt0 < q2_seconds:
                x, y, _ = qdist.batch(32 if not args.small else 4, min(128, qdist.ids.numel() // 4), gq)
                with torch.autocast(device_type=d, dtype=torch.bfloat16, enabled=d == "cuda"):
                    ql = lm_loss(qmodel(x), y)
                qopt.zero_grad(set_to_none=True)
                ql.backward()
                qopt.step()
                qstep += 1
            qmodel.eval()
            qwen_mod.export(qmodel, qdir, NQ, NQ + 2, NQ)      # eos <|im_end|>, pad <|endoftext|>
            qres.update(distill_steps=qstep, distill_seconds=round(time.time() - qt0, 1),
                        params=sum(p.numel() for p in qmodel.parameters()),
                        file_bytes=os.path.getsize(os.path.join(qdir, "model.safetensors")))
            qres.pop("config", None)
            RESULTS["qwen_drafter"] = {"config": qc, **qres}
            log("Qwen drafter: %s" % {k: v for k, v in qres.items()})
            save_results()

    except Exception:  # noqa: BLE001 — a failed stage is reported; the others still run
        stage_failed("qwen")
    save_results()
    pack()
    # ---- acceptance on held-out prompts (greedy verification: a draft token counts if it equals the target's)
    if not args.no_acceptance:
        try:
            t = time.time()
            RESULTS["acceptance"] = measure_acceptance(drafter, qmodel, 48 if not args.small else 12)
            RESULTS["acceptance"]["note"] = ("greedy verification of the target's own continuation of held-out prompts; "
                                             "tokens_per_step = accepted drafts + the target's own token")
            if args.only_dspark:
                RESULTS["acceptance_128"] = measure_acceptance(drafter, qmodel, 128 if not args.small else 24)
            if args.ds_chat or args.ds_greedy:
                RESULTS["acceptance_chat"] = measure_chat(drafter)
                log("chat acceptance: %s" % json.dumps(RESULTS["acceptance_chat"]))
            log("acceptance (%.1fs): %s %s" % (time.time() - t, json.dumps(RESULTS["acceptance"]),
                                                json.dumps(RESULTS.get("acceptance_128"))))
            save_results()

        except Exception:  # noqa: BLE001 — a failed stage is reported; the others still run
            stage_failed("acceptance")
        save_results()
        pack()
    # ---- oracle
    if oproc is not None:
        left = max(5.0, T0 + args.budget + 25 - time.time())
        try:
            oproc.wait(timeout=left)
            RESULTS["oracle"] = json.load(open(os.path.join(WORK, "oracle_case", "result.json")))
        except Exception as e:  # noqa: BLE001
            RESULTS["oracle"] = {"error": repr(e)[:300]}
            oproc.kill()
        log("oracle: %s" % RESULTS.get("oracle"))
    RESULTS["wall_seconds"] = round(time.time() - T0, 1)
    save_results()
    pack()


def pack():
    """models + oracle case (minus its copy of the weights) + tokenizer samples -> OUT/bundle.tar.part*"""
    tar = os.path.join(WORK, "bundle.tar")
    with tarfile.open(tar, "w") as tf:
        tf.add(os.path.join(WORK, "models"), "models")
        oc = os.path.join(WORK, "oracle_case")
        if os.path.isdir(oc):
            for f in os.listdir(oc):
                if f != "model.safetensors":
                    tf.add(os.path.join(oc, f), "oracle_case/" + f)
        for f in ("tok_samples.json", "qwen_log.txt", "qwen_result.json"):
            if os.path.exists(os.path.join(WORK, f)):
                tf.add(os.path.join(WORK, f), f)
    data = open(tar, "rb").read()
    for f in os.listdir(OUT):
        if f.startswith("bundle.tar.part"):
            os.unlink(os.path.join(OUT, f))
    part = 15 * 1024 * 1024
    for i in range(0, len(data), part):
        open(os.path.join(OUT, "bundle.tar.part%d" % (i // part)), "wb").write(data[i:i + part])
    log("packed %.1f MB in %d parts" % (len(data) / 1e6, (len(data) + part - 1) // part))


if __name__ == "__main__":
    main()
