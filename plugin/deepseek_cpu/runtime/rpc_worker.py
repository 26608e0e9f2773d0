"""`deepseek-cpu rpc-worker`: one host's share of a model split across hosts.

Runs llama.cpp's RPC server (ggml-rpc-server, built from our patched tree, so it computes with
our kernels) under a supervisor that restarts it if it ever dies, e.g. on a request that makes
ggml abort: a crash costs the connected client its session, never the worker. The protocol has
no authentication, so it binds to loopback unless --host says otherwise (docs/multi-host.md).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from ..errors import DeepseekCpuError
from ..hookspecs import hookimpl
from . import rpc

RESTART_DELAY_S = (0.2, 5.0)   # first and longest wait before a restart
QUICK_EXIT_S = 2.0             # a server that exits this soon after starting, twice, is not restarted


class WorkerNotFound(DeepseekCpuError):
    """No ggml-rpc-server binary next to our libraries."""


def worker_binary() -> Path:
    from .. import _dropin
    found = _dropin.find_lib_dir(name="ggml-rpc-server")
    if found is None:
        raise WorkerNotFound("ggml-rpc-server not found next to the engine; reinstall deepseek-cpu "
                             "with DEEPSEEK_CPU_BUILD_SERVER=ON (the default)")
    return Path(found) / "ggml-rpc-server"


def default_cache_dir() -> Path:
    from ..cache import cache_root
    return cache_root() / "rpc"


def build(host: str, port: int, threads: int, mem: int, cache: Path | None) -> tuple[list[str], dict[str, str]]:
    """The server's command line and environment."""
    cmd = [str(worker_binary()), "-H", host, "-p", str(port), "-t", str(threads)]
    env = {"DEEPSEEK_CPU_RPC_MEM": str(mem)}
    if cache is not None:
        # the server keeps its entries in $LLAMA_CACHE/rpc: prepare_cache points that name at `cache`
        env["LLAMA_CACHE"] = str(cache / ".llama-cache")
        cmd.append("-c")
    return cmd, env


def prepare_cache(cache: Path) -> None:
    root = cache / ".llama-cache"
    root.mkdir(parents=True, exist_ok=True)
    link = root / "rpc"
    if not link.is_symlink():
        link.symlink_to(cache.resolve(), target_is_directory=True)


def supervise(cmd: list[str], env_extra: dict[str, str], cpus: set[int] | None = None, max_restarts: int | None = None) -> int:
    """Run the server, restart it whenever it dies on its own; SIGTERM/SIGINT stop it and us."""
    from .serve import _die_with_parent
    env = {**os.environ, **env_extra}
    libs = str(Path(cmd[0]).resolve().parent)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libs, env.get("LD_LIBRARY_PATH", "")) if p)
    stopping: list[int] = []
    proc: subprocess.Popen | None = None

    def stop(signum, frame):
        stopping.append(signum)
        if proc is not None and proc.poll() is None:
            proc.terminate()

    def before_exec():
        _die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    delay, quick, restarts = RESTART_DELAY_S[0], 0, 0
    try:
        while not stopping:
            started = time.monotonic()
            proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=before_exec)
            rc = proc.wait()
            if stopping:
                break
            ran = time.monotonic() - started
            how = f"signal {-rc}" if rc < 0 else f"status {rc}"
            quick = quick + 1 if ran < QUICK_EXIT_S else 0  # e.g. its port is taken: it returns at once
            if quick >= 2:
                click.echo(f"deepseek-cpu rpc-worker: the server exits at start ({how}); see its message above", err=True)
                return rc if rc > 0 else 1
            restarts += 1
            if max_restarts is not None and restarts > max_restarts:
                return rc
            click.echo(f"deepseek-cpu rpc-worker: the server stopped ({how}) after {ran:.0f} s; restarting "
                       f"(its client must reconnect)", err=True)
            time.sleep(delay)
            delay = RESTART_DELAY_S[0] if ran > 60 else min(delay * 2, RESTART_DELAY_S[1])
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        for s, h in old.items():
            signal.signal(s, h)
    return 0


@click.command("rpc-worker")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. The protocol has no authentication: use a private network or a tunnel.")
@click.option("--port", default=rpc.DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535))
@click.option("--threads", type=click.IntRange(1, None), default=None, help="Default: physical cores available (among --cpus).")
@click.option("--cpus", default=None, metavar="LIST", help="Run on these CPUs only, e.g. 0-7.")
@click.option("--mem", default=None, metavar="SIZE",
              help="Memory offered to clients (e.g. 48G); buffers beyond it are refused. Default: the memory available now.")
@click.option("--cache", "cache_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to keep the weights clients sent (default: ~/.cache/deepseek-cpu/rpc).")
@click.option("--no-cache", is_flag=True, help="Do not keep weights on disk: every connect sends them again.")
@click.option("--dry-run", is_flag=True, help="Print the server's command line and exit.")
def rpc_worker(host, port, threads, cpus, mem, cache_dir, no_cache, dry_run):
    """Hold and compute a share of a model's layers for clients on other hosts.

    Clients use it with `Llama(..., rpc_servers="HOST:PORT,...")`, `serve --rpc`, `bench --rpc`."""
    from .memory_budget import gib, parse_size
    from .options import cpu_set_option
    from .resources import available_memory, default_threads
    cpu_set = cpu_set_option(cpus)
    threads = threads or default_threads(cpu_set)
    offered = parse_size(mem) if mem else available_memory()
    cache = None if no_cache else (cache_dir or default_cache_dir())
    cmd, env = build(host, port, threads, offered, cache)
    if dry_run:
        click.echo(" ".join([*(f"{k}={v}" for k, v in env.items()), *cmd]))
        return
    if cache is not None:
        prepare_cache(cache)
    note = "" if host in ("127.0.0.1", "localhost") else " (no authentication: keep this network private)"
    click.echo(f"deepseek-cpu rpc-worker: {host}:{port}{note}; offering {gib(offered)}, {threads} threads; "
               f"weight cache {cache if cache else 'off'}", err=True)
    sys.exit(supervise(cmd, env, cpu_set))


@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(rpc_worker)
