"""What `deepseek-cpu rpc-worker` runs: one host's share of a model split across hosts.

Runs llama.cpp's RPC server (ggml-rpc-server, built from our patched tree, so it computes with
our kernels) under a supervisor that restarts it if it ever dies, e.g. on a request that makes
ggml abort: a crash costs the connected client its session, never the worker. With a key
(--key-file, DEEPSEEK_CPU_RPC_KEY_FILE) it serves only clients that prove it (rpc_auth.py); without
one it listens on loopback only, unless told --insecure (docs/multi-host.md).
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from ..errors import DeepseekCpuError
from .processes import die_with_parent
from .rpc_auth import ENV_KEY_FILE

RESTART_DELAY_S = (0.2, 5.0)   # first and longest wait before a restart
QUICK_EXIT_S = 2.0             # a server that exits this soon after starting, twice, is not restarted

log = logging.getLogger(__name__)


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


def build(host: str, port: int, threads: int, mem: int, cache: Path | None,
          key_file: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The server's command line and environment. key_file: the shared key's file (checked by the
    caller), which the server reads itself; None: the server gets no key, even from our environment."""
    cmd = [str(worker_binary()), "-H", host, "-p", str(port), "-t", str(threads)]
    env = {"DEEPSEEK_CPU_RPC_MEM": str(mem), ENV_KEY_FILE: str(Path(key_file).resolve()) if key_file else ""}
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


def supervise(cmd: list[str], env_extra: dict[str, str], cpus: set[int] | None = None, max_restarts: int | None = None,
              say=log.info) -> int:
    """Run the server, restart it whenever it dies on its own; SIGTERM/SIGINT stop it and us.
    `say` takes each line of news for the user."""
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
        die_with_parent()
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
                say(f"the server exits at start ({how}); see its message above")
                return rc if rc > 0 else 1
            restarts += 1
            if max_restarts is not None and restarts > max_restarts:
                return rc
            say(f"the server stopped ({how}) after {ran:.0f} s; restarting (its client must reconnect)")
            time.sleep(delay)
            delay = RESTART_DELAY_S[0] if ran > 60 else min(delay * 2, RESTART_DELAY_S[1])
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        for s, h in old.items():
            signal.signal(s, h)
    return 0
