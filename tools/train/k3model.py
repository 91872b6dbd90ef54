"""mini-K3: Kimi K3's text decoder in plain PyTorch, for training and for exporting in K3's release format.

The math is K3's as docs/model.md describes it; this file is our own code:
  - Block Attention Residuals (Block AttnRes): the embedding and each finished block's sum sit on a stack; every
    layer mixes stack + current prefix with softmax(rms(v) . (norm.w * proj.w)) over raw values.
  - KDA (KDA): q/k/v projections -> causal depthwise conv (F32, tap W-1 = current) -> SiLU; l2-normed q/k,
    q scaled by d^-0.5; lower-bound forget gate g = lb * sigmoid(exp(A_log[h]) * (f + dt_bias)) with f from a
    shared low-rank pair f_b(f_a(x)); beta = sigmoid(b_proj(x)); decay, delta-rule write, read the updated
    state; per-head RMSNorm with F32 o_norm then * sigmoid(g_proj(x)) (full-rank output gate); o_proj.
  - gated NoPE MLA : q_a -> rms(1e-6) -> q_b; kv_a -> [c ; k_pe], c -> rms(1e-6) -> kv_b; no rotation
    anywhere, k_pe shared by all heads; scale (nope+rope)^-0.5; output * sigmoid(g_proj(x)) before o_proj.
  - SiTU-GLU : 4 tanh(a/4) sigmoid(a) * 25 tanh(b/25); a dense MLP on the first layer(s).
  - latent MoE : sigmoid router in fp32, bias for selection only, renormalised top-k weights;
    down-proj to the latent width, experts (SiTU-GLU), weighted sum, latent RMSNorm, up-proj; shared experts
    on the full-width input, added unweighted.
Training-only choices (they do not change the function an exported checkpoint computes):
  - KDA runs chunked (kda_chunked), which is the same recurrence rearranged (tested against kda_recurrent);
  - every routed expert is evaluated and non-selected ones get weight 0 (identical output, GPU friendly);
  - the router bias is adjusted outside the gradient (aux-loss-free balancing, as the noaux_tc bias implies);
  - routed experts can be fake-quantized to MXFP4 with a straight-through gradient (QAT), with the very
    quantizer that export uses, so the exported experts are exactly the ones trained last.
Parameter names follow Moonshot's state_dict (model.layers.{i}.self_attn.q_proj.weight, ...), except the routed
experts, which are stacked here (block_sparse_moe.experts.w1 [E, I, L]) and split per expert on export.
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from stio import st_load, st_save

# ---------------------------------------------------------------------------------------------- config

def default_config():
    """The bundled mini-K3 (models/default). Layer i is KDA unless i+1 is in full_attn_layers."""
    return dict(
        vocab_size=4096, hidden_size=192, num_hidden_layers=8,
        full_attn_layers=[4, 7, 8],           # 1-based, as in K3's config: 0-based 3, 6, 7 are MLA
        kda_heads=3, kda_head_dim=64, conv_size=4, gate_lower_bound=-5.0,
        num_attention_heads=3, q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=64, qk_rope_head_dim=32,
        v_head_dim=64,
        intermediate_size=512, first_k_dense_replace=1,
        num_experts=64, num_experts_per_token=8, routed_expert_hidden_size=96, moe_intermediate_size=128,
        num_shared_experts=2, attn_res_block_size=3, rms_norm_eps=1e-5,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,   # filled from the tokenizer
    )


def is_kda(cfg, i):
    return (i + 1) not in cfg["full_attn_layers"]


# ---------------------------------------------------------------------------------------------- blocks

def rms(x, w, eps):
    """KimiRMSNorm: normalise in fp32, back to x's dtype, times the weight."""
    xf = x.float() if x.dtype != torch.float64 else x
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return w.to(x.dtype) * y


class Norm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms(x, self.weight, self.eps)


def situ(a, b):
    dt = a.dtype
    a = a.float() if dt != torch.float64 else a
    b = b.float() if dt != torch.float64 else b
    return (4.0 * torch.tanh(a / 4.0) * torch.sigmoid(a) * (25.0 * torch.tanh(b / 25.0))).to(dt)


