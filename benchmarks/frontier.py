"""The quality frontier below and around 4 bits: our schemes against ik_llama.cpp's types, by size.

ik_llama.cpp is what CPU users of DeepSeek's big models quantize with (its IQ2_KS .. IQ5_KS types,
in recipes that keep what every token reads at ~6 bits and put the routed experts low). This
measures both on the same trained model and text, each with its own tools end to end, so that
neither engine's arithmetic judges the other:

  ours  the model converted by our converter to f32 (the reference) and bf16 (what is
        quantized); our importance matrix from the calibration text; each scheme quantized
        with it; `deepseek-cpu eval` (llama-perplexity's statistics) against the f32 file.
  ik    the same f32 weights in the GGUF form ik_llama.cpp takes for a model of this size
        (ik_form below); ik's llama-imatrix on the same calibration text; its llama-quantize
        with --custom-q recipes (IK_RECIPES: our mixes' layout with its types); its
        llama-perplexity --kl-divergence against its own run of that f32 file.

Sizes are bits per weight three ways: of the file measured here (this model's routed experts are
about half its weights), and predicted for DeepSeek-V3's and V2-Lite's real tensors, where the
routed experts are 97% and 90% of the weights (what a user's file size follows).

    python benchmarks/frontier.py --ik /work/ik/build/bin --dir /tmp/frontier --json out.json --png out.png
    python benchmarks/frontier.py --ik ... --outliers 16    # the outlier-channel form of the model
    python benchmarks/frontier.py --ik ... --experts-only   # the routed experts' types alone

--experts-only compares the types of the routed experts alone: everything else is q8_0 in both
engines' files (our ds-q4-q8 with the experts' type overridden; ik's Q8_0 file type with a
--custom-q rule for the experts), all three expert tensors in one type. On this small model the
embeddings and attention weigh far more than on DeepSeek's (where the experts are 97% of V3's
weights), and at ~4 bits they set a floor under the KL divergence that hides the experts' types.

ik_llama.cpp is never built or shipped by this project: point --ik at your own build's bin/
(llama-imatrix, llama-quantize, llama-perplexity).
"""
from __future__ import annotations

import argparse
import json
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# our schemes measured by default (every band we have: 3.0, 3.5, ~4.3-4.8, 5.5 on V3)
OUR_SCHEMES = ("ds-q2", "ds-q2-q8", "ds-q3", "ds-q3-q8", "ds-q4-lean", "ds-q4", "ds-q4-k", "q5_k_m")

# ik_llama.cpp's types: bytes per 256-weight block (ggml-common.h's static_asserts at ik 8337e4c;
# the KS types add one float per row, ignored here)
IK_BLOCK_BYTES = {"iq2_ks": 70, "iq2_k": 76, "iq2_kl": 86, "iq3_ks": 102, "iq3_k": 110, "iq4_ks": 136,
                  "iq4_k": 144, "iq5_ks": 168, "iq5_k": 176, "iq6_k": 212}
# --experts-only: the experts' types compared, ours (llama.cpp's) and ik's
OUR_EXPERT_TYPES = ("q2_K", "iq2_xs", "iq2_s", "iq3_xxs", "q3_K", "iq3_s", "iq4_xs", "q4_0", "q4_K", "q5_K",
                    "q6_K")
