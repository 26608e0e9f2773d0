"""`deepseek-cpu serve MODEL`: llama.cpp's own HTTP server (llama-server), built from the same
patched tree as our libllama, with defaults for serving a team from CPUs.

llama_cpp.server (llama-cpp-python's FastAPI server) answers one request at a time;
llama-server runs N slots with continuous batching: the prompts and next tokens of all
active requests go through the model together, so N clients share one forward pass.

Defaults chosen here (everything else is llama-server's own; append more flags after `--`):
  --parallel 4            slots, i.e. requests decoded concurrently
  -c  parallel * ctx      ctx per slot (--ctx) defaults to the memory-fitting context of
                          deepseek_cpu.Llama divided among the slots, at most 4096, at least 256
  --cont-batching         continuous batching (explicit, in case upstream's default changes)
  --metrics               Prometheus metrics on /metrics
  --jinja                 the GGUF's own chat template (DeepSeek's, as transformers renders it);
                          tool calls and JSON-schema replies for V2.5/V3/R1 templates come from
                          our handler in patches/files/common/parsers/ (docs/integrations.md)
  -t/-tb                  physical cores of this process (affinity, cgroup quota)
  -fa off                 as deepseek_cpu.Llama: CPU flash attention costs accuracy
  --no-webui              the API only (the web UI is not built into our package)

The parent process forwards SIGTERM/SIGINT to the server (exactly once), waits for
/health before announcing the URL, and exits with the server's status. The server runs
with PR_SET_PDEATHSIG, so it does not outlive a killed parent.
"""
from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import click

from ..errors import DeepseekCpuError
from ..hookspecs import hookimpl

DEFAULT_PARALLEL = 4
MAX_CTX_PER_SLOT = 4096
MIN_CTX_PER_SLOT = 256
ENV_SERVER = "DEEPSEEK_CPU_LLAMA_SERVER"  # path of another llama-server binary (tests, dev builds)


class ServerNotFound(DeepseekCpuError):
    """No llama-server binary to run. (A library error, not a click one: the CLI reports
    every DeepseekCpuError as one `Error: ...` line; see cli.py.)"""


def server_binary() -> Path:
    """The llama-server shipped next to our libllama (or $DEEPSEEK_CPU_LLAMA_SERVER)."""
    env = os.environ.get(ENV_SERVER)
    if env:
        return Path(env)
    from .. import _dropin
    from .engine import lib_dir
    # the engine's rule ($LLAMA_CPP_LIB_PATH, our lib/, a source checkout's installed one),
    # asked for the directory that holds llama-server
    found = _dropin.find_lib_dir(name="llama-server")
    if found is not None:
        return Path(found) / "llama-server"
    raise ServerNotFound(
        f"llama-server not found in {lib_dir()}; reinstall deepseek-cpu with DEEPSEEK_CPU_BUILD_SERVER=ON "
        f"(the default) or point {ENV_SERVER} at a llama-server binary")


def default_ctx_per_slot(model: str, parallel: int) -> int:
    from .llama import default_n_ctx, read_shape
    shape = read_shape(model)
    total = default_n_ctx(shape)
    per = min(MAX_CTX_PER_SLOT, max(MIN_CTX_PER_SLOT, total // max(parallel, 1)))
    if shape is not None:
        per = min(per, shape.n_ctx_train)
    return per


def build_command(model: str, host: str = "127.0.0.1", port: int = 8080, parallel: int = DEFAULT_PARALLEL,
                  ctx_per_slot: int | None = None, threads: int | None = None, alias: str | None = None,
                  extra: tuple[str, ...] | list[str] = ()) -> list[str]:
    from .resources import default_threads
    threads = threads or default_threads()
    ctx_per_slot = ctx_per_slot or default_ctx_per_slot(model, parallel)
    cmd = [
        str(server_binary()), "-m", str(model),
        "--host", host, "--port", str(port),
        "--parallel", str(parallel), "-c", str(ctx_per_slot * parallel),
        "--cont-batching", "--metrics", "--jinja", "--no-webui",
        "-t", str(threads), "-tb", str(threads),
        "-fa", "off",
    ]
    if alias:
        cmd += ["--alias", alias]
    return cmd + list(extra)


def _die_with_parent():
    """Runs in the child before exec: SIGTERM it when the parent dies (no orphan servers)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout: float = 600.0) -> bool:
    """Poll GET url/health until 200 (503 while the model loads). False if the server died or timed out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.1)
    return False


def run_server(cmd: list[str], host: str, port: int, ready_timeout: float = 600.0,
               env_extra: dict[str, str] | None = None, cpus: set[int] | None = None,
               workers: list[str] | None = None) -> int:
    """Run llama-server until it exits; with RPC workers, a server that exits because a worker was
    lost is replaced by a 503 answer on the same port until every worker answers again, then
    started again (runtime/rpc_serve.py)."""
    if not workers:
        return _run_once(cmd, host, port, ready_timeout, env_extra, cpus)
    from . import rpc_serve
    return rpc_serve.run_supervised(lambda: _run_once(cmd, host, port, ready_timeout, env_extra, cpus),
                                    host, port, workers)


def _run_once(cmd: list[str], host: str, port: int, ready_timeout: float = 600.0,
              env_extra: dict[str, str] | None = None, cpus: set[int] | None = None) -> int:
    env = {**os.environ, **(env_extra or {})}
    # the libraries the binary was built with lie next to it (libllama, libggml*, libmtmd)
    libs = str(Path(cmd[0]).resolve().parent)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libs, env.get("LD_LIBRARY_PATH", "")) if p)
    # own session: a terminal's Ctrl-C reaches only us, and we forward it once (a second
    # SIGINT makes llama-server exit at once, skipping its clean shutdown)
    def before_exec():
        _die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=before_exec)
    forwarded = []

    def forward(signum, frame):
        if proc.poll() is None:
            if forwarded:  # asked twice: stop now
                proc.kill()
            else:
                proc.send_signal(signum)
            forwarded.append(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        probe_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        url = f"http://{probe_host}:{port}"
        if wait_ready(url, proc, ready_timeout):
            click.echo(f"deepseek-cpu serve: ready on http://{host}:{port}/v1 (OpenAI-compatible; /health, /metrics)",
                       err=True)
        elif proc.poll() is None and not forwarded:
            click.echo(f"deepseek-cpu serve: {url}/health not ready after {ready_timeout:.0f} s", err=True)
        while True:
            try:
                rc = proc.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
                continue
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for s, h in old.items():
            signal.signal(s, h)
    if rc < 0:  # killed by a signal
        return 0 if forwarded and -rc in forwarded else 128 - rc
    return rc


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--parallel", "-np", default=DEFAULT_PARALLEL, show_default=True, type=click.IntRange(1, 256),
              help="Slots: requests decoded concurrently (continuous batching).")
