"""`deepseek-cpu eval`: perplexity and KL divergence of a quantized GGUF against its reference."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..hookspecs import hookimpl
from ..quantization.evaluate import DEFAULT_CTX, evaluate, format_table


@click.command("eval")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--ref", "ref", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The reference GGUF (the f16/bf16/q8_0 of the same model).")
@click.option("--text", "text", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The text to evaluate on (e.g. wiki.test.raw).")
@click.option("--ctx", "n_ctx", type=int, default=None,
              help=f"Tokens per chunk (default {DEFAULT_CTX}, or the models' context if smaller).")
@click.option("--chunks", "max_chunks", type=int, default=None, help="Evaluate at most this many chunks.")
@click.option("--threads", type=int, default=None, help="Default: physical cores available.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (probabilities as fractions).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def eval_cmd(model, ref, text, n_ctx, max_chunks, threads, as_json, quiet):
    """Perplexity, KL divergence, top-1 agreement and RMS Δp of MODEL (a GGUF) against
    --ref on --text, as llama-perplexity --kl-divergence computes them."""
    res = evaluate(model, ref, text, n_ctx=n_ctx, max_chunks=max_chunks, threads=threads,
                   progress=not quiet)
    click.echo(json.dumps(res.to_dict(), indent=2) if as_json else format_table(res))


@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(eval_cmd)
