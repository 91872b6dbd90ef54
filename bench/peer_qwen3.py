#!/usr/bin/env python3
"""peer_qwen3.py: one random-weight Qwen3 checkpoint in two files with the same BF16 bytes, a
Hugging Face folder (config.json, model.safetensors) that deltafin runs and a GGUF that llama.cpp
runs (norm weights, all 1, as F32 there: llama.cpp's norms take no BF16), for the side-by-side
prompt benchmark of bench/bench_peer_prefill.sh. Timing only: nothing here is part of a test.

usage: bench/peer_qwen3.py --shape 0.6b|1.7b|30b-a3b [--layers N] --gguf-py DIR --out DIR

--gguf-py is llama.cpp's bundled gguf-py (build it as bench/results/engine.md says, in an ignored
folder); it needs Debian's python3-numpy. Weights are drawn from one table of 2^20 normal values
at random offsets (scale 0.02), so a multi-GB checkpoint is written at disk speed; norms are 1.
"""
import argparse
import json
import os
import struct
import sys

SHAPES = {
    # hidden, layers, heads, kv heads, head_dim, dense inter, moe inter, experts, top-k, tied
    "0.6b": dict(hidden=1024, layers=28, heads=16, kv=8, head_dim=128, inter=3072, tied=True),
    "1.7b": dict(hidden=2048, layers=28, heads=16, kv=8, head_dim=128, inter=6144, tied=True),
    "30b-a3b": dict(hidden=2048, layers=48, heads=32, kv=4, head_dim=128, moe_inter=768, experts=128,
                    top_k=8, tied=False),
}
VOCAB = 151936


def tensors(s):
    """(HF name, GGUF name, numpy shape, kind) in file order; kind 'w' random, 'n' ones"""
    H, hd = s["hidden"], s["head_dim"]
    q, kv = s["heads"] * hd, s["kv"] * hd
    out = [("model.embed_tokens.weight", "token_embd.weight", (VOCAB, H), "w")]
    for i in range(s["layers"]):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        out += [
            (p + "input_layernorm.weight", g + "attn_norm.weight", (H,), "n"),
            (p + "self_attn.q_proj.weight", g + "attn_q.weight", (q, H), "w"),
            (p + "self_attn.k_proj.weight", g + "attn_k.weight", (kv, H), "w"),
            (p + "self_attn.v_proj.weight", g + "attn_v.weight", (kv, H), "w"),
            (p + "self_attn.o_proj.weight", g + "attn_output.weight", (H, q), "w"),
            (p + "self_attn.q_norm.weight", g + "attn_q_norm.weight", (hd,), "n"),
            (p + "self_attn.k_norm.weight", g + "attn_k_norm.weight", (hd,), "n"),
            (p + "post_attention_layernorm.weight", g + "ffn_norm.weight", (H,), "n"),
        ]
        if "experts" in s:
            E, F = s["experts"], s["moe_inter"]
            out.append((p + "mlp.gate.weight", g + "ffn_gate_inp.weight", (E, H), "w"))
            # GGUF stacks the experts: one [E, F, H] tensor per projection, the HF tensors' bytes
            # in expert order
            for proj, gg, shp in (("gate_proj", "ffn_gate_exps", (F, H)), ("up_proj", "ffn_up_exps", (F, H)),
                                  ("down_proj", "ffn_down_exps", (H, F))):
                out.append(([p + f"mlp.experts.{e}.{proj}.weight" for e in range(E)], g + gg + ".weight",
                            (E,) + shp, "w"))
        else:
            F = s["inter"]
            out += [
                (p + "mlp.gate_proj.weight", g + "ffn_gate.weight", (F, H), "w"),
                (p + "mlp.up_proj.weight", g + "ffn_up.weight", (F, H), "w"),
                (p + "mlp.down_proj.weight", g + "ffn_down.weight", (H, F), "w"),
            ]
    out.append(("model.norm.weight", "output_norm.weight", (H,), "n"))
    if not s["tied"]:
        out.append(("lm_head.weight", "output.weight", (VOCAB, H), "w"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--gguf-py", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    sys.path.insert(0, a.gguf_py)
    import numpy as np
    import gguf

    s = dict(SHAPES[a.shape])
    if a.layers:
        s["layers"] = a.layers
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(1)
    table = (rng.standard_normal(1 << 20, dtype=np.float32) * 0.02).view(np.uint32)
    table = ((table + 0x7FFF + ((table >> 16) & 1)) >> 16).astype(np.uint16)  # round to BF16
    one = np.uint16(0x3F80)

    def data(shape, kind):
        n = int(np.prod(shape))
        if kind == "n":
            return np.full(shape, one, dtype=np.uint16)
        v = np.empty(n, dtype=np.uint16)
        for i in range(0, n, 1 << 19):
            k = min(1 << 19, n - i)
            o = int(rng.integers(0, (1 << 20) - k + 1))
            v[i:i + k] = table[o:o + k]
        return v.reshape(shape)

    ts = tensors(s)
    # the HF folder: one safetensors file, its header first
    hdr, off, flat = {}, 0, []
    for hf, _, shape, kind in ts:
        names = hf if isinstance(hf, list) else [hf]
        per = shape[1:] if isinstance(hf, list) else shape
        for nm in names:
            nb = 2 * int(np.prod(per))
            hdr[nm] = {"dtype": "BF16", "shape": list(per), "data_offsets": [off, off + nb]}
            off += nb
    hj = json.dumps(hdr, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    w = gguf.GGUFWriter(os.path.join(a.out, "model.gguf.tmp"), "qwen3moe" if "experts" in s else "qwen3")
    w.add_context_length(40960)
    w.add_embedding_length(s["hidden"])
    w.add_block_count(s["layers"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if "experts" in s:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["top_k"])
        w.add_expert_feed_forward_length(s["moe_inter"])
    else:
        w.add_feed_forward_length(s["inter"])
    w.add_tokenizer_model("none")
    w.add_vocab_size(VOCAB)
    tmp_st = os.path.join(a.out, "model.safetensors.tmp")
    with open(tmp_st, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for hf, gn, shape, kind in ts:
            d = data(shape, kind)
            d.tofile(f)  # experts: [E, F, H] row-major is expert 0's bytes, then expert 1's...
            if kind == "n":  # llama.cpp takes norm weights as F32 only (1.0 either way)
                w.add_tensor(gn, np.ones(shape, dtype=np.float32))
            else:
                w.add_tensor(gn, d, raw_dtype=gguf.GGMLQuantizationType.BF16)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM" if "experts" in s else "Qwen3ForCausalLM"],
        "model_type": "qwen3_moe" if "experts" in s else "qwen3",
        "hidden_size": s["hidden"], "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv"], "head_dim": s["head_dim"], "vocab_size": VOCAB,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
        "tie_word_embeddings": s["tied"], "torch_dtype": "bfloat16", "hidden_act": "silu",
    }
    if "experts" in s:
        cfg.update(moe_intermediate_size=s["moe_inter"], num_experts=s["experts"],
                   num_experts_per_tok=s["top_k"], norm_topk_prob=True, decoder_sparse_step=1)
    else:
        cfg["intermediate_size"] = s["inter"]
    with open(os.path.join(a.out, "config.json.tmp"), "w") as f:
        json.dump(cfg, f, indent=1)
    for nm in ("model.safetensors", "model.gguf", "config.json"):
        os.replace(os.path.join(a.out, nm + ".tmp"), os.path.join(a.out, nm))
    print(f"{a.out}: qwen3 {a.shape}, {s['layers']} layers, {off / 1e9:.2f} GB of BF16 in each file")


if __name__ == "__main__":
    main()
