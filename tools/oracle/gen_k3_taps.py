#!/usr/bin/env python3
"""Reference taps for the K3 oracle cases, from Moonshot's own modeling code.

A tap of layer i is the raw AttnRes running sum ("prefix") leaving decoder layer i (docs/model.md,
"Block AttnRes"): what the engine's session_pass returns for taps. This script rebuilds each K3
oracle case exactly as the shared generator made it (same seeds, same code: it imports that
generator, it does not copy it), runs the case's prompts through Moonshot's KimiLinearForCausalLM
in float64 with a forward hook on every decoder layer, and writes taps_pN.f32 ([n][layers][hidden],
float32 little-endian) and taps.json beside a copy of the case's expected.json.

Runs where torch + transformers exist (the GPU machine; it computes on the CPU):

  gen_k3_taps.py SHARED_ORACLE_DIR K3_SOURCE_DIR OUTDIR CASESET

SHARED_ORACLE_DIR holds gen_k3_oracle.py and fla_shim/; K3_SOURCE_DIR holds Moonshot's
config.json, configuration_kimi_k3.py and modeling_kimi_linear.py (never committed). The cases'
taps are then copied into tests/data/oracle/<case>/ (the archives) for tests/test_session.c.
"""
import importlib.util
import json
import os
import sys

import torch


def load_generator(shared):
    spec = importlib.util.spec_from_file_location("gen_k3_oracle", os.path.join(shared, "gen_k3_oracle.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def layer_output(out):
    """The prefix a decoder layer returns: its output, or the first element of a tuple."""
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out


def main():
    shared, src, outdir, which = sys.argv[1:5]
    gen = load_generator(shared)
    conf, mod = gen.load_k3(src)
    real = json.load(open(os.path.join(src, "config.json")))
    for case in gen.CASESETS[which]:
        name, seed, kw = case[:3]
        text = gen.tiny_text_config(real["text_config"], **kw)
        keep = {k: v for k, v in text.items() if k not in ("architectures", "auto_map", "_name_or_path", "dtype",
                                                            "transformers_version", "model_type")}
        cfg = conf.KimiLinearConfig(**keep)
        torch.manual_seed(seed)
        model = mod.KimiLinearForCausalLM(cfg).eval()
        for m in model.modules():
            if hasattr(m, "config"):
                m.config._attn_implementation = "eager"
        gen.randomize(model, seed)
        params = dict(model.named_parameters())
        for k, v in model.state_dict().items():  # the experts as the checkpoint stores them
            if ".block_sparse_moe.experts." in k and k.endswith((".w1.weight", ".w2.weight", ".w3.weight")):
                deq, _, _ = gen.mxfp4_quantize(v.double())
                with torch.no_grad():
                    params[k].copy_(deq.float())
        model = model.double()
        layers = model.model.layers
        taps = [None] * len(layers)

        def hook(i):
            def f(_module, _inputs, out):
                taps[i] = layer_output(out).detach()
            return f

        handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
        exp = json.load(open(os.path.join(shared, "cases", name, "expected.json")))
        d = os.path.join(outdir, name)
        os.makedirs(d, exist_ok=True)
        meta = {"case": name, "layers": len(layers), "hidden": cfg.hidden_size, "prompts": []}
        for pi, p in enumerate(exp["prompts"]):
            ids = torch.tensor([p["ids"]])
            with torch.no_grad():
                model(ids, use_cache=False)
            t = torch.stack([x[0] for x in taps], 1)  # [n][layers][hidden]
            f = f"taps_p{pi}.f32"
            t.float().numpy().astype("<f4").tofile(os.path.join(d, f))
            meta["prompts"].append({"ids": p["ids"], "taps_file": f})
        for h in handles:
            h.remove()
        json.dump(meta, open(os.path.join(d, "taps.json"), "w"), indent=1)
        print(name, "taps", tuple(t.shape))


if __name__ == "__main__":
    main()
