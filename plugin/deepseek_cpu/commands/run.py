"""`deepseek-cpu run`: complete a prompt in the terminal, streaming the text."""
from __future__ import annotations

import time

import click

from ..hookspecs import hookimpl
from .options import open_terminal_model, terminal_options


@click.command()
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("-p", "--prompt", required=True, help="Prompt text.")
@click.option("-n", "--max-tokens", default=128, show_default=True)
@click.option("--temperature", default=0.0, show_default=True)
@terminal_options
def run(model, prompt, max_tokens, temperature, threads, n_ctx, mem_budget, prefetch, mtp, repack_cache):
    """Complete PROMPT with MODEL (a GGUF), streaming the text; tokens/s at the end."""
    llm = open_terminal_model(model, threads, n_ctx, mem_budget, prefetch, mtp, repack_cache)
    t0, n = time.time(), 0
    for chunk in llm.create_completion(prompt, max_tokens=max_tokens, temperature=temperature, stream=True):
        click.echo(chunk["choices"][0]["text"], nl=False)
        n += 1
    dt = time.time() - t0
    stats = llm.mtp_stats
    drafts = f"; MTP drafts kept {stats.acceptance:.0%}, {stats.tokens_per_step:.2f} tokens/step" if stats else ""
    click.echo(f"\n[{n} tokens in {dt:.2f} s, {n / dt if dt else 0:.1f} tok/s{drafts}]", err=True)



@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(run)
