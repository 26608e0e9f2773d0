"""`deepseek-cpu schemes`, `quantize` and `imatrix`."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from ..hookspecs import hookimpl
from .options import SchemeName


def reference_bits_per_weight(scheme, shape: str = "v2-lite") -> float:
    """Bits per weight `scheme` gives the real `shape` model's tensors (predicted, no file)."""
    from ..tools.shapes import converter_plan, real_config
    cfg = real_config(shape)
    _conv, specs = converter_plan(cfg)
    import gguf
    return scheme.bits_per_weight([(p.name, p.shape, p.qtype(gguf.GGMLQuantizationType.F16)) for p in specs],
                                  cfg["num_hidden_layers"])


@click.command("schemes")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def schemes_cmd(as_json):
    """List the quantization schemes (built-in and from plugins), with bits per weight on
    DeepSeek-V2-Lite's tensors ("~": llama.cpp's recipe for that type is approximated)."""
    from ..quantization.registry import schemes
    rows = []
    for s in schemes().values():
        rows.append({"name": s.name, "bits_per_weight": round(reference_bits_per_weight(s), 2),
                     "exact": s.exact_prediction, "imatrix": s.wants_imatrix, "plugin": s.plugin,
                     "base": s.base, "rules": [list(r) for r in s.rules], "description": s.description})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'scheme':<12} {'bits/w':>7}  {'imatrix':<8} description")
    for r in rows:
        bpw = f"{'' if r['exact'] else '~'}{r['bits_per_weight']:.2f}"
        click.echo(f"{r['name']:<12} {bpw:>7}  {'wanted' if r['imatrix'] else '':<8} {r['description']}"
                   + ("" if r["plugin"] == "deepseek_cpu.quantization.builtin" else f"  [{r['plugin']}]"))
    click.echo("\nbits/w: on DeepSeek-V2-Lite's tensors. Rules of a scheme: `deepseek-cpu schemes --json`.")


@click.command("quantize")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--scheme", type=SchemeName(), default="q4_k_m", show_default=True,
              help="Quantization scheme (`deepseek-cpu schemes` lists them).")
@click.option("--imatrix", type=click.Path(path_type=Path), default=None,
              help="Importance matrix of this model (`deepseek-cpu imatrix`).")
@click.option("--tensor-type", "tensor_types", multiple=True, metavar="PATTERN=TYPE",
              help="Override: tensors whose name matches the regular expression PATTERN get GGML type TYPE "
                   "(before the scheme's own rules; repeatable), e.g. ffn_down_exps=q6_K.")
@click.option("--allow-requantize", is_flag=True, help="Quantize a file that is already quantized (loses quality).")
@click.option("--threads", type=int, default=None, help="Default: physical cores available.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--verbose", is_flag=True, help="Show llama.cpp's quantization log.")
def quantize_cmd(src, out, scheme, imatrix, tensor_types, allow_requantize, threads, quiet, verbose):
    """Quantize GGUF SRC (bf16/f16/f32) into OUT by a scheme, with llama.cpp's quantizer."""
    from ..quantization.quantize import quantize
    try:
        r = quantize(src, out, scheme, imatrix=imatrix, tensor_types=tensor_types,
                     allow_requantize=allow_requantize, nthread=threads, progress=not quiet, verbose=verbose)
    except KeyboardInterrupt:
        click.echo("interrupted; nothing was written", err=True)
        sys.exit(130)
    types = ", ".join(f"{n} {t}" for t, n in sorted(r.types.items(), key=lambda kv: -kv[1]))
    click.echo(f"wrote {r.path} ({r.size / 2**20:.1f} MiB, {r.scheme}, {r.bits_per_weight:.2f} bits/weight; "
               f"tensors: {types}) in {r.seconds:.1f} s")
    if r.fallbacks:
        click.echo(f"{len(r.fallbacks)} kind(s) of tensor fell back to another type (rows not whole blocks of the "
                   f"scheme's):\n  " + "\n  ".join(r.fallbacks))


@click.command("imatrix")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--text", type=click.Path(path_type=Path), required=True, help="Calibration text (UTF-8).")
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="Where to write the matrix (GGUF).")
@click.option("--ctx", type=int, default=512, show_default=True, help="Tokens per chunk.")
@click.option("--chunks", type=int, default=None, help="At most this many chunks (default: the whole text).")
@click.option("--threads", type=int, default=None, help="Default: physical cores available.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def imatrix_cmd(model, text, out, ctx, chunks, threads, quiet):
    """An importance matrix for quantizing MODEL, from calibration text: llama.cpp's
    llama-imatrix, with per-expert statistics for the routed experts."""
    from ..quantization.imatrix import make_imatrix
    t0 = time.time()
    try:
        m = make_imatrix(model, text, out, ctx=ctx, chunks=chunks, threads=threads, progress=not quiet)
    except KeyboardInterrupt:
        click.echo("interrupted; nothing was written", err=True)
        sys.exit(130)
    click.echo(f"wrote {out} in {time.time() - t0:.1f} s: {m.summary()}")


@hookimpl
def deepseek_cpu_register_commands(cli):
    for c in (schemes_cmd, quantize_cmd, imatrix_cmd):
        cli.add_command(c)
