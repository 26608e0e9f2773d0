"""Quality of each quantization scheme on a model with real structure, against its f32.

Converts CHECKPOINT (default: the tiny DeepSeek-V2 trained on Python's standard library,
tests/fixtures/trained_v2) to f32 (the reference) and bf16 (what is quantized), makes an
importance matrix from the calibration text, quantizes by every scheme with and without it,
and measures each on held-out text with `deepseek-cpu eval`: perplexity, KL divergence to the
f32 model (mean, 99th percentile), top-1 agreement, RMS Δp. Prints a Markdown table.

    python benchmarks/schemes_quality.py --dir /tmp/quality
    python benchmarks/schemes_quality.py --schemes q4_k_m,ds-q4 --json out.json
    python benchmarks/schemes_quality.py --outliers 16   # the same model with real LLMs' outlier channels

--outliers F first rewrites the checkpoint into its equivalent whose products' inputs have a few
channels F times larger (tests/fixtures/outlier_channels.py): the same logits in float, the
quantization problem of a real model, where importance matrices matter.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default=str(REPO / "tests/fixtures/trained_v2"))
    ap.add_argument("--calibration", default=str(REPO / "tests/fixtures/text/calibration.txt"))
    ap.add_argument("--text", default=str(REPO / "tests/fixtures/text/heldout.txt"))
    ap.add_argument("--schemes", default="q4_0,q4_k_m,iq4_xs,ds-q4-lean,ds-q4,ds-q4-q8,ds-q4-k")
    ap.add_argument("--ctx", type=int, default=128, help="Tokens per chunk (eval and imatrix).")
    ap.add_argument("--dir", default="/tmp/schemes-quality")
    ap.add_argument("--json", default=None)
    ap.add_argument("--imatrix", choices=("both", "yes", "no"), default="both",
                    help="Quantize each scheme with the importance matrix, without, or both (default).")
    ap.add_argument("--outliers", type=float, default=None, metavar="F",
                    help="Quantize the checkpoint's equivalent with outlier channels F times larger.")
    a = ap.parse_args()
    from deepseek_cpu.conversion.convert import convert
    from deepseek_cpu.quantization.evaluate import evaluate
    from deepseek_cpu.quantization.imatrix import make_imatrix
    from deepseek_cpu.quantization.quantize import quantize
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    if a.outliers:
        sys.path.insert(0, str(REPO / "tests" / "fixtures"))
        from outlier_channels import amplify_checkpoint
        amplify_checkpoint(a.checkpoint, d / f"checkpoint-x{a.outliers:g}", factor=a.outliers)
        a.checkpoint = d / f"checkpoint-x{a.outliers:g}"
    ref = convert(a.checkpoint, d / "f32.gguf", outtype="f32", progress=False)
    src = convert(a.checkpoint, d / "bf16.gguf", outtype="bf16", progress=False)
    imx = make_imatrix(src, a.calibration, d / "imatrix.gguf", ctx=a.ctx, progress=False)
    print(f"imatrix: {imx.summary()}", file=sys.stderr)
    rows = []
    for name in ["bf16", *a.schemes.split(",")]:
        variants = {"both": (False, True), "yes": (True,), "no": (False,)}[a.imatrix]
        for use_imatrix in ((False,) if name == "bf16" else variants):
            if name == "bf16":
                path, bpw = src, 16.0
            else:
                path = d / f"{name}{'-imatrix' if use_imatrix else ''}.gguf"
                q = quantize(src, path, name, imatrix=imx.path if use_imatrix else None, progress=False)
                bpw = q.bits_per_weight
            r = evaluate(path, ref, a.text, n_ctx=a.ctx, progress=False)
            rows.append({"scheme": name, "imatrix": use_imatrix, "bits_per_weight": bpw,
                         "size": path.stat().st_size, **r.to_dict()})
            print(f"{name:<11} {'imatrix' if use_imatrix else '':<8} {bpw:5.2f} b/w  ppl {r.ppl_model:.4f}  "
                  f"kld {r.kld_mean:.5f}  top1 {r.same_top:.4f}", file=sys.stderr)
    base = next(r for r in rows if r["scheme"] == "bf16")
    print(f"\nheld-out: {Path(a.text).name}, {base['n_scored']} scored tokens, ctx {a.ctx}; "
          f"f32 perplexity {base['ppl_ref']:.4f}\n")
    print("| scheme | imatrix | bits/weight | size KiB | PPL | KLD mean | KLD p99 | same top-1 | RMS Δp |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['scheme']} | {'yes' if r['imatrix'] else 'no'} | {r['bits_per_weight']:.2f} | "
              f"{r['size'] / 1024:.0f} | {r['ppl_model']:.4f} | {r['kld_mean']:.5f} ± {r['kld_mean_err']:.5f} | "
              f"{r['kld_p99']:.4f} | {100 * r['same_top']:.2f}% | {100 * r['rms_dp']:.3f}% |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
