"""`deepseek-cpu info` (the engine this environment loads) and `deepseek-cpu plugins`."""
from __future__ import annotations

import json

import click

from ..hookspecs import hookimpl


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def info(as_json):
    """Package version, llama.cpp commit, patch series, CPU features and the library loaded."""
    from ..runtime.engine import engine_info
    from ..runtime.resources import default_threads
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


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plugins_cmd(as_json):
    """List loaded plugins, their versions and the hooks each implements."""
    from ..plugins import describe
    rows = describe()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['name']}  ({r['package']} {r['version']})")
        click.echo("    hooks: " + ", ".join(r["hooks"]))



@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(info)
    cli.add_command(plugins_cmd)
