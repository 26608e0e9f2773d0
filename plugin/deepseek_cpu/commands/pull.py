"""`deepseek-cpu pull REPO --quant q4_k_m`: a hub repo to a ready GGUF."""
from __future__ import annotations

import sys
import time

import click

from ..quantization import types as quant_types
from ..hookspecs import hookimpl
from ..hub.pipeline import pull
from .options import SchemeName


@click.command("pull")
@click.argument("repo")
@click.option("--quant", type=SchemeName(), default=None,
              help=f"Quantization scheme (`deepseek-cpu schemes` lists them; default {quant_types.DEFAULT_PULL}, "
                   f"ds-v4 for DeepSeek-V4): {'/'.join(quant_types.DIRECT)} are "
                   "written by our converter; the others are quantized by llama.cpp from a bf16 intermediate, "
                   "deleted afterwards.")
@click.option("--revision", default=None, help="Branch, tag or commit sha (default: main).")
@click.option("--token", default=None, help="Hub token for gated or private repos (default: HF_TOKEN or the "
                                            "saved login).")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Write the GGUF here instead of the cache ($DEEPSEEK_CPU_CACHE/gguf, default "
                   "~/.cache/deepseek-cpu/gguf).")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Hugging Face cache for the download (default: HF_HUB_CACHE / HF_HOME/hub).")
@click.option("--delete-snapshot", is_flag=True,
              help="Delete this revision's downloaded checkpoint from the Hugging Face cache once converted.")
@click.option("--quiet", is_flag=True, help="No progress bars or status lines; only the result.")
@click.option("--verbose", is_flag=True, help="Show llama.cpp's quantization log.")
def pull_cmd(repo, quant, revision, token, output_dir, cache_dir, delete_snapshot, quiet, verbose):
    """Download REPO (owner/name) from the Hugging Face hub, convert and quantize it to a GGUF.

    Prints the GGUF's path, then a line of Python that runs it. A second pull of the same
    repo, revision and --quant returns the cached GGUF at once."""
    t0 = time.time()
    echo = (lambda s: None) if quiet else (lambda s: click.echo(s, err=True))
    try:
        res = pull(repo, quant=quant.lower() if quant else None, revision=revision, token=token, cache_dir=cache_dir,
                   output_dir=output_dir, delete_snapshot=delete_snapshot, progress=not quiet,
                   verbose=verbose, echo=echo)
    except KeyboardInterrupt:  # a PullError is reported by the command group (cli.py)
        click.echo("interrupted; run the same command again: files already downloaded are kept", err=True)
        sys.exit(130)
    if not res.cached:
        size = res.path.stat().st_size
        echo(f"wrote {res.path.name} ({size / 2**20:.1f} MiB, {res.quant}, {res.repo}@{res.sha[:12]}) "
             f"in {time.time() - t0:.1f} s")
    click.echo(str(res.path))
    click.echo(f"python -c \"from deepseek_cpu import Llama; llm = Llama({str(res.path)!r}); "
               f"print(llm('Hello, my name is', max_tokens=32)['choices'][0]['text'])\"")


@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(pull_cmd)
