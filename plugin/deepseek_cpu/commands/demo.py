"""`deepseek-cpu demo`: the embedded tiny model converted, run and checked (tools/demo.py)."""
from __future__ import annotations

import click

from ..hookspecs import hookimpl
from ..tools.demo import TOLERANCE, run_demo


@click.command()
def demo():
    """Convert and run the embedded tiny DeepSeek-V2 model; check it against transformers."""
    err = run_demo(click.echo)
    if err > TOLERANCE:
        raise click.ClickException(f"engine output differs from the reference ({err:.2e} > {TOLERANCE:g})")


@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(demo)