@click.option("--ctx", "ctx_per_slot", type=click.IntRange(16, None), default=None,
              help=f"Context per slot (default: fits memory, {MIN_CTX_PER_SLOT}..{MAX_CTX_PER_SLOT}).")
@click.option("--threads", type=int, default=None, help="Default: physical cores available (among --cpus).")
@click.option("--cpus", default=None, metavar="LIST",
              help="Run the server on these CPUs only, e.g. 0-7 or 0,2,4 (its threads default to their physical cores).")
@click.option("--alias", default=None, help="Model name reported by /v1/models.")
@click.option("--ready-timeout", default=600.0, show_default=True, help="Seconds to wait for /health.")
@click.option("--mem-budget", default=None, metavar="SIZE",
              help="Run within SIZE of memory (e.g. 4G): the routed experts used from the file mapping, not copied.")
@click.option("--prefetch", default=None, metavar="POLICY",
              help="Prefetch policy under --mem-budget (default: popular); the server's pages are read ahead, not locked.")
@click.option("--rpc", "rpc_servers", default=None, metavar="HOST:PORT,...",
              help="Split the layers over these `deepseek-cpu rpc-worker`s, by the memory each offers.")
@click.option("--rpc-local", default=None, metavar="SIZE",
              help="With --rpc: memory this host gives to layers (default: none but the embeddings).")
@click.option("--dry-run", is_flag=True, help="Print the llama-server command line and exit.")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def serve(model, host, port, parallel, ctx_per_slot, threads, cpus, alias, mem_budget, prefetch, ready_timeout,
          rpc_servers, rpc_local, dry_run, extra):
    """Serve MODEL (a GGUF) over an OpenAI-compatible HTTP API with llama-server.

    Flags after `--` go to llama-server unchanged, e.g. `-- --context-shift`."""
    from .options import cpu_set_option
    cpu_set = cpu_set_option(cpus)
    if cpu_set:
        from .resources import default_threads
        threads = threads or default_threads(cpu_set)
    env = budget_env(model, mem_budget, prefetch, parallel, ctx_per_slot, dry_run) if mem_budget else {}
    workers = None
    if rpc_servers:
        from . import rpc_serve
        if mem_budget:
            raise click.UsageError("--rpc and --mem-budget cannot be combined (the workers hold the layers in memory)")
        # the KV cache lives on the workers: this host's memory does not bound the context
        ctx_per_slot = ctx_per_slot or rpc_serve.default_ctx_per_slot(model)
        workers, rpc_args, rpc_env = rpc_serve.server_args(model, rpc_servers, rpc_local, ctx_per_slot * parallel)
        extra = (*rpc_args, *extra)
        env.update(rpc_env)
    cmd = build_command(model, host, port, parallel, ctx_per_slot, threads, alias, extra)
    if dry_run:
        pin = ["taskset", "-c", cpus] if cpu_set else []
        click.echo(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *pin, *map(shlex.quote, cmd)]))
        return
    sys.exit(run_server(cmd, host, port, ready_timeout, env, cpu_set, workers))


def budget_env(model, mem_budget, policy, parallel, ctx_per_slot, dry_run) -> dict[str, str]:
    """Check the budget against the always-hot set and the slots' KV cache, warm the page cache
    with the prefetch policy's placement (unless dry_run), and return llama-server's environment:
    the experts kept in the file mapping, and read ahead as each router chooses them."""
    from . import memory_budget, prefetch
    from .llama import read_shape
    shape = read_shape(model)
    ctx = (ctx_per_slot or default_ctx_per_slot(model, parallel)) * parallel
    plan = memory_budget.plan(model, memory_budget.parse_size(mem_budget), (shape.kv_bytes_per_token if shape else 0) * ctx)
    if not dry_run:
        layout = prefetch.layout(model)
        placement, name = prefetch.plan_policy(policy, layout, plan)
        n = prefetch.advise_file(layout, placement)
        click.echo(f"deepseek-cpu serve: {plan.describe()}; prefetch {name}: {n / 2**30:.2f} GiB read ahead", err=True)
    level = 0 if policy == "none" else memory_budget.EXPERT_PREFETCH_LEVEL
    return {**memory_budget.server_env(), "DEEPSEEK_CPU_EXPERT_PREFETCH": str(level)}


@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(serve)
