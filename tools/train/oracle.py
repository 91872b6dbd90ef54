"""Reference outputs for an exported mini-K3 from Moonshot's own modeling code (modeling_kimi_linear.py +
configuration_kimi_k3.py from the Kimi-K3 repository, passed in as a folder and never copied here), run in
float64 on the CPU over a pure-PyTorch stand-in for the fla kernels (the fla_shim folder the oracle generators
use), exactly as shared/oracle/gen_k3_oracle.py runs it. Writes an oracle case: config.json,
model.safetensors, generation_config.json, expected.json (prompt ids, logits file, 16 greedy ids, top-1/top-2
margins) and logits_pN.f32 (float32 [n x vocab]); plus result.json with the torch-vs-Moonshot difference of
tools/train's own model on the same weights.

usage: oracle.py K3SRC SHIM MODEL_DIR OUT_DIR PROMPTS.json
"""
import importlib
import json
import os
import shutil
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def load_moonshot(src, shim):
    sys.path.insert(0, shim)
    import transformers.pytorch_utils as pu
    import transformers.utils.generic as gen
    if not hasattr(gen, "check_model_inputs"):
        gen.check_model_inputs = lambda f=None, **k: (f if f is not None else (lambda g: g))
    if not hasattr(gen, "OutputRecorder"):
        class OutputRecorder:
            def __init__(self, *a, **k):
                pass
        gen.OutputRecorder = OutputRecorder
    if not hasattr(pu, "ALL_LAYERNORM_LAYERS"):
        pu.ALL_LAYERNORM_LAYERS = []
    pkg = tempfile.mkdtemp()
    os.makedirs(os.path.join(pkg, "k3ref"))
    for f in ("configuration_kimi_k3.py", "modeling_kimi_linear.py"):
        shutil.copy(os.path.join(src, f), os.path.join(pkg, "k3ref", f))
    open(os.path.join(pkg, "k3ref", "__init__.py"), "w").close()
    sys.path.insert(0, pkg)
    conf = importlib.import_module("k3ref.configuration_kimi_k3")
    mod = importlib.import_module("k3ref.modeling_kimi_linear")

    def causal_mask(config=None, input_embeds=None, **kw):
        T = input_embeds.shape[1]
        return torch.full((T, T), float("-inf"), dtype=input_embeds.dtype).triu(1).view(1, 1, T, T)
    mod.create_causal_mask = causal_mask
    return conf, mod


def load_weights(conf, mod, model_dir):
    """Moonshot's KimiLinearForCausalLM holding an exported model's (or an oracle case's) weights as
    the engine reads them: MXFP4 experts dequantized, the rest widened; float64, eager attention.
    Returns (model, its KimiLinearConfig, the text_config dict)."""
    import k3model
    from stio import st_load
    top = json.load(open(os.path.join(model_dir, "config.json")))
    text = top["text_config"]
    keep = {k: v for k, v in text.items() if k not in ("architectures", "auto_map", "_name_or_path", "dtype",
                                                        "transformers_version", "model_type")}
    cfg = conf.KimiLinearConfig(**keep)
    model = mod.KimiLinearForCausalLM(cfg).eval()
    for m in model.modules():
        if hasattr(m, "config"):
            m.config._attn_implementation = "eager"
    sd = {}
    tensors = st_load(os.path.join(model_dir, "model.safetensors"))
    for k, v in tensors.items():
        if not k.startswith("language_model."):
            continue  # a vision tower: not used by text inference
        n = k[len("language_model."):]
        if n.endswith(".weight_packed"):
            sd[n[: -len("_packed")]] = k3model.mxfp4_unpack(v, tensors[k[: -len("_packed")] + "_scale"])
        elif not n.endswith(".weight_scale"):
            sd[n] = v.float()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise SystemExit("%s: weights do not fit Moonshot's model: missing %s, unexpected %s"
                         % (model_dir, missing[:3], unexpected[:3]))
    return model.double(), cfg, text


def run(src, shim, model_dir, out, prompts):
    import k3model
    t0 = time.time()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    conf, mod = load_moonshot(src, shim)
    model, cfg, text = load_weights(conf, mod, model_dir)
    os.makedirs(out, exist_ok=True)
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(os.path.join(model_dir, f), os.path.join(out, f))
    exp = {"model_type": "kimi_k3", "prompts": []}
    V = cfg.vocab_size
    # tools/train's own model on the same weights, float64, exact recurrence: how far from Moonshot's code?
    mine_cfg = dict(k3model.default_config())
    mine_cfg.update(_cfg_from_text(text))
    mine = k3model.load_exported(model_dir, mine_cfg).double().eval()
    for layer in mine.model.layers:
        if layer.kda:
            layer.self_attn.chunked = False
    worst = 0.0
    for pi, ids in enumerate(prompts):
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(x, use_cache=False).logits[0]
            ml = mine(x)[0]
            err = ((ml - logits).pow(2).sum(-1) / logits.pow(2).sum(-1)).sqrt().max().item()
            worst = max(worst, err)
            seq, new, margins = x.clone(), [], []
            for _ in range(16):
                last = model(seq, use_cache=False).logits[0, -1].double()
                t2 = torch.topk(last, 2)
                margins.append(float(t2.values[0] - t2.values[1]))
                nxt = int(t2.indices[0])
                new.append(nxt)
                seq = torch.cat([seq, torch.tensor([[nxt]])], 1)
        lf = "logits_p%d.f32" % pi
        logits.float().numpy().astype("<f4").tofile(os.path.join(out, lf))
        exp["prompts"].append({"ids": list(ids), "logits_file": lf, "greedy": new, "margins": margins})
    json.dump(exp, open(os.path.join(out, "expected.json"), "w"), indent=1)
    res = {"prompts": len(prompts), "lengths": [len(p) for p in prompts], "vocab": V,
           "min_margin": min(min(p["margins"]) for p in exp["prompts"]),
           "tools_train_model_vs_moonshot_max_rel_err": worst, "seconds": round(time.time() - t0, 1),
           "greedy": [p["greedy"] for p in exp["prompts"]]}
    json.dump(res, open(os.path.join(out, "result.json"), "w"), indent=1)
    print("oracle:", res, flush=True)


def _cfg_from_text(t):
    lac = t["linear_attn_config"]
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
            "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "intermediate_size", "first_k_dense_replace",
            "num_experts", "num_experts_per_token", "routed_expert_hidden_size", "moe_intermediate_size",
            "num_shared_experts", "attn_res_block_size", "rms_norm_eps", "bos_token_id", "eos_token_id",
            "pad_token_id")
    c = {k: t[k] for k in keys}
    c.update(full_attn_layers=lac["full_attn_layers"], kda_heads=lac["num_heads"], kda_head_dim=lac["head_dim"],
             conv_size=lac["short_conv_kernel_size"], gate_lower_bound=lac["gate_lower_bound"])
    return c


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.load(open(sys.argv[5])))