def lin(i, o):
    return nn.Linear(i, o, bias=False)


class MLP(nn.Module):
    def __init__(self, h, inter):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = lin(h, inter), lin(h, inter), lin(inter, h)

    def forward(self, x):
        return self.down_proj(situ(self.gate_proj(x), self.up_proj(x)))


def attn_res(sources, norm, proj):
    """Block AttnRes mix over a list of [.., H] sources (current stream last): keys rms-normed, values raw."""
    v = torch.stack(sources, dim=-2)                          # [.., S, H]
    vf = v.float() if v.dtype != torch.float64 else v
    k = vf * torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + norm.eps)
    u = norm.weight.to(vf.dtype) * proj.weight.squeeze(0).to(vf.dtype)
    p = (k * u).sum(-1).softmax(-1)                           # [.., S]
    return (p.unsqueeze(-1) * vf).sum(-2).to(v.dtype)


# ---------------------------------------------------------------------------------------------- KDA

def l2n(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def kda_recurrent(q, k, v, g, beta, S=None):
    """Reference recurrence. q,k,g [B,T,h,d] (q already scaled), v [B,T,h,dv], beta [B,T,h]. Returns o, S."""
    B, T, h, d = q.shape
    dv = v.shape[-1]
    if S is None:
        S = q.new_zeros(B, h, d, dv)
    o = []
    for t in range(T):
        S = S * torch.exp(g[:, t]).unsqueeze(-1)
        u = torch.einsum("bhkv,bhk->bhv", S, k[:, t])
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], beta[:, t].unsqueeze(-1) * (v[:, t] - u))
        o.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(o, 1), S


def kda_chunked(q, k, v, g, beta, C=16):
    """The same recurrence, C tokens at a time (WY form). Within a chunk, with c = cumsum(g) from the chunk start:
    U = (I + diag(beta) A)^-1 (beta V - beta (K*e^c) S0),  A[i,j<i] = sum_d k_i k_j e^(c_i - c_j);
    O = (Q*e^c) S0 + M U,  M[i,j<=i] = sum_d q_i k_j e^(c_i - c_j);  S1 = e^(c_C) S0 + (K*e^(c_C - c))^T U.
    e^(c_i - c_j) is split as e^(c_i - r) e^(r - c_j) around the chunk middle r: |c - r| <= 5*C/2 stays finite."""
    dt = q.dtype
    B, T, h, d = q.shape
    dv = v.shape[-1]
    wd = torch.float64 if dt == torch.float64 else torch.float32
    q, k, v, g = (x.transpose(1, 2).to(wd) for x in (q, k, v, g))      # [B,h,T,*]
    beta = beta.transpose(1, 2).to(wd)
    pad = (-T) % C
    if pad:
        q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, pad))
    N = (T + pad) // C
    q, k, v, g = (x.reshape(B, h, N, C, x.shape[-1]) for x in (q, k, v, g))
    beta = beta.reshape(B, h, N, C, 1)
    c = g.cumsum(3)
    r = c[:, :, :, C // 2:C // 2 + 1]
    kp, kn, qp = k * torch.exp(c - r), k * torch.exp(r - c), q * torch.exp(c - r)
    strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(0)
    A = (kp @ kn.transpose(-1, -2)).masked_fill(~strict, 0.0) * beta
    M = (qp @ kn.transpose(-1, -2)).masked_fill(~incl, 0.0)
    I = torch.eye(C, device=q.device, dtype=q.dtype)
    L = I + A
    rhs = torch.cat([beta * v, beta * k * torch.exp(c)], -1)
    X = torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True)
    U0, W = X[..., :dv], X[..., dv:]
    qg = q * torch.exp(c)
    cl = c[:, :, :, -1:]                                                 # [B,h,N,1,d]
    kd = k * torch.exp(cl - c)
    gl = torch.exp(cl).squeeze(3).unsqueeze(-1)                          # [B,h,N,d,1]
    S = q.new_zeros(B, h, d, dv)
    outs = []
    for n in range(N):
        vn = U0[:, :, n] - W[:, :, n] @ S
        outs.append(qg[:, :, n] @ S + M[:, :, n] @ vn)
        S = gl[:, :, n] * S + kd[:, :, n].transpose(-1, -2) @ vn
    o = torch.stack(outs, 2).reshape(B, h, N * C, dv)[:, :, :T]
    return o.transpose(1, 2).to(dt), S


