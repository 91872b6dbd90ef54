#!/usr/bin/env python3
"""Reference outputs of the bundled DSpark drafter from its own training code, for the engine's tests.

For each prompt (target token ids, given in the input JSON) this runs mini-K3 (models/default) in
float64, takes the taps of the drafter's target_layer_ids (the raw AttnRes prefix leaving each), and
at every anchor position p listed computes the drafter's block in float64: the logits U_k + the Markov
bias of the greedy chain, k = 0 .. block_size - 1, and the drafts. It also measures acceptance as the
training code does (train.py's acceptance stage): the target's greedy continuation of each prompt,
then at each verify step the anchor is the newest target token, the drafter proposes its block, the
agreeing prefix is accepted and the target adds its own token.

usage: dspark_ref.py IN.json OUTDIR
  IN.json: {"prompts": [[ids...], ...], "anchors": [[p, ...], ...], "new": N}
  OUTDIR gets ref.json (ids, anchors, drafts, acceptance) and logits_P_A.f32 ([block][vocab] float32).
Runs on a CPU with torch (Debian's python3-torch is enough); nothing here is part of the engine.
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dspark  # noqa: E402
import k3model  # noqa: E402

ROOT = os.path.join(HERE, "..", "..")


def drafter_config(path, target_cfg):
    j = json.load(open(os.path.join(path, "config.json")))
    c = dspark.default_config(target_cfg, j["mask_token_id"], j["eos_token_id"])
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank",
              "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rms_norm_eps",
              "target_layer_ids", "block_size", "markov_rank", "vocab_size", "target_hidden_size"):
        c[k] = j[k]
    rp = j["rope_parameters"]
    c.update(rope_theta=rp["rope_theta"], rope_factor=rp["factor"], rope_original_max=rp["original_max_position_embeddings"],
             beta_fast=rp["beta_fast"], beta_slow=rp["beta_slow"], mscale=rp["mscale"], mscale_all_dim=rp["mscale_all_dim"])
    return c


def block_logits(dr, ctx, p, anchor, embed, lm_head):
    """drafter.draft() with its logits: [K][V] and the K greedy drafts (the Markov bias in order)."""
    c = dr.c
    K = c["block_size"]
    ids = torch.tensor([anchor] + [c["mask_token_id"]] * (K - 1))
    emb = embed[ids].to(ctx.dtype).view(1, 1, K, -1)
    pos = (p + torch.arange(K)).view(1, 1, K)
    h = dr.blocks(ctx[None, :p], torch.tensor([[p]]), emb, pos)[0, 0]
    U = h @ lm_head.t().to(h.dtype)
    out, rows, prev = [], [], anchor
    for k in range(K):
        row = U[k] + dr.markov(torch.tensor(prev)).to(U.dtype)
        d = int(row.argmax())
        rows.append(row)
        out.append(d)
        prev = d
    return torch.stack(rows), out


def main():
    spec = json.load(open(sys.argv[1]))
    outdir = sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    tcfg = k3model.default_config()
    target = k3model.load_exported(os.path.join(ROOT, "models", "default"), tcfg).double().eval()
    dc = drafter_config(os.path.join(ROOT, "models", "default-dspark"), tcfg)
    dr = dspark.load(os.path.join(ROOT, "models", "default-dspark"), dc).double().eval()
    embed = target.model.embed_tokens.weight.double()
    lm_head = target.lm_head.weight.double()
    taps_ids = dc["target_layer_ids"]
    ref = {"prompts": [], "acceptance": {}}
    acc_steps = acc_accepted = 0
    with torch.no_grad():
        for pi, ids in enumerate(spec["prompts"]):
            full = torch.tensor([ids])
            _, taps = target.hidden(full, taps=set(taps_ids))
            ctx = dr.context(torch.cat([taps[j] for j in taps_ids], -1))[0]
            entry = {"ids": ids, "anchors": [], "drafts": []}
            for p in spec["anchors"][pi]:
                rows, drafts = block_logits(dr, ctx, p, ids[p], embed, lm_head)
                f = f"logits_{pi}_{p}.f32"
                rows.float().numpy().astype("<f4").tofile(os.path.join(outdir, f))
                entry["anchors"].append(p)
                entry["drafts"].append(drafts)
            ref["prompts"].append(entry)
            # acceptance: the target's greedy continuation, drafted and verified step by step
            seq = list(ids)
            for _ in range(spec["new"]):
                lg = target.lm_head(target.hidden(torch.tensor([seq]))[0])[0, -1]
                seq.append(int(lg.argmax()))
            full = torch.tensor([seq])
            _, taps = target.hidden(full, taps=set(taps_ids))
            ctx = dr.context(torch.cat([taps[j] for j in taps_ids], -1))[0]
            p, steps, accepted = len(ids), 0, 0
            while p < len(seq) - 1:
                _, drafts = block_logits(dr, ctx, p, seq[p], embed, lm_head)
                a = 0
                while a < len(drafts) and p + 1 + a < len(seq) and drafts[a] == seq[p + 1 + a]:
                    a += 1
                steps += 1
                accepted += a
                p += a + 1
            entry["continuation"] = seq[len(ids):]
            entry["steps"], entry["accepted"] = steps, accepted
            acc_steps += steps
            acc_accepted += accepted
    ref["acceptance"] = {"verify_steps": acc_steps, "accepted_draft_tokens": acc_accepted,
                         "mean_accepted_per_step": acc_accepted / max(1, acc_steps),
                         "note": "the training code's procedure (train.py, acceptance stage), float64 on a CPU"}
    json.dump(ref, open(os.path.join(outdir, "ref.json"), "w"), indent=1)
    print("acceptance", json.dumps(ref["acceptance"]))


if __name__ == "__main__":
    main()
