"""A small Qwen3-architecture model (the cross-tokenizer drafter), our own code, with HF Qwen3's math and tensor
names: pre-norm blocks; GQA attention with per-head RMSNorm on q and k before RoPE (rotate-half); SwiGLU MLP;
tied embeddings; released as model_type qwen3 (config.json + model.safetensors + tokenizer.json)."""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from k3model import Norm as RMS   # the same RMSNorm (fp32 statistics, weight in x's dtype)
from stio import st_load, st_save


def default_config(vocab_size):
    return dict(vocab_size=vocab_size, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, intermediate_size=384, rms_norm_eps=1e-6, rope_theta=1000000.0,
                tie_word_embeddings=True)



def rope_cos_sin(T, dim, theta, device, dtype, offset=0):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim))
    pos = torch.arange(offset, offset + T, device=device, dtype=torch.float64)
    f = torch.outer(pos, inv)
    emb = torch.cat([f, f], -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rot_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.input_layernorm = RMS(H, c["rms_norm_eps"])
        self.post_attention_layernorm = RMS(H, c["rms_norm_eps"])
        sa = nn.Module()
        sa.q_proj = nn.Linear(H, nh * hd, bias=False)
        sa.k_proj = nn.Linear(H, nkv * hd, bias=False)
        sa.v_proj = nn.Linear(H, nkv * hd, bias=False)
        sa.o_proj = nn.Linear(nh * hd, H, bias=False)
        sa.q_norm = RMS(hd, c["rms_norm_eps"])
        sa.k_norm = RMS(hd, c["rms_norm_eps"])
        self.self_attn = sa
        mlp = nn.Module()
        mlp.gate_proj = nn.Linear(H, c["intermediate_size"], bias=False)
        mlp.up_proj = nn.Linear(H, c["intermediate_size"], bias=False)
        mlp.down_proj = nn.Linear(c["intermediate_size"], H, bias=False)
        self.mlp = mlp

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        sa = self.self_attn
        h = self.input_layernorm(x)
        q = sa.q_norm(sa.q_proj(h).view(B, T, self.nh, self.hd)).transpose(1, 2)
        k = sa.k_norm(sa.k_proj(h).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = sa.v_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rot_half(q) * sin
        k = k * cos + rot_half(k) * sin
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, 1)
        v = v.repeat_interleave(rep, 1)
        if hasattr(F, "scaled_dot_product_attention") and q.dtype != torch.float64:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            o = s.softmax(-1) @ v
        x = x + sa.o_proj(o.transpose(1, 2).reshape(B, T, -1))
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


class Qwen3(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        m = nn.Module()
        m.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        m.layers = nn.ModuleList([Block(c) for _ in range(c["num_hidden_layers"])])
        m.norm = RMS(c["hidden_size"], c["rms_norm_eps"])
        self.model = m
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            if n.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c["num_hidden_layers"]))

    def forward(self, ids):
        x = self.model.embed_tokens(ids)
        cos, sin = rope_cos_sin(ids.shape[1], self.c["head_dim"], self.c["rope_theta"], ids.device, x.dtype)
        for l in self.model.layers:
            x = l(x, cos, sin)
        return self.model.norm(x) @ self.model.embed_tokens.weight.t().to(x.dtype)


def hf_config(c, bos, eos, pad):
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
            "attention_dropout": 0.0, "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
            "head_dim": c["head_dim"], "hidden_act": "silu", "hidden_size": c["hidden_size"],
            "initializer_range": 0.02, "intermediate_size": c["intermediate_size"], "max_position_embeddings": 32768,
            "max_window_layers": c["num_hidden_layers"], "num_attention_heads": c["num_attention_heads"],
            "num_hidden_layers": c["num_hidden_layers"], "num_key_value_heads": c["num_key_value_heads"],
            "rms_norm_eps": c["rms_norm_eps"], "rope_scaling": None, "rope_theta": c["rope_theta"],
            "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
            "use_sliding_window": False, "vocab_size": c["vocab_size"],
            "note": "Deltafin's bundled cross-tokenizer drafter (tools/train): Qwen3 architecture, own BPE vocabulary"}


def export(model, outdir, bos, eos, pad):
    os.makedirs(outdir, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in model.state_dict().items()}
    st_save(sd, os.path.join(outdir, "model.safetensors"), {"format": "pt"})
    json.dump(hf_config(model.c, bos, eos, pad), open(os.path.join(outdir, "config.json"), "w"), indent=2)
    json.dump({"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad, "do_sample": False},
              open(os.path.join(outdir, "generation_config.json"), "w"), indent=2)


def load(outdir, c):
    m = Qwen3(c)
    sd = {k: v.float() for k, v in st_load(os.path.join(outdir, "model.safetensors")).items()}
    m.load_state_dict(sd)
    return m