class ShortConv(nn.Module):
    def __init__(self, n, w):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, 1, w).uniform_(-1 / math.sqrt(w), 1 / math.sqrt(w)))

    def forward(self, x):                                    # x [B,T,D] -> silu(causal depthwise conv)
        W = self.weight.shape[-1]
        xt = F.pad(x.transpose(1, 2), (W - 1, 0))
        y = F.conv1d(xt, self.weight.to(x.dtype), groups=x.shape[-1])
        return F.silu(y).transpose(1, 2)


class KDA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, h, d = cfg["hidden_size"], cfg["kda_heads"], cfg["kda_head_dim"]
        P = h * d
        self.h, self.d, self.lb, self.eps = h, d, cfg["gate_lower_bound"], cfg["rms_norm_eps"]
        self.q_proj, self.k_proj, self.v_proj = lin(H, P), lin(H, P), lin(H, P)
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (ShortConv(P, cfg["conv_size"]) for _ in range(3))
        self.A_log = nn.Parameter(torch.log(torch.empty(h).uniform_(1, 16)))
        self.f_a_proj, self.f_b_proj = lin(H, d), lin(d, P)
        self.dt_bias = nn.Parameter(torch.empty(P).uniform_(-2.0, 0.0))
        self.b_proj = lin(H, h)
        self.g_proj = lin(H, P)
        self.o_norm = Norm(d, cfg["rms_norm_eps"])
        self.o_proj = lin(P, H)
        self.chunked = True

    def forward(self, x):
        B, T, _ = x.shape
        h, d = self.h, self.d
        q = self.q_conv1d(self.q_proj(x)).view(B, T, h, d)
        k = self.k_conv1d(self.k_proj(x)).view(B, T, h, d)
        v = self.v_conv1d(self.v_proj(x)).view(B, T, h, d)
        f = self.f_b_proj(self.f_a_proj(x)).view(B, T, h, d)
        wd = torch.float64 if x.dtype == torch.float64 else torch.float32
        with torch.autocast(device_type=x.device.type, enabled=False):
            z = f.to(wd) + self.dt_bias.to(wd).view(h, d)
            g = self.lb * torch.sigmoid(torch.exp(self.A_log.to(wd)[:h]).view(h, 1) * z)
            beta = torch.sigmoid(self.b_proj(x).to(wd))
            q, k, v = l2n(q.to(wd)) * d ** -0.5, l2n(k.to(wd)), v.to(wd)
            o, _ = (kda_chunked if self.chunked else kda_recurrent)(q, k, v, g, beta)
            o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.o_norm.weight.to(wd)
            gate = self.g_proj(x).view(B, T, h, d).to(wd)
            o = (o * torch.sigmoid(gate)).to(x.dtype)
        return self.o_proj(o.reshape(B, T, h * d))


# ---------------------------------------------------------------------------------------------- MLA

