"""The `deepseek-cpu` command group. Its commands, built-in (commands/) or not, come through the
deepseek_cpu_register_commands hook."""
from __future__ import annotations

import click

from . import __version__
from .errors import DeepseekCpuError


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


def main():
    cli()
