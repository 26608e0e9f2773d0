"""`deepseek-cpu experts`: which routed experts a model uses on a text (the engine's counts)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import click

from ..errors import DeepseekCpuError
from ..hookspecs import hookimpl
from ..runtime.experts import ExpertUsage, plot, reset_expert_usage, summary


def measure(model: str | os.PathLike, text: str | os.PathLike, ctx: int = 512, chunks: int | None = None,
            threads: int | None = None, progress: bool = True) -> ExpertUsage:
    """Evaluate `text` with `model` in chunks of `ctx` tokens (each from an empty cache) and
    return the routings the engine counted."""
    from tqdm import tqdm

    from ..runtime.llama import Llama
    # logits_all: llama.cpp runs the last layer's FFN only for the tokens whose logits are asked
    # for; every token's routing in every layer is what is wanted here
    llm = Llama(str(model), n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, logits_all=True, verbose=False,
                **({"n_threads": threads, "n_threads_batch": threads} if threads else {}))
    try:
        data = Path(text).read_bytes()
        tokens = llm.tokenize(data, add_bos=False, special=False)
        pieces = [tokens[i:i + ctx] for i in range(0, len(tokens), ctx)][:chunks]
        if not pieces:
            raise DeepseekCpuError(f"{text}: no tokens to evaluate")
        reset_expert_usage()
        for piece in tqdm(pieces, unit="chunk", desc="experts", leave=False, disable=not progress):
            llm.reset()
            llm.eval(piece)
        return llm.expert_usage()
    finally:
        llm.close()



PLOTS_INSTALL = "pip install 'deepseek-cpu[plots]'"


def need_matplotlib(option: str) -> None:
    """A one-line error, before any work, when `option` needs matplotlib and it is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise DeepseekCpuError(f"{option} needs matplotlib, which is not installed: {PLOTS_INSTALL}") from None


@click.command("experts")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--text", type=click.Path(exists=True, dir_okay=False), required=True, help="Text to route.")
@click.option("--ctx", type=int, default=512, show_default=True, help="Tokens per chunk.")
@click.option("--chunks", type=int, default=None, help="At most this many chunks.")
@click.option("--threads", type=int, default=None, help="Default: physical cores available.")
@click.option("--png", type=click.Path(dir_okay=False), default=None,
              help=f"Write the layer x expert heatmap and coverage curves here (needs matplotlib: {PLOTS_INSTALL}).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Write the counts here.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def experts_cmd(model, text, ctx, chunks, threads, png, json_out, quiet):
    """Which routed experts MODEL uses on TEXT: routings per layer and expert, counted by
    the engine; the share the most used experts take (coverage); a heatmap."""
    if png:
        need_matplotlib("--png")  # before measuring, which can take long
    usage = measure(model, text, ctx=ctx, chunks=chunks, threads=threads, progress=not quiet)
    click.echo(summary(usage))
    if json_out:
        Path(json_out).write_text(json.dumps(usage.to_dict()))
    if png:
        plot(usage, png, title=f"{Path(model).name} on {Path(text).name}")
        click.echo(f"wrote {png}")


@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(experts_cmd)