def causal_attention(q, k, v, scale):
    """q,k [B,h,T,dq], v [B,h,T,dv]; causal softmax attention."""
    if hasattr(F, "scaled_dot_product_attention") and q.dtype != torch.float64:
        dq, dv = q.shape[-1], v.shape[-1]
        if dv < dq:
            v = F.pad(v, (0, dq - dv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        return o[..., :dv]
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1).to(v.dtype) @ v


class MLA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        self.nh, self.nope, self.rope, self.vd = nh, cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        self.kvr = cfg["kv_lora_rank"]
        self.q_a_proj = lin(H, cfg["q_lora_rank"])
        self.q_a_layernorm = Norm(cfg["q_lora_rank"], 1e-6)
        self.q_b_proj = lin(cfg["q_lora_rank"], nh * (self.nope + self.rope))
        self.kv_a_proj_with_mqa = lin(H, self.kvr + self.rope)
        self.kv_a_layernorm = Norm(self.kvr, 1e-6)
        self.kv_b_proj = lin(self.kvr, nh * (self.nope + self.vd))
        self.g_proj = lin(H, nh * self.vd)
        self.o_proj = lin(nh * self.vd, H)

    def forward(self, x):
        B, T, _ = x.shape
        nh = self.nh
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, T, nh, -1).transpose(1, 2)
        ckv = self.kv_a_proj_with_mqa(x)
        c, kpe = ckv[..., :self.kvr], ckv[..., self.kvr:]
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(B, T, nh, -1).transpose(1, 2)
        knope, v = kv[..., :self.nope], kv[..., self.nope:]
        k = torch.cat([knope, kpe.unsqueeze(1).expand(B, nh, T, self.rope)], -1)
        o = causal_attention(q, k.to(q.dtype), v, (self.nope + self.rope) ** -0.5)
        o = o.transpose(1, 2).reshape(B, T, nh * self.vd)
        o = o * torch.sigmoid(self.g_proj(x))
        return self.o_proj(o)


# ---------------------------------------------------------------------------------------------- MXFP4

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
_MID = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def mxfp4_encode(w):
    """w [..., out, in] -> (codes uint8 [..., out, in] (sign<<3 | magnitude index), exps int [..., out, in/32]).
    Block of 32 along the input dim; shared exponent e = ceil(log2(amax / 6)) so nothing saturates."""
    *lead, o, i = w.shape
    gblk = w.detach().float().reshape(*lead, o, i // 32, 32)
    amax = gblk.abs().amax(-1)
    e = torch.ceil(torch.log2(torch.clamp(amax, min=1e-38) / 6.0)).clamp(-126, 127)
    x = gblk / torch.pow(2.0, e).unsqueeze(-1)
    idx = torch.bucketize(x.abs().clamp(max=6.0), torch.tensor(_MID, device=w.device))
    codes = (idx + 8 * (x < 0).long()).to(torch.uint8).reshape(*lead, o, i)
    return codes, e.long()


def mxfp4_decode(codes, exps):
    *lead, o, i = codes.shape
    mags = torch.tensor(E2M1 + [-m for m in E2M1], device=codes.device, dtype=torch.float32)
    vals = mags[codes.long()].reshape(*lead, o, i // 32, 32) * torch.pow(2.0, exps.float()).unsqueeze(-1)
    return vals.reshape(*lead, o, i)


def mxfp4_fake(w):
    """Forward: the MXFP4 value; backward: identity (straight-through)."""
    codes, e = mxfp4_encode(w)
    return w + (mxfp4_decode(codes, e).to(w.dtype) - w).detach()


def mxfp4_pack(w):
    """w [out, in] -> (packed U8 [out, in/2], low nibble = even column; scales U8 [out, in/32] = e + 127)."""
    codes, e = mxfp4_encode(w)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    return packed, (e + 127).to(torch.uint8).contiguous()


def mxfp4_unpack(packed, scales):
    codes = torch.stack([packed & 15, packed >> 4], -1).reshape(packed.shape[0], -1)
    return mxfp4_decode(codes, scales.long() - 127)


# ---------------------------------------------------------------------------------------------- MoE

def _situ_weighted(a, b, w):
    """a, b [n,E,I] gate/up of every expert, w [n,E] routing weights (0 where not chosen) -> [n,E,I]."""
    return situ(a, b) * w.unsqueeze(-1).to(a.dtype)


class Experts(nn.Module):
    def __init__(self, E, L, I):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(E, I, L) * 0.02)   # gate
        self.w3 = nn.Parameter(torch.randn(E, I, L) * 0.02)   # up
        self.w2 = nn.Parameter(torch.randn(E, L, I) * 0.02)   # down
        self.qat = False

    def weights(self):
        if self.qat:
            return mxfp4_fake(self.w1), mxfp4_fake(self.w3), mxfp4_fake(self.w2)
        return self.w1, self.w3, self.w2


class Gate(nn.Module):
    def __init__(self, E, H):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(E, H) * 0.02)
        self.e_score_correction_bias = nn.Parameter(torch.zeros(E), requires_grad=False)


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, E, L, I = cfg["hidden_size"], cfg["num_experts"], cfg["routed_expert_hidden_size"], cfg["moe_intermediate_size"]
        self.E, self.k = E, cfg["num_experts_per_token"]
        self.gate = Gate(E, H)
        self.experts = Experts(E, L, I)
        self.shared_experts = MLP(H, I * cfg["num_shared_experts"])
        self.routed_expert_down_proj = lin(H, L)
        self.routed_expert_up_proj = lin(L, H)
        self.routed_expert_norm = Norm(L, cfg["rms_norm_eps"])
        self.last_load = None

    def forward(self, hs):
        shape = hs.shape
        h = hs.reshape(-1, shape[-1])
        wd = torch.float64 if h.dtype == torch.float64 else torch.float32
        with torch.autocast(device_type=h.device.type, enabled=False):
            s = torch.sigmoid(h.to(wd) @ self.gate.weight.to(wd).t())
            idx = torch.topk(s + self.gate.e_score_correction_bias.to(wd), self.k, dim=-1).indices
            w = s.gather(1, idx)
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
            dense_w = torch.zeros_like(s).scatter(1, idx, w)
        with torch.no_grad():
            self.last_load = torch.bincount(idx.reshape(-1), minlength=self.E)
        xl = self.routed_expert_down_proj(h)
        w1, w3, w2 = self.experts.weights()
        a = torch.einsum("nl,eil->nei", xl, w1.to(xl.dtype))
        b = torch.einsum("nl,eil->nei", xl, w3.to(xl.dtype))
        if torch.is_grad_enabled():     # recompute the elementwise SiTU in backward: its fp32 temporaries for
            act = checkpoint(_situ_weighted, a, b, dense_w, use_reentrant=False)   # [n,E,I] x 7 layers fill a GPU
        else:
            act = _situ_weighted(a, b, dense_w)
        E, I, L = w1.shape
        y = act.reshape(-1, E * I) @ w2.to(xl.dtype).permute(0, 2, 1).reshape(E * I, L)
        r = self.routed_expert_up_proj(self.routed_expert_norm(y))
        return (r + self.shared_experts(h)).reshape(shape)


