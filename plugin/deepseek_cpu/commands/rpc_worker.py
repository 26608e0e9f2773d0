"""`deepseek-cpu rpc-worker`: serve one host's share of a split model (library side: runtime/rpc_worker.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from ..hookspecs import hookimpl
from ..runtime import rpc, rpc_auth
from ..runtime import rpc_worker as worker
from .options import cpu_set_option


def say(message: str) -> None:
    click.echo(f"deepseek-cpu rpc-worker: {message}", err=True)


@click.command("rpc-worker")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Another than loopback needs --key-file (or --insecure).")
@click.option("--port", default=rpc.DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535))
@click.option("--threads", type=click.IntRange(1, None), default=None, help="Default: physical cores available (among --cpus).")
@click.option("--cpus", default=None, metavar="LIST", help="Run on these CPUs only, e.g. 0-7.")
@click.option("--mem", default=None, metavar="SIZE",
              help="Memory offered to clients (e.g. 48G); buffers beyond it are refused. Default: the memory available now.")
@click.option("--cache", "cache_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to keep the weights clients sent (default: ~/.cache/deepseek-cpu/rpc).")
@click.option("--no-cache", is_flag=True, help="Do not keep weights on disk: every connect sends them again.")
@click.option("--key-file", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="PATH",
              help=f"Serve only clients that prove the key in PATH (one line, a file only you may read: chmod 600); "
                   f"default: ${rpc_auth.ENV_KEY_FILE}.")
@click.option("--insecure", is_flag=True,
              help="Allow a non-loopback --host without a key (anyone who reaches the port may use the worker).")
@click.option("--dry-run", is_flag=True, help="Print the server's command line and exit.")
def rpc_worker(host, port, threads, cpus, mem, cache_dir, no_cache, key_file, insecure, dry_run):
    """Hold and compute a share of a model's layers for clients on other hosts.

    Clients use it with `Llama(..., rpc_servers="HOST:PORT,...")`, `serve --rpc`, `bench --rpc`;
    with a key, they need it too (`rpc_key_file=`, `--rpc-key-file`)."""
    import os
    from ..runtime.memory_budget import format_size
    from ..runtime.resources import available_memory, default_threads, parse_size
    from ..runtime.serve import is_loopback
    key_file = key_file or os.environ.get(rpc_auth.ENV_KEY_FILE) or None
    if key_file:
        rpc_auth.read_key_file(key_file)  # a bad key file is reported before anything starts
    elif not is_loopback(host) and not insecure:
        raise click.UsageError(f"--host {host} without a key would serve anyone who reaches it: give --key-file "
                               f"(docs/multi-host.md#security), or --insecure on a network only you use")
    cpu_set = cpu_set_option(cpus)
    threads = threads or default_threads(cpu_set)
    offered = parse_size(mem, "--mem") if mem else available_memory()
    cache = None if no_cache else (cache_dir or worker.default_cache_dir())
    cmd, env = worker.build(host, port, threads, offered, cache, key_file)
    if dry_run:
        click.echo(" ".join([*(f"{k}={v}" for k, v in env.items()), *cmd]))
        return
    if cache is not None:
        worker.prepare_cache(cache)
    note = (f" (clients must prove the key in {key_file})" if key_file else
            "" if is_loopback(host) else " (no authentication: keep this network private)")
    click.echo(f"deepseek-cpu rpc-worker: {host}:{port}{note}; offering {format_size(offered)}, {threads} threads; "
               f"weight cache {cache if cache else 'off'}", err=True)
    sys.exit(worker.supervise(cmd, env, cpu_set, say=say))


@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(rpc_worker)
