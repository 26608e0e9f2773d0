"""Command-line options and parameter types shared by several commands: those that open a model
in this process (run, chat), --cpus (serve, rpc-worker), and a quantization scheme's name. Light
to import (no llama_cpp): the CLI imports this at start-up."""
from __future__ import annotations

import os

import click

from ..quantization.registry import UnknownScheme, get as get_scheme
from ..quantization.schemes import Scheme


def cpu_set_option(cpus: str | None) -> set[int] | None:
    """--cpus LIST as a set of CPUs this process may run on (None: not given); a bad list or a CPU
    outside this process's affinity is a usage error naming the option."""
    if not cpus:
        return None
    from ..runtime.resources import parse_cpu_list
    try:
        cpu_set = parse_cpu_list(cpus)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--cpus") from None
    allowed = os.sched_getaffinity(0)
    if not cpu_set <= allowed:
        raise click.BadParameter(f"CPUs {sorted(cpu_set - allowed)} are not available to this process "
                                 f"(allowed: {sorted(allowed)})", param_hint="--cpus")
    return cpu_set


# --mtp alone drafts one token a step; --mtp N drafts N (the same tokens come out either way)
MTP_OPTION = click.option(
    "--mtp", type=click.IntRange(0, 3), is_flag=False, flag_value=1, default=0, metavar="[N]",
    help="Draft N tokens (default 1) a step with the model's own multi-token-prediction head "
         "(DeepSeek-V3/R1/V3.1/V3.2); same output, more tokens per step.")

# --repack-cache alone: the default directory (<cache root>/repack); --repack-cache DIR: that one
REPACK_CACHE_OPTION = click.option(
    "--repack-cache", is_flag=False, flag_value="", default=None, metavar="[DIR]",
    help="Keep the repacked weights on disk (default directory: <cache>/repack) and map them at later "
         "loads: fast loads for one more file the size of the weights.")


def terminal_options(command):
    """The options of the commands that open a model in this process (run, chat): threads,
    context, memory budget, prefetch policy, MTP drafts, repack cache; open_for_terminal takes them."""
    for option in reversed((
        click.option("--threads", type=int, default=None, help="Default: physical cores available."),
        click.option("--ctx", "n_ctx", type=int, default=None, help="Context length (default: fits memory)."),
        click.option("--mem-budget", default=None, metavar="SIZE",
                     help="Run within SIZE of memory (e.g. 4G): the routed experts used from the file mapping."),
        click.option("--prefetch", default=None, metavar="POLICY",
                     help="Prefetch policy under --mem-budget: popular (default), pinned, none, or a plugin's."),
        MTP_OPTION,
        REPACK_CACHE_OPTION,
    )):
        command = option(command)
    return command


class SchemeName(click.ParamType):
    """A click parameter taking any registered scheme name (plugins' included), checked when
    the command runs: the registry is not complete while commands are being registered."""
    name = "scheme"

    def get_metavar(self, param, ctx=None) -> str:
        return "SCHEME"

    def convert(self, value, param, ctx):
        if isinstance(value, Scheme):
            return value.name
        try:
            return get_scheme(value).name
        except UnknownScheme as e:
            self.fail(str(e), param, ctx)


def open_terminal_model(model, threads, n_ctx, mem_budget, prefetch, mtp, repack_cache=None):
    """The model as run and chat open it (runtime.llama.open_for_terminal); a file llama.cpp
    cannot load is a one-line error, not a traceback."""
    from ..runtime.llama import open_for_terminal
    try:
        return open_for_terminal(model, threads, n_ctx, mem_budget, prefetch, mtp, repack_cache)
    except ValueError as e:
        raise click.ClickException(f"{e} (is it a GGUF model file?)" if "Failed to load" in str(e) else str(e)) from None
