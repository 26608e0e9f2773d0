"""The `deepseek-cpu` commands: thin click front ends over the library, one module per job.

Each module defines its commands at module level and adds them in one
`deepseek_cpu_register_commands` hook, listed in plugins.DEFAULT_PLUGINS: the built-in commands
register exactly as a third-party plugin's would. This package and cli.py are the only places
that import click; the library below them reports through return values, exceptions and
`say`/`log` callbacks, never by printing.
"""