IK_EXPERT_TYPES = ("iq2_ks", "iq2_k", "iq2_kl", "iq3_ks", "iq3_k", "iq4_ks", "iq4_k", "iq5_ks", "iq5_k")
# llama.cpp's types the recipes also use: (block weights, block bytes)
STOCK_BLOCKS = {"q8_0": (32, 34), "q5_0": (32, 22), "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2)}


def experts_only_scheme(expert_type: str):
    """Our ds-q4-q8 (everything q8_0 but the routed experts) with the experts in `expert_type`."""
    from deepseek_cpu.quantization.registry import schemes
    from deepseek_cpu.quantization.schemes import ROUTED_EXPERTS, Scheme
    base = schemes()["ds-q4-q8"]
    return Scheme(f"experts-{expert_type}", f"ds-q4-q8 with routed experts {expert_type}", base.base,
                  ((ROUTED_EXPERTS, expert_type), *base.rules))

ROUTED = r"ffn_(gate|up|down)_exps"
DOWN = r"ffn_down_exps"
NARROW = r"attn_(k_b|v_b|kv_b)"   # rows of 64-512 weights (kv_b: kv_lora_rank): q8_0, as our mixes' fallback
DENSE = r"ffn_(gate|up|down)\.weight"   # the dense lead layers' FFN: q8_0, as in our mixes
EVERY_TOKEN = r"attn_|ffn_(gate|up|down)_shexp"


def ik_recipe(experts: str, down: str | None = None, embeddings: str = "iq6_k",
              output: str = "q8_0") -> tuple[tuple[str, str], ...]:
    """Our mixes' layout in ik's types: experts low (ffn_down one step up at 2 bits), attention and
    shared experts at ~6.6 bits (iq6_k; q8_0 for rows no 256-block fits), the dense layers' FFN
    q8_0; embeddings and output as our mixes have them (q6_K and q8_0)."""
    return ((DOWN, down or experts), (ROUTED, experts), (NARROW, "q8_0"), (DENSE, "q8_0"), (EVERY_TOKEN, "iq6_k"),
            (r"token_embd", embeddings), (r"^output\.weight", output))


IK_RECIPES = {
    "ik-iq2_ks": ik_recipe("iq2_ks", down="iq3_ks"),
    "ik-iq2_kl": ik_recipe("iq2_kl", down="iq3_k"),
    "ik-iq3_ks": ik_recipe("iq3_ks"),
    "ik-iq3_k": ik_recipe("iq3_k"),
    "ik-iq4_ks": ik_recipe("iq4_ks"),
    "ik-iq4_k": ik_recipe("iq4_k"),
    "ik-iq5_ks": ik_recipe("iq5_ks"),
}


def _bits(tname: str, ne0: int) -> float:
    """Bits per weight of ik/stock type `tname` for rows of ne0 weights (ik falls back to q5_0
    where a 256-weight block does not fit, as llama.cpp does for its k-quants)."""
    if tname in IK_BLOCK_BYTES:
        if ne0 % 256:
            tname = "q5_0"
        else:
            return IK_BLOCK_BYTES[tname] * 8 / 256
    block, size = STOCK_BLOCKS[tname]
    return size * 8 / block


def recipe_bits_per_weight(recipe, shape: str) -> float:
    """Predicted bits per weight of an ik recipe on a real model's tensors (our converter's plan)."""
    import gguf
    from deepseek_cpu.tools.shapes import converter_plan, real_config
    cfg = real_config(shape)
    _conv, specs = converter_plan(cfg)
    bits = n = 0
    for p in specs:
        count = 1
        for d in p.shape:
            count *= int(d)
        bits += _recipe_bits(recipe, p.name, p.shape, p.qtype(gguf.GGMLQuantizationType.F16)) * count
        n += count
    return bits / n


def _recipe_bits(recipe, name: str, shape, ctype) -> float:
    """Bits per weight an ik recipe gives one tensor: f32 where our converter keeps f32 (norms,
    biases, 1-D), else the first matching rule's type, q8_0 (the file type) if none."""
    import gguf
    if ctype == gguf.GGMLQuantizationType.F32 or len(shape) < 2:
        return _bits("f32", int(shape[-1]))
    return _bits(next((ty for pat, ty in recipe if re.search(pat, name)), "q8_0"), int(shape[-1]))


def decode_gb_per_token(tensor_bits, shape: str = "v3") -> float:
    """GB of weights one decoded token reads on a real model's tensors: everything but the routed
    experts (only experts_per_tok of n_routed_experts of those), the embeddings (one row) and the
    MTP block (not run without drafts). A file's size decides whether it fits; this, at a given
    memory bandwidth, decides its decode speed. tensor_bits(name, shape, converter type) -> bits
    per weight of that tensor."""
    import gguf
    from deepseek_cpu.tools.shapes import converter_plan, real_config
    cfg = real_config(shape)
    _conv, specs = converter_plan(cfg)
    share = cfg["num_experts_per_tok"] / cfg["n_routed_experts"]
    main = cfg["num_hidden_layers"]
    total = 0.0
    for p in specs:
        layer = re.match(r"blk\.(\d+)\.", p.name)
        if p.name.startswith("token_embd") or (layer and int(layer.group(1)) >= main):
            continue
        count = 1
        for d in p.shape:
            count *= int(d)
        bits = tensor_bits(p.name, p.shape, p.qtype(gguf.GGMLQuantizationType.F16))
        total += bits * count * (share if re.search(ROUTED, p.name) else 1.0) / 8
    return total / 1e9


def scheme_decode_gb(scheme, shape: str = "v3") -> float:
    """decode_gb_per_token for one of our schemes."""
    import gguf
    from deepseek_cpu.tools.shapes import real_config
    n_layer = real_config(shape)["num_hidden_layers"]

    def bits(name, shp, ctype):
        block, size = gguf.GGML_QUANT_SIZES[scheme.tensor_type(name, shp, n_layer, ctype)]
        return size * 8 / block
    return decode_gb_per_token(bits, shape)


def recipe_decode_gb(recipe, shape: str = "v3") -> float:
    """decode_gb_per_token for an ik recipe (types as recipe_bits_per_weight picks them)."""
    return decode_gb_per_token(lambda name, shp, ctype: _recipe_bits(recipe, name, shp, ctype), shape)


def file_bits_per_weight(path: Path) -> float:
    """Bits per weight of a GGUF's tensors from its header alone (ik's types are unknown to
    gguf-py, so sizes come from the gaps between tensor offsets)."""
    with open(path, "rb") as f:
        data = f.read(8 << 20)
    o = 4
    _ver, n_t, n_kv = struct.unpack_from("<IQQ", data, o)
    o += 20

    def string(o):
        (n,) = struct.unpack_from("<Q", data, o)
        return data[o + 8:o + 8 + n].decode("utf-8", "replace"), o + 8 + n
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    alignment = 32

    def value(t, o):
        if t == 8:
            return string(o)
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, o)
            o += 12
            vals = []
            for _ in range(n):
                v, o = value(et, o)
                vals.append(v)
            return vals, o
        fmt = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}[t]
        return struct.unpack_from("<" + fmt, data, o)[0], o + sizes[t]
    for _ in range(n_kv):
        k, o = string(o)
        (t,) = struct.unpack_from("<I", data, o)
        v, o = value(t, o + 4)
        if k == "general.alignment":
            alignment = v
    tensors = []
    for _ in range(n_t):
        name, o = string(o)
        (nd,) = struct.unpack_from("<I", data, o)
        dims = struct.unpack_from(f"<{nd}Q", data, o + 4)
        o += 4 + 8 * nd
        _ty, off = struct.unpack_from("<IQ", data, o)
        o += 12
        count = 1
        for d in dims:
            count *= d
        tensors.append((off, count))
    start = (o + alignment - 1) // alignment * alignment
    end = path.stat().st_size - start
    tensors.sort()
    bits = sum((nxt - off) * 8 for (off, _), (nxt, _) in zip(tensors, tensors[1:] + [(end, 0)]))
    return bits / sum(c for _, c in tensors)