# ---------------------------------------------------------------------------------------------- model

class Layer(nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        H, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.i, self.bs = i, cfg["attn_res_block_size"]
        self.kda = is_kda(cfg, i)
        self.self_attn = KDA(cfg) if self.kda else MLA(cfg)
        if i >= cfg["first_k_dense_replace"]:
            self.block_sparse_moe = MoE(cfg)
        else:
            self.mlp = MLP(H, cfg["intermediate_size"])
        self.input_layernorm, self.post_attention_layernorm = Norm(H, eps), Norm(H, eps)
        self.self_attention_res_norm, self.mlp_res_norm = Norm(H, eps), Norm(H, eps)
        self.self_attention_res_proj, self.mlp_res_proj = lin(H, 1), lin(H, 1)
        nn.init.zeros_(self.self_attention_res_proj.weight)
        nn.init.zeros_(self.mlp_res_proj.weight)

    def forward(self, prefix, stack):
        x = attn_res(stack + [prefix], self.self_attention_res_norm, self.self_attention_res_proj) if stack else prefix
        if self.i % self.bs == 0:
            stack = stack + [prefix]
            prefix = None
        a = self.self_attn(self.input_layernorm(x))
        prefix = a if prefix is None else prefix + a
        x2 = attn_res(stack + [prefix], self.mlp_res_norm, self.mlp_res_proj)
        ffn = self.block_sparse_moe if hasattr(self, "block_sparse_moe") else self.mlp
        prefix = prefix + ffn(self.post_attention_layernorm(x2))
        return prefix, stack


class Inner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H = cfg["hidden_size"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], H)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)
        self.layers = nn.ModuleList([Layer(cfg, i) for i in range(cfg["num_hidden_layers"])])
        self.norm = Norm(H, cfg["rms_norm_eps"])
        self.output_attn_res_norm = Norm(H, cfg["rms_norm_eps"])
        self.output_attn_res_proj = lin(H, 1)
        nn.init.zeros_(self.output_attn_res_proj.weight)


