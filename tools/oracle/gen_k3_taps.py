#!/usr/bin/env python3
"""Reference taps for K3 oracle cases, from Moonshot's own modeling code.

A tap of layer i is the raw AttnRes running sum ("prefix") leaving decoder layer i (docs/model.md,
"Block AttnRes"): what the engine's session_pass returns for taps. Moonshot's KimiDecoderLayer
returns (prefix_sum, block_residual), so a forward hook on each decoder layer sees it directly.

Each case folder is an oracle case as tests/data/oracle holds it (config.json, model.safetensors,
expected.json, logits_pN.f32). Its weights are loaded into Moonshot's KimiLinearForCausalLM as the
engine reads them (tools/train/oracle.py's load_weights), the model runs in float64 on the
CPU with a hook on every decoder layer, and the script writes OUTDIR/<case>/taps_pN.f32
([n][layers][hidden], float32 little-endian) and taps.json. The case's own logits are recomputed
on the way and compared with its logits_pN.f32, so a case the loader rebuilt wrongly is refused
rather than given taps.

Runs where torch + transformers exist (the GPU machine; it computes on the CPU):

  gen_k3_taps.py K3_SOURCE_DIR FLA_SHIM_DIR OUTDIR CASE_DIR...

K3_SOURCE_DIR holds Moonshot's configuration_kimi_k3.py and modeling_kimi_linear.py (never
committed); FLA_SHIM_DIR is the pure-PyTorch fla stand-in the oracle generators use. The taps are then added to the cases' archives in tests/data/oracle/ for
tests/test_session.c (session_taps_match_moonshot_*).
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
import oracle  # noqa: E402  (tools/train/oracle.py: Moonshot's modules as a package)


def layer_output(out):
    """The prefix a decoder layer returns: its output, or the first element of a tuple."""
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out


def main():
    src, shim, outdir = sys.argv[1:4]
    conf, mod = oracle.load_moonshot(src, shim)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    for case in sys.argv[4:]:
        name = os.path.basename(os.path.normpath(case))
        model, cfg, _ = oracle.load_weights(conf, mod, case)
        layers = model.model.layers
        taps = [None] * len(layers)

        def hook(i):
            def f(_module, _inputs, out):
                taps[i] = layer_output(out).detach()
            return f

        handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
        exp = json.load(open(os.path.join(case, "expected.json")))
        d = os.path.join(outdir, name)
        os.makedirs(d, exist_ok=True)
        meta = {"case": name, "layers": len(layers), "hidden": cfg.hidden_size, "prompts": []}
        worst = 0.0
        for pi, p in enumerate(exp["prompts"]):
            ids = torch.tensor([p["ids"]])
            with torch.no_grad():
                logits = model(ids, use_cache=False).logits[0]
            want = torch.from_numpy(np.fromfile(os.path.join(case, p["logits_file"]), dtype="<f4")
                                    .reshape(logits.shape).astype(np.float64))
            err = ((logits - want).abs().max() / want.abs().max()).item()
            worst = max(worst, err)
            t = torch.stack([x[0] for x in taps], 1)  # [n][layers][hidden]
            f = "taps_p%d.f32" % pi
            t.float().numpy().astype("<f4").tofile(os.path.join(d, f))
            meta["prompts"].append({"ids": p["ids"], "taps_file": f})
        for h in handles:
            h.remove()
        if worst > 1e-5:
            raise SystemExit("%s: Moonshot's logits on these weights differ from the case's by %.2e" % (name, worst))
        meta["logits_vs_case_max_rel_err"] = worst
        json.dump(meta, open(os.path.join(d, "taps.json"), "w"), indent=1)
        print(name, "taps", tuple(t.shape), "logits vs case %.1e" % worst, flush=True)


if __name__ == "__main__":
    main()