def ik_form(src: Path, dst: Path) -> Path:
    """`src` (our f32 GGUF) with kv_b_proj whole again (attn_kv_b) and one KV head per query head:
    the pre-MLA layout, which ik_llama.cpp turns into its MLA tensors at load. Its loader takes the
    split MLA layout (attn_k_b, attn_v_b, one KV head) only with DeepSeek's real head sizes
    (576 / 512, rope 64) and aborts on the trained test model's smaller ones. The same weights:
    per head, attn_k_b is kv_b's key rows transposed and attn_v_b its value rows."""
    import gguf
    import numpy as np
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    f = {name: fld.contents() for name, fld in r.fields.items()}
    n_head = f[f"{arch}.attention.head_count"]
    nope, v_dim = f[f"{arch}.attention.key_length_mla"] - f[f"{arch}.rope.dimension_count"], \
        f[f"{arch}.attention.value_length_mla"]
    keys = {f"{arch}.attention.head_count_kv": n_head, f"{arch}.attention.key_length_mla": None,
            f"{arch}.attention.value_length_mla": None,
            f"{arch}.attention.key_length": nope + f[f"{arch}.rope.dimension_count"],
            f"{arch}.attention.value_length": v_dim}
    w = gguf.GGUFWriter(dst, arch)
    for name, fld in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = keys.pop(name) if name in keys else fld.contents()
        if value is not None:
            w.add_key_value(name, value, fld.types[0], sub_type=fld.types[-1] if len(fld.types) > 1 else None)
    tensors = {t.name: np.array(t.data) for t in r.tensors}
    for t in r.tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise SystemExit(f"ik_form: {src} must be an f32 conversion ({t.name} is {t.tensor_type.name})")
        if t.name.endswith("attn_v_b.weight"):
            continue
        if t.name.endswith("attn_k_b.weight"):
            k_b = tensors[t.name].reshape(n_head, -1, nope)                       # [head, kv_lora, nope]
            v_b = tensors[t.name.replace("attn_k_b", "attn_v_b")].reshape(n_head, v_dim, -1)  # [head, v, kv_lora]
            kv_b = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)          # [head, nope + v, kv_lora]
            w.add_tensor(t.name.replace("attn_k_b", "attn_kv_b"), kv_b.reshape(n_head * (nope + v_dim), -1))
            continue
        w.add_tensor(t.name, tensors[t.name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _run(cmd: list, log: Path) -> str:
    t = time.perf_counter()
    # in the logs' directory: ik's tools write llama.log / main.log into their working directory
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=log.parent)
    log.write_text(p.stdout + "\n--- stderr ---\n" + p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"{Path(str(cmd[0])).name} failed ({p.returncode}), see {log}:\n" + p.stderr[-2000:])
    print(f"  {Path(str(cmd[0])).name} {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return p.stdout + p.stderr


def _ik_kld(text: str) -> dict:
    num = r"(-?[0-9.]+(?:e[-+]?\d+)?)"
    out = {}
    for key, pat in (("kld_mean", rf"Mean\s+KLD:\s*{num}\s*±\s*{num}"), ("same_top", rf"Same top p:\s*{num}\s*±\s*{num}"),
                     ("ppl_model", rf"Mean PPL\(Q\)\s*:\s*{num}"), ("kld_p99", rf"99\.0%\s+KLD:\s*{num}")):
        m = re.search(pat, text)
        if m:
            out[key] = float(m.group(1))
            if key == "kld_mean":
                out["kld_mean_err"] = float(m.group(2))
    if "same_top" in out:
        out["same_top"] /= 100
    if "kld_mean" not in out:
        raise SystemExit("llama-perplexity printed no KLD summary")
    return out


def measure_ik(ik: Path, ref: Path, a, recipes: dict, d: Path):
    """(name, recipe, file, KLD statistics) of each ik recipe: its imatrix, quantizer and
    llama-perplexity on the ik form of our f32 conversion `ref`."""
    ik = ik.resolve()
    logs = d / "ik-logs"
    logs.mkdir(exist_ok=True)
    ik_ref = ik_form(ref, d / "ik-f32.gguf")
    ik_imx = d / "ik-imatrix.dat"
    _run([ik / "llama-imatrix", "-m", ik_ref, "-f", a.calibration, "-c", a.ctx, "-t", a.threads, "-o", ik_imx],
         logs / "imatrix.txt")
    base = d / "ik-f32.kld"
    _run([ik / "llama-perplexity", "-m", ik_ref, "-f", a.text, "-c", a.ctx, "-t", a.threads,
          "--kl-divergence-base", base], logs / "base.txt")
    for name, recipe in recipes.items():
        path = d / f"{name}.gguf"
        custom = ",".join(f"{pat}={ty}" for pat, ty in recipe)
        _run([ik / "llama-quantize", "--imatrix", ik_imx, "--custom-q", custom, ik_ref, path, "Q8_0", a.threads],
             logs / f"quantize-{name}.txt")
        out = _run([ik / "llama-perplexity", "-m", path, "-f", a.text, "-c", a.ctx, "-t", a.threads,
                    "--kl-divergence-base", base, "--kl-divergence"], logs / f"kld-{name}.txt")
        yield name, recipe, path, _ik_kld(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ik", required=True, type=Path, help="ik_llama.cpp's bin/ (llama-imatrix, -quantize, -perplexity)")
    ap.add_argument("--checkpoint", default=str(REPO / "tests/fixtures/trained_v2"))
    ap.add_argument("--calibration", default=str(REPO / "tests/fixtures/text/calibration.txt"))
    ap.add_argument("--text", default=str(REPO / "tests/fixtures/text/heldout.txt"))
    ap.add_argument("--schemes", default=",".join(OUR_SCHEMES))
    ap.add_argument("--ik-recipes", default=",".join(IK_RECIPES))
    ap.add_argument("--ctx", type=int, default=128, help="Tokens per chunk (eval and imatrix), as schemes_quality.py.")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--outliers", type=float, default=None, metavar="F",
                    help="Measure the checkpoint's equivalent with outlier channels F times larger.")
    ap.add_argument("--experts-only", action="store_true",
                    help="Compare the routed experts' types alone (everything else q8_0 in both).")
    ap.add_argument("--engines", choices=("both", "ours", "ik"), default="both")
    ap.add_argument("--dir", default="/tmp/frontier", type=Path)
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None)
    a = ap.parse_args()
    from deepseek_cpu.conversion.convert import convert
    from deepseek_cpu.quantization.evaluate import evaluate
    from deepseek_cpu.quantization.imatrix import make_imatrix
    from deepseek_cpu.quantization.quantize import quantize
    from deepseek_cpu.quantization.registry import schemes
    from deepseek_cpu.commands.quantize import reference_bits_per_weight
    d = a.dir.resolve()
    d.mkdir(parents=True, exist_ok=True)
    a.calibration, a.text = Path(a.calibration).resolve(), Path(a.text).resolve()
    if a.outliers:
        sys.path.insert(0, str(REPO / "tests" / "fixtures"))
        from outlier_channels import amplify_checkpoint
        amplify_checkpoint(a.checkpoint, d / f"checkpoint-x{a.outliers:g}", factor=a.outliers)
        a.checkpoint = d / f"checkpoint-x{a.outliers:g}"
    ref = convert(a.checkpoint, d / "f32.gguf", outtype="f32", progress=False)
    src = convert(a.checkpoint, d / "bf16.gguf", outtype="bf16", progress=False)
    rows = []

    def add(engine, name, path, r, v3, v2lite, gb):
        row = {"engine": engine, "scheme": name, "file": str(path), "bits_per_weight_here": file_bits_per_weight(path),
               "bits_per_weight_v3": v3, "bits_per_weight_v2_lite": v2lite, "decode_gb_per_token_v3": gb, **r}
        rows.append(row)
        print(f"{engine:4s} {name:<11} {row['bits_per_weight_v3']:5.2f} b/w (V3)  kld {row['kld_mean']:.5f}  "
              f"top1 {row.get('same_top', 0):.4f}", file=sys.stderr)

    # ours
    imx = make_imatrix(src, a.calibration, d / "imatrix.gguf", ctx=a.ctx, progress=False)
    known = schemes()
    ours = [experts_only_scheme(t) for t in OUR_EXPERT_TYPES] if a.experts_only else \
        [known[name] for name in a.schemes.split(",")]
    ik_recipes = {f"ik-experts-{t}": ((ROUTED, t),) for t in IK_EXPERT_TYPES} if a.experts_only else \
        {name: IK_RECIPES[name] for name in a.ik_recipes.split(",")}
    for s in (ours if a.engines != "ik" else ()):
        name = s.name
        path = d / f"ours-{name}.gguf"
        quantize(src, path, s, imatrix=imx.path, progress=False)
        r = evaluate(path, ref, a.text, n_ctx=a.ctx, progress=False).to_dict()
        add("ours", name, path, {k: r[k] for k in ("kld_mean", "kld_mean_err", "kld_p99", "same_top", "ppl_model")},
            reference_bits_per_weight(s, "v3"), reference_bits_per_weight(s, "v2-lite"), scheme_decode_gb(s))
    if a.engines != "ours":  # ik_llama.cpp, its own tools end to end
        for name, recipe, path, result in measure_ik(a.ik, ref, a, ik_recipes, d):
            add("ik", name, path, result, recipe_bits_per_weight(recipe, "v3"), recipe_bits_per_weight(recipe, "v2-lite"),
                recipe_decode_gb(recipe))
    rows.sort(key=lambda r: r["bits_per_weight_v3"])
    form = ("outliers x%g" % a.outliers if a.outliers else "plain") + (", experts only" if a.experts_only else "")
    print(f"\nheld-out: {Path(a.text).name}, ctx {a.ctx}; {form}\n")
    print("| engine | scheme | b/w V3 | GB a V3 token reads | b/w V2-Lite | b/w here | KLD mean | KLD p99 | same top-1 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['engine']} | {r['scheme']} | {r['bits_per_weight_v3']:.2f} | {r['decode_gb_per_token_v3']:.2f} | "
              f"{r['bits_per_weight_v2_lite']:.2f} | "
              f"{r['bits_per_weight_here']:.2f} | {r['kld_mean']:.5f} ± {r['kld_mean_err']:.5f} | "
              f"{r.get('kld_p99', float('nan')):.4f} | {100 * r.get('same_top', float('nan')):.2f}% |")
    if a.json:
        Path(a.json).write_text(json.dumps({"outliers": a.outliers, "experts_only": a.experts_only, "ctx": a.ctx,
                                            "rows": rows}, indent=2))
    if a.png:
        plot(rows, a.png, f"trained tiny DeepSeek-V2, {form}")


def plot(rows, out, title) -> None:
    """Two panels: KL divergence against the file's size (does it fit) and against the bytes a
    decoded token reads (how fast it decodes), each with each engine's frontier."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    axes_keys = (("bits_per_weight_v3", "bits per weight on DeepSeek-V3's tensors (file size)"),
                 ("decode_gb_per_token_v3", "GB of weights a decoded V3 token reads"))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (key, label) in zip(axes, axes_keys):
        for engine, color in (("ours", "#2b7bba"), ("ik", "#d9822b")):
            pts = sorted((r[key], r["kld_mean"], r["scheme"]) for r in rows if r["engine"] == engine and key in r)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", color=color,
                    label="deepseek-cpu" if engine == "ours" else "ik_llama.cpp")
            front, best = [], float("inf")  # the frontier: the least divergence at this size or below
            for x, y, _ in pts:
                if y < best:
                    best = y
                    front.append((x, y))
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color=color, alpha=0.6)
            for x, y, name in pts:
                ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("KL divergence to f32 (mean, held-out text)")
    axes[0].legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