class MiniK3(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg)
        self.lm_head = lin(cfg["hidden_size"], cfg["vocab_size"])
        std = 0.02
        for n, p in self.named_parameters():
            if p.dim() == 2 and "embed" not in n and "res_proj" not in n and "gate.weight" not in n:
                nn.init.normal_(p, std=std)
            if n.endswith(("o_proj.weight", "down_proj.weight")) and "routed" not in n:
                nn.init.normal_(p, std=std / math.sqrt(2 * cfg["num_hidden_layers"]))

    def hidden(self, ids, taps=()):
        """ids [B,T] -> (final normed hidden [B,T,H], {layer: raw prefix leaving that layer})."""
        prefix = self.model.embed_tokens(ids)
        stack, got = [], {}
        for layer in self.model.layers:
            prefix, stack = layer(prefix, stack)
            if layer.i in taps:
                got[layer.i] = prefix
        h = attn_res(stack + [prefix], self.model.output_attn_res_norm, self.model.output_attn_res_proj)
        return self.model.norm(h), got

    def forward(self, ids):
        return self.lm_head(self.hidden(ids)[0])

    def moe_layers(self):
        return [l.block_sparse_moe for l in self.model.layers if hasattr(l, "block_sparse_moe")]

    def set_qat(self, on):
        for m in self.moe_layers():
            m.experts.qat = on

    @torch.no_grad()
    def update_router_bias(self, rate):
        """Aux-loss-free balancing: raise the selection bias of under-used experts, lower over-used ones."""
        for m in self.moe_layers():
            if m.last_load is None:
                continue
            load = m.last_load.float()
            m.gate.e_score_correction_bias += rate * torch.sign(load.mean() - load)


def count_params(model):
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    return total, experts


# ---------------------------------------------------------------------------------------------- export

F32_SUFFIXES = ("conv1d.weight", "A_log", "dt_bias", "o_norm.weight", "e_score_correction_bias")


def hf_config(cfg):
    """Top-level kimi_k3 config with the nested kimi_linear text_config, as the released checkpoint has it."""
    n = cfg["num_hidden_layers"]
    full = list(cfg["full_attn_layers"])
    text = {
        "model_type": "kimi_linear",
        "architectures": ["KimiLinearForCausalLM"],
        "hidden_size": cfg["hidden_size"], "num_hidden_layers": n, "vocab_size": cfg["vocab_size"],
        "rms_norm_eps": cfg["rms_norm_eps"], "hidden_act": "situ",
        "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
        "num_attention_heads": cfg["num_attention_heads"], "num_key_value_heads": cfg["num_attention_heads"],
        "q_lora_rank": cfg["q_lora_rank"], "kv_lora_rank": cfg["kv_lora_rank"],
        "qk_nope_head_dim": cfg["qk_nope_head_dim"], "qk_rope_head_dim": cfg["qk_rope_head_dim"],
        "v_head_dim": cfg["v_head_dim"], "intermediate_size": cfg["intermediate_size"],
        "first_k_dense_replace": cfg["first_k_dense_replace"], "mla_use_nope": True, "mla_use_output_gate": True,
        "linear_attn_config": {
            "full_attn_layers": full, "kda_layers": [i for i in range(1, n + 1) if i not in full],
            "num_heads": cfg["kda_heads"], "head_dim": cfg["kda_head_dim"],
            "short_conv_kernel_size": cfg["conv_size"], "gate_lower_bound": cfg["gate_lower_bound"],
            "use_full_rank_gate": True,
        },
        "moe_intermediate_size": cfg["moe_intermediate_size"], "num_experts": cfg["num_experts"],
        "num_experts_per_token": cfg["num_experts_per_token"], "num_shared_experts": cfg["num_shared_experts"],
        "num_expert_group": 1, "topk_group": 1, "moe_renormalize": True, "moe_router_activation_func": "sigmoid",
        "routed_scaling_factor": 1.0, "routed_expert_hidden_size": cfg["routed_expert_hidden_size"],
        "moe_layer_freq": 1, "topk_method": "noaux_tc", "use_grouped_topk": True,
        "attn_res_block_size": cfg["attn_res_block_size"], "latent_moe_use_norm": True,
        "num_nextn_predict_layers": 0,
        "bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"],
        "max_position_embeddings": 1048576, "tie_word_embeddings": False,
        "quantization_config": {
            "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
            "quantization_status": "compressed",
            "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                       "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"],
            "config_groups": {"group_0": {"targets": ["Linear"], "format": "mxfp4-pack-quantized",
                                          "weights": {"num_bits": 4, "type": "float", "strategy": "group",
                                                      "group_size": 32, "symmetric": True,
                                                      "scale_dtype": "torch.uint8"}}},
        },
    }
    return {
        "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "text_config": text,
        "bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"],
        "media_placeholder_token_id": cfg.get("media_placeholder_token_id"), "tie_word_embeddings": False,
        "note": "mini-K3 trained by tools/train (Deltafin's bundled model): K3's architecture at a small size",
    }


