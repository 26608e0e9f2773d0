"""Command-line options shared by the commands that open a model in this process (run, chat).
Kept apart from runtime/llama.py, which imports llama_cpp: the CLI imports this at start-up."""
from __future__ import annotations

import click


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
