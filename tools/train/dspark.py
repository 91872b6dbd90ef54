"""DSpark-style block drafter for mini-K3 (scaled down), our own code.

It reads the raw AttnRes prefix sums that mini-K3 layers `target_layer_ids` return, concatenated per token,
projects them (context_proj) and norms them (context_norm) into one context vector per target-processed token.
Each draft layer writes its context K/V straight from that vector (kv_a -> kv_a_layernorm -> kv_b; k_pe gets
RoPE at the token's position; no input norm and no query for context tokens). A draft pass embeds the anchor
and six mask tokens with the target's embedding, at positions p..p+6, and runs pre-norm layers of DeepSeek-V3
MLA (q_a/q_b, interleaved-pair YaRN RoPE, softmax scale mscale^2/sqrt(q_head_dim), no output gate; the block
attends to all context positions < p and to all 7 block positions, non-causally) and a SiLU MLP; final_norm;
the target's lm_head. A rank-r Markov bias markov_w2 . markov_w1[prev] is added to position k's logits with
prev = the anchor for k = 0 and the previous draft token after that. The confidence head is training-only.
The file holds only the drafter's own tensors: embedding and lm_head are the target's.
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from k3model import Norm
from stio import st_load, st_save


def default_config(target_cfg, mask_token_id, eos_token_id):
    H = target_cfg["hidden_size"]
    return dict(hidden_size=H, intermediate_size=512, num_hidden_layers=2, num_attention_heads=3,
                num_key_value_heads=3, q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32,
                v_head_dim=64, rms_norm_eps=1e-5, target_layer_ids=[0, 2, 4, 6, 7], block_size=7,
                markov_rank=32, vocab_size=target_cfg["vocab_size"], mask_token_id=mask_token_id,
                eos_token_id=eos_token_id, target_hidden_size=H,
                target_num_hidden_layers=target_cfg["num_hidden_layers"],
                rope_theta=50000.0, rope_factor=32.0, rope_original_max=32768, beta_fast=32.0, beta_slow=1.0,
                mscale=1.0, mscale_all_dim=1.0)


def yarn_inv_freq(c):
    dim, base, f = c["qk_rope_head_dim"], c["rope_theta"], c["rope_factor"]
    orig = c["rope_original_max"]
    ext = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inter = ext / f

    def corr_dim(nrot):
        return dim * math.log(orig / (nrot * 2 * math.pi)) / (2 * math.log(base))

    lo = max(math.floor(corr_dim(c["beta_fast"])), 0)
    hi = min(math.ceil(corr_dim(c["beta_slow"])), dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    keep = 1.0 - ramp                                  # 1: extrapolate (high frequency), 0: interpolate
    return inter * (1 - keep) + ext * keep


def yarn_mscale(scale, m):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def rope_interleaved(x, pos, inv_freq):
    """x [..., T, d] with pairs (2i, 2i+1) rotated by pos * inv_freq[i]; pos broadcastable to [..., T]."""
    ang = pos.to(torch.float64).unsqueeze(-1) * inv_freq.to(pos.device)        # [..., T, d/2]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)


def lin(i, o, bias=False):
    return nn.Linear(i, o, bias=bias)


class DLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, nh = c["hidden_size"], c["num_attention_heads"]
        self.input_layernorm, self.post_attention_layernorm = Norm(H, c["rms_norm_eps"]), Norm(H, c["rms_norm_eps"])
        sa = nn.Module()
        sa.q_a_proj = lin(H, c["q_lora_rank"])
        sa.q_a_layernorm = Norm(c["q_lora_rank"], c["rms_norm_eps"])
        sa.q_b_proj = lin(c["q_lora_rank"], nh * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]))
        sa.kv_a_proj_with_mqa = lin(H, c["kv_lora_rank"] + c["qk_rope_head_dim"])
        sa.kv_a_layernorm = Norm(c["kv_lora_rank"], c["rms_norm_eps"])
        sa.kv_b_proj = lin(c["kv_lora_rank"], nh * (c["qk_nope_head_dim"] + c["v_head_dim"]))
        sa.o_proj = lin(nh * c["v_head_dim"], H)
        self.self_attn = sa
        mlp = nn.Module()
        mlp.gate_proj, mlp.up_proj = lin(H, c["intermediate_size"]), lin(H, c["intermediate_size"])
        mlp.down_proj = lin(c["intermediate_size"], H)
        self.mlp = mlp


class DSpark(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        H, R, V = c["hidden_size"], c["markov_rank"], c["vocab_size"]
        self.context_proj = lin(len(c["target_layer_ids"]) * c["target_hidden_size"], H)
        self.context_norm = Norm(H, c["rms_norm_eps"])
        self.final_norm = Norm(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList([DLayer(c) for _ in range(c["num_hidden_layers"])])
        mh = nn.Module()
        mh.markov_w1 = lin(R, V)          # weight [V, R]: markov_w1[prev] is a row
        mh.markov_w2 = lin(R, V)          # weight [V, R]
        self.markov_head = mh
        ch = nn.Module()
        ch.proj = lin(H + R, 1, bias=True)
        self.confidence_head = ch
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        nn.init.zeros_(self.markov_head.markov_w2.weight)
        self.register_buffer("inv_freq", yarn_inv_freq(c), persistent=False)
        m = yarn_mscale(c["rope_factor"], c["mscale_all_dim"])
        self.scale = m * m / math.sqrt(c["qk_nope_head_dim"] + c["qk_rope_head_dim"])

    def _kv(self, sa, x, pos):
        c = self.c
        nh, nope, rope, vd = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        ckv = sa.kv_a_proj_with_mqa(x)
        lat, kpe = ckv[..., :c["kv_lora_rank"]], ckv[..., c["kv_lora_rank"]:]
        kv = sa.kv_b_proj(sa.kv_a_layernorm(lat)).view(*x.shape[:-1], nh, nope + vd)
        kpe = rope_interleaved(kpe, pos, self.inv_freq)                          # [..., T, rope]
        k = torch.cat([kv[..., :nope], kpe.unsqueeze(-2).expand(*kpe.shape[:-1], nh, rope)], -1)
        return k, kv[..., nope:]

    def blocks(self, ctx, ctx_len, emb, pos):
        """ctx [B,T,H] (context vectors), ctx_len [B,A] (block a sees context t < ctx_len), emb [B,A,K,H] (block
        inputs), pos [B,A,K] (their positions) -> final-normed hidden [B,A,K,H]."""
        c = self.c
        B, A, K, H = emb.shape
        T = ctx.shape[1]
        nh, nope, rope = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"]
        h = emb
        tpos = torch.arange(T, device=ctx.device).expand(B, T)
        cmask = tpos.unsqueeze(1) < ctx_len.unsqueeze(-1)                         # [B,A,T]
        for layer in self.layers:
            sa = layer.self_attn
            x = layer.input_layernorm(h)
            q = sa.q_b_proj(sa.q_a_layernorm(sa.q_a_proj(x))).view(B, A, K, nh, nope + rope)
            q = torch.cat([q[..., :nope], rope_interleaved(q[..., nope:].transpose(-2, -3), pos.unsqueeze(-2),
                                                            self.inv_freq).transpose(-2, -3)], -1)
            kc, vc = self._kv(sa, ctx, tpos)                                       # [B,T,nh,*]
            kb, vb = self._kv(sa, x, pos)                                          # [B,A,K,nh,*]
            sc = torch.einsum("bakhd,bthd->bahkt", q, kc.to(q.dtype)) * self.scale
            sc = sc.masked_fill(~cmask[:, :, None, None, :], float("-inf"))
            sb = torch.einsum("bakhd,bajhd->bahkj", q, kb.to(q.dtype)) * self.scale
            p = torch.cat([sc, sb], -1).float().softmax(-1).to(q.dtype)
            o = torch.einsum("bahkt,bthd->bakhd", p[..., :T], vc.to(q.dtype)) + \
                torch.einsum("bahkj,bajhd->bakhd", p[..., T:], vb.to(q.dtype))
            h = h + sa.o_proj(o.reshape(B, A, K, -1))
            y = layer.post_attention_layernorm(h)
            h = h + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(y)) * layer.mlp.up_proj(y))
        return self.final_norm(h)

    def context(self, taps):
        """taps [B,T,n*H_target] (the raw prefixes of target_layer_ids, concatenated in that order)."""
        return self.context_norm(self.context_proj(taps))

    def markov(self, prev):
        return self.markov_head.markov_w1.weight[prev] @ self.markov_head.markov_w2.weight.t()

    @torch.no_grad()
    def draft(self, ctx, p, anchor, embed, lm_head):
        """One speculation step for one sequence: ctx [T,H] (T >= p), anchor id at position p -> K draft ids."""
        c = self.c
        K = c["block_size"]
        ids = torch.tensor([anchor] + [c["mask_token_id"]] * (K - 1), device=ctx.device)
        emb = embed[ids].to(ctx.dtype).view(1, 1, K, -1)
        pos = (p + torch.arange(K, device=ctx.device)).view(1, 1, K)
        h = self.blocks(ctx[None, :p], torch.tensor([[p]], device=ctx.device), emb, pos)[0, 0]
        U = h @ lm_head.t().to(h.dtype)
        out, prev = [], anchor
        for k in range(K):
            d = int((U[k].float() + self.markov(torch.tensor(prev, device=ctx.device)).float()).argmax())
            out.append(d)
            prev = d
        return out


def hf_config(c):
    return {"architectures": ["K3DSparkModel"], "model_type": "k3_dspark", "hidden_size": c["hidden_size"],
            "intermediate_size": c["intermediate_size"], "num_hidden_layers": c["num_hidden_layers"],
            "num_attention_heads": c["num_attention_heads"], "num_key_value_heads": c["num_key_value_heads"],
            "q_lora_rank": c["q_lora_rank"], "kv_lora_rank": c["kv_lora_rank"],
            "qk_nope_head_dim": c["qk_nope_head_dim"], "qk_rope_head_dim": c["qk_rope_head_dim"],
            "v_head_dim": c["v_head_dim"], "mla_use_nope": False, "mla_use_output_gate": False,
            "rms_norm_eps": c["rms_norm_eps"],
            "rope_parameters": {"rope_type": "yarn", "factor": c["rope_factor"],
                                "original_max_position_embeddings": c["rope_original_max"],
                                "rope_theta": c["rope_theta"], "beta_fast": c["beta_fast"], "beta_slow": c["beta_slow"],
                                "mscale": c["mscale"], "mscale_all_dim": c["mscale_all_dim"]},
            "num_target_layers": len(c["target_layer_ids"]), "target_hidden_size": c["target_hidden_size"],
            "target_num_hidden_layers": c["target_num_hidden_layers"], "target_layer_ids": c["target_layer_ids"],
            "block_size": c["block_size"], "num_speculative_tokens": c["block_size"],
            "mask_token_id": c["mask_token_id"], "eos_token_id": c["eos_token_id"],
            "markov_rank": c["markov_rank"], "markov_head_type": "vanilla", "enable_confidence_head": True,
            "confidence_head_with_markov": True, "draft_vocab_size": c["vocab_size"], "vocab_size": c["vocab_size"],
            "torch_dtype": "bfloat16",
            "note": "Deltafin's bundled DSpark-style drafter for models/default (tools/train); no embed_tokens or "
                    "lm_head in the file: both are the target's"}


def export(model, outdir):
    os.makedirs(outdir, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in model.state_dict().items()}
    st_save(sd, os.path.join(outdir, "model.safetensors"), {"format": "pt", "trained_with": "deltafin tools/train"})
    json.dump(hf_config(model.c), open(os.path.join(outdir, "config.json"), "w"), indent=2)


def load(outdir, c):
    m = DSpark(c)
    m.load_state_dict({k: v.float() for k, v in st_load(os.path.join(outdir, "model.safetensors")).items()})
    return m
