"""Command-line options shared by several commands: those that open a model in this process (run,
chat), and --cpus (serve, rpc-worker). Kept apart from runtime/llama.py, which imports llama_cpp:
the CLI imports this at start-up."""
from __future__ import annotations

import os

import click


def cpu_set_option(cpus: str | None) -> set[int] | None:
    """--cpus LIST as a set of CPUs this process may run on (None: not given); a bad list or a CPU
    outside this process's affinity is a usage error naming the option."""
    if not cpus:
        return None
    from .resources import parse_cpu_list
    try:
        cpu_set = parse_cpu_list(cpus)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--cpus") from None
    allowed = os.sched_getaffinity(0)
    if not cpu_set <= allowed:
        raise click.BadParameter(f"CPUs {sorted(cpu_set - allowed)} are not available to this process "
                                 f"(allowed: {sorted(allowed)})", param_hint="--cpus")
    return cpu_set


def terminal_options(command):
    """The options of the commands that open a model in this process (run, chat): threads,
    context, memory budget, prefetch policy; open_for_terminal takes them."""
    for option in reversed((
        click.option("--threads", type=int, default=None, help="Default: physical cores available."),
        click.option("--ctx", "n_ctx", type=int, default=None, help="Context length (default: fits memory)."),
        click.option("--mem-budget", default=None, metavar="SIZE",
                     help="Run within SIZE of memory (e.g. 4G): the routed experts used from the file mapping."),
        click.option("--prefetch", default=None, metavar="POLICY",
                     help="Prefetch policy under --mem-budget: popular (default), pinned, none, or a plugin's."),
    )):
        command = option(command)
    return command