def export_tensors(model):
    """Released layout: language_model.* names, routed experts as MXFP4 packs, F32 where K3 has F32, BF16 else."""
    out = {}
    for name, p in model.state_dict().items():
        key = "language_model." + name
        if ".experts.w" in name:
            base = key[: -len(".w1")]
            wname = name.rsplit(".", 1)[1]
            for e in range(p.shape[0]):
                packed, scales = mxfp4_pack(p[e].float())
                out[f"{base}.{e}.{wname}.weight_packed"] = packed.cpu()
                out[f"{base}.{e}.{wname}.weight_scale"] = scales.cpu()
        elif name.endswith(F32_SUFFIXES):
            out[key] = p.detach().float().cpu().contiguous()
        else:
            out[key] = p.detach().to(torch.bfloat16).cpu().contiguous()
    order = sorted(out, key=lambda k: _sort_key(k))
    return {k: out[k] for k in order}


def _sort_key(k):
    parts = k.split(".")
    return [(0, int(x)) if x.isdigit() else (1, x) for x in parts]


def export(model, cfg, outdir, extra_meta=None):
    os.makedirs(outdir, exist_ok=True)
    st_save(export_tensors(model), os.path.join(outdir, "model.safetensors"), {"format": "pt", **(extra_meta or {})})
    json.dump(hf_config(cfg), open(os.path.join(outdir, "config.json"), "w"), indent=2)
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
           "pad_token_id": cfg["pad_token_id"], "do_sample": False}
    json.dump(gen, open(os.path.join(outdir, "generation_config.json"), "w"), indent=2)


def load_exported(path, cfg, device="cpu"):
    """An exported checkpoint back into MiniK3 (experts dequantized exactly)."""
    t = st_load(os.path.join(path, "model.safetensors"))
    model = MiniK3(cfg)
    sd = {}
    packs = {}
    for k, v in t.items():
        if not k.startswith("language_model."):
            continue
        n = k[len("language_model."):]
        if n.endswith(".weight_packed") or n.endswith(".weight_scale"):
            packs[n] = v
            continue
        sd[n] = v.float()
    for moe_i, layer in enumerate(model.model.layers):
        if not hasattr(layer, "block_sparse_moe"):
            continue
        base = f"model.layers.{layer.i}.block_sparse_moe.experts"
        for wname in ("w1", "w2", "w3"):
            ws = [mxfp4_unpack(packs[f"{base}.{e}.{wname}.weight_packed"], packs[f"{base}.{e}.{wname}.weight_scale"])
                  for e in range(cfg["num_experts"])]
            sd[f"{base}.{wname}"] = torch.stack(ws)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    return model.to(device)
