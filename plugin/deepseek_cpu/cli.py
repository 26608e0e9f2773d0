"""The `deepseek-cpu` command."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from . import __version__
from .quantization import types as quant_types
from .quantization.registry import SchemeName
from .errors import DeepseekCpuError
from .runtime.options import terminal_options


class _Group(click.Group):
    """Lets plugins add commands through the deepseek_cpu_register_commands hook, and
    reports their errors."""

    _plugins_loaded = False

    def _load(self):
        if not _Group._plugins_loaded:
            _Group._plugins_loaded = True
            from . import plugins
            plugins.load().hook.deepseek_cpu_register_commands(cli=self)

    def list_commands(self, ctx):
        self._load()
        return super().list_commands(ctx)

    def get_command(self, ctx, name):
        self._load()
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        # The one place library errors become messages: every command, built-in or from a
        # plugin, runs inside this call, so a DeepseekCpuError raised anywhere below it is
        # printed by click as a single `Error: ...` line on stderr, exit status 1, no traceback.
        try:
            return super().invoke(ctx)
        except DeepseekCpuError as e:
            raise click.ClickException(str(e)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="deepseek-cpu")
def cli():
    """DeepSeek-V2 family models on CPUs: convert checkpoints, run and inspect the engine."""


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def info(as_json):
    """Package version, llama.cpp commit, patch series, CPU features and the library loaded."""
    from .runtime.engine import engine_info
    from .runtime.resources import default_threads
    e = engine_info()
    d = {
        "version": e.version, "llama_cpp_commit": e.llama_cpp_commit, "series_sha256": e.series_sha256,
        "patches": e.patches,
        "library": e.library, "patched": e.patched, "build_info": e.build_info,
        "cpu_features": e.cpu_features, "cpu_backend": e.cpu_backend, "amx": e.amx,
        "default_threads": default_threads(),
    }
    if as_json:
        click.echo(json.dumps(d, indent=2))
        return
    click.echo(f"deepseek-cpu     {d['version']}")
    click.echo(f"llama.cpp        {d['llama_cpp_commit']}")
    click.echo(f"library          {d['library']}")
    click.echo(f"patched engine   {'yes: ' + d['build_info'] if d['patched'] else 'NO (stock or foreign libllama)'}")
    click.echo(f"series sha256    {d['series_sha256']}")
    click.echo("patches          " + ("\n                 ".join(d["patches"]) or "none"))
    click.echo(f"cpu features     {' '.join(d['cpu_features'])}")
    click.echo(f"cpu backend      {d['cpu_backend']}")
    click.echo("amx              " + ("on: prompt products of q4_0 and q4_K weights run on AMX tiles" if d["amx"] == "on"
                                    else f"not used: {d['amx']}"))
    click.echo(f"default threads  {d['default_threads']}")


@cli.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plugins_cmd(as_json):
    """List loaded plugins, their versions and the hooks each implements."""
    from .plugins import describe
    rows = describe()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['name']}  ({r['package']} {r['version']})")
        click.echo("    hooks: " + ", ".join(r["hooks"]))


@cli.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--outtype", type=click.Choice(quant_types.DIRECT), default=None,
              help="Type of the weight matrices, written by the converter itself (norms and the router stay "
                   "f32). [default: bf16]")
@click.option("--quant", type=SchemeName(), default=None,
              help="Or any quantization scheme (`deepseek-cpu schemes`): converted to a bf16 intermediate, "
                   "quantized by llama.cpp, the intermediate deleted.")
@click.option("--imatrix", type=click.Path(path_type=Path), default=None,
              help="Importance matrix for --quant (`deepseek-cpu imatrix`).")
@click.option("--tensor-type", "tensor_types", multiple=True, metavar="PATTERN=TYPE",
              help="Per-tensor override for --quant (as in `deepseek-cpu quantize`; repeatable).")
@click.option("--name", default=None, help="general.name in the GGUF (default: config's _name_or_path, "
              "else the directory name).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def convert(checkpoint, out, outtype, quant, imatrix, tensor_types, name, quiet):
    """Convert a Hugging Face CHECKPOINT directory (DeepSeek-V2/V3 family) to OUT.gguf."""
    from .quantization.quantize import convert_quantized
    if outtype and quant:
        raise click.UsageError("give --outtype or --quant, not both")
    if (imatrix or tensor_types) and not quant:
        raise click.UsageError("--imatrix and --tensor-type go with --quant")
    outtype = quant or outtype or "bf16"
    t0 = time.time()
    try:
        path = convert_quantized(checkpoint, out, outtype, imatrix=imatrix, tensor_types=tensor_types,
                                 progress=not quiet, name=name)
    except OSError as e:  # e.g. a shard that cannot be read: the user's file, not a bug of ours
        if isinstance(e, DeepseekCpuError):  # MissingShard, MissingTokenizer: left to _Group.invoke
            raise
        raise click.ClickException(f"{e.filename + ': ' if e.filename else ''}{e.strerror or e}") from None
    except KeyboardInterrupt:
        click.echo("interrupted; nothing was written", err=True)
        sys.exit(130)
    from .quantization.quantize import written_types
    bpw, _types = written_types(path)  # an AWQ/GPTQ import keeps INT4 blocks whatever the outtype
    click.echo(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, {outtype}, {bpw:.2f} bits/weight) "
               f"in {time.time() - t0:.1f} s")


@cli.command()
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("-p", "--prompt", required=True, help="Prompt text.")
@click.option("-n", "--max-tokens", default=128, show_default=True)
@click.option("--temperature", default=0.0, show_default=True)
@terminal_options
def run(model, prompt, max_tokens, temperature, threads, n_ctx, mem_budget, prefetch):
    """Complete PROMPT with MODEL (a GGUF), streaming the text; tokens/s at the end."""
    from .runtime.llama import open_for_terminal
    llm = open_for_terminal(model, threads, n_ctx, mem_budget, prefetch)
    t0, n = time.time(), 0
    for chunk in llm.create_completion(prompt, max_tokens=max_tokens, temperature=temperature, stream=True):
        click.echo(chunk["choices"][0]["text"], nl=False)
        n += 1
    dt = time.time() - t0
    click.echo(f"\n[{n} tokens in {dt:.2f} s, {n / dt if dt else 0:.1f} tok/s]", err=True)


def main():
    cli()
