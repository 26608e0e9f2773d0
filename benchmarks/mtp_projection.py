"""MTP speculative decoding on the whole DeepSeek-V3, from the bytes each step reads (issue 49).

A decode step on a CPU is bound by the weights it reads. This counts them, per tensor, for a file
quantized by SCHEME (our converter's plan of the real model, as `synth` writes it):

  - a step of k tokens reads every main layer's attention, shared expert and dense FFN once, the
    output once, and in each MoE layer the distinct routed experts its k tokens chose: with 8 of
    256 chosen per token, uniformly, 256 * (1 - (1 - 8/256)^k) (8, 15.75, 23.3; the engine counted
    8.0, 15.8 and 23.0 on random weights);
  - the MTP head drafting one token reads its own layer (eh_proj, attention, shared expert, 8
    experts) and its own output head (shared_head_head).

It prints the ratios a verify of 2 and 3 tokens and the head cost against one step, and the
speed-up of one draft at acceptance a: (1 + a) / (t2/t1 + th/t1), for the file `synth --shape v3
--layers 4` writes (3 dense layers, 1 MoE layer: what benchmarks/mtp_costs.py measures) and for
the whole model (3 dense + 58 MoE layers). With --measured (mtp_costs.py's JSON of that 4-layer
file) the measured ratios are printed beside the predicted ones: the gap is compute the bytes do
not see (attention over the context, per-token work), which the whole model has per layer too.

    python benchmarks/mtp_projection.py --measured benchmarks/results/zen3-2026-12-07-mtp-costs-v3-4layers-q4_0-few-token.json
"""
from __future__ import annotations

import argparse
import json
import re

import gguf

ROUTED = re.compile(r"\.ffn_(gate|up|down)_exps\.weight$")


def distinct_experts(k: int, chosen: int, total: int) -> float:
    """Expected distinct experts k tokens choose, each `chosen` of `total` uniformly."""
    return total * (1 - (1 - chosen / total) ** k)


def layer_bytes(layers: int | None, scheme_name: str) -> dict:
    """Bytes of the main layers (each: its tensors but the routed experts; one expert's three
    slices), the output, and the MTP layer, for V3 cut to `layers` main layers."""
    from deepseek_cpu.quantization.registry import schemes
    from deepseek_cpu.tools.shapes import converter_plan, real_config
    cfg = real_config("v3", layers)
    scheme = schemes()[scheme_name]
    _conv, specs = converter_plan(cfg)
    n_main, n_exp = cfg["num_hidden_layers"], cfg["n_routed_experts"]
    main = [{"other": 0.0, "expert": 0.0, "moe": False} for _ in range(n_main)]
    mtp = {"other": 0.0, "expert": 0.0, "head": 0.0}
    output = 0.0
    for p in specs:
        if p.name.startswith("token_embd") or p.name.endswith(".nextn.embed_tokens.weight"):
            continue  # one row a token
        t = scheme.tensor_type(p.name, p.shape, n_main, p.qtype(gguf.GGMLQuantizationType.F16))
        block, size = gguf.GGML_QUANT_SIZES[t]
        count = 1
        for d in p.shape:
            count *= int(d)
        nbytes = count // block * size
        m = re.match(r"blk\.(\d+)\.", p.name)
        if m is None:
            output += nbytes if p.name == "output.weight" else 0
            continue
        dst = main[int(m.group(1))] if int(m.group(1)) < n_main else mtp
        if ROUTED.search(p.name):
            dst["expert"] += nbytes / n_exp
            if dst is not mtp:
                dst["moe"] = True
        elif p.name.endswith(".nextn.shared_head_head.weight"):
            mtp["head"] += nbytes
        else:
            dst["other"] += nbytes
    return {"main": main, "mtp": mtp, "output": output, "chosen": cfg["num_experts_per_tok"], "total": n_exp}


def step_bytes(b: dict, k: int) -> float:
    """Bytes a batch of k tokens reads in the main model."""
    experts = distinct_experts(k, b["chosen"], b["total"])
    return b["output"] + sum(layer["other"] + (experts * layer["expert"] if layer["moe"] else 0) for layer in b["main"])


def ratios(b: dict) -> dict:
    t1 = step_bytes(b, 1)
    head = b["mtp"]["other"] + b["mtp"]["head"] + b["chosen"] * b["mtp"]["expert"]
    return {"step_gb": t1 / 1e9, "verify2": step_bytes(b, 2) / t1, "verify3": step_bytes(b, 3) / t1, "head": head / t1}


def speedup(r: dict, acceptance: float) -> float:
    return (1 + acceptance) / (r["verify2"] + r["head"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scheme", default="q4_0", help="How the file is quantized (synth --quant): q4_0, ds-q4, ...")
    ap.add_argument("--acceptance", type=float, default=0.85, help="Share of drafts kept (DeepSeek reports 0.85-0.9 for V3).")
    ap.add_argument("--measured", default=None, help="mtp_costs.py's JSON for `synth --shape v3 --layers 4`.")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = {"v3, 4 layers (3 dense, 1 MoE)": ratios(layer_bytes(4, a.scheme)),
            "v3, 61 layers (3 dense, 58 MoE)": ratios(layer_bytes(None, a.scheme))}
    print(f"scheme {a.scheme}, one draft at acceptance {a.acceptance}; ratios to one decode step\n")
    print("| model | GB a step reads | verify 2 | verify 3 | head | speed-up |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        r["speedup"] = speedup(r, a.acceptance)
        print(f"| {name}, bytes | {r['step_gb']:.2f} | {r['verify2']:.2f} | {r['verify3']:.2f} | {r['head']:.2f} | "
              f"{r['speedup']:.2f}x |")
    if a.measured:
        m = json.load(open(a.measured))
        r = {"verify2": m["verify2_over_step"], "verify3": m["verify3_over_step"], "head": m["head_over_step"]}
        r["speedup"] = speedup(r, a.acceptance)
        rows["v3, 4 layers, measured"] = r
        print(f"| v3, 4 layers, measured ({m.get('cpu', '?')}) | | {r['verify2']:.2f} | "
              f"{r['verify3']:.2f} | {r['head']:.2f} | {r['speedup']:.2f}x |")
        # the measured excess over the bytes, taken as a share of the bytes read (compute that grows
        # with the weights, as the few-token products' extra multiply-adds do): the whole model
        four, whole = rows["v3, 4 layers (3 dense, 1 MoE)"], rows["v3, 61 layers (3 dense, 58 MoE)"]
        adj = {"verify2": whole["verify2"] + r["verify2"] - four["verify2"],
               "verify3": whole["verify3"] + r["verify3"] - four["verify3"],
               "head": whole["head"] * r["head"] / four["head"]}
        adj["speedup"] = speedup(adj, a.acceptance)
        rows["v3, 61 layers, bytes + the measured excess"] = adj
        print(f"| v3, 61 layers, bytes + the 4-layer file's measured excess | | {adj['verify2']:.2f} | "
              f"{adj['verify3']:.2f} | {adj['head']:.2f} | {adj['speedup']:.2f}x |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"scheme": a.scheme, "acceptance": a.acceptance, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
