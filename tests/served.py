"""A `deepseek-cpu serve` process on loopback for the tests (tests/test_serve.py, tests/test_agents.py)."""
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import deepseek_cpu

_INSTALLED_LIB = Path(sysconfig.get_paths()["purelib"]) / "deepseek_cpu" / "lib"
if "LLAMA_CPP_LIB_PATH" not in os.environ and (_INSTALLED_LIB / "libllama.so").exists():
    os.environ["LLAMA_CPP_LIB_PATH"] = str(_INSTALLED_LIB)

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(deepseek_cpu.__file__)))
PARALLEL = 4
CTX = 256  # per slot


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_PARENT, env.get("PYTHONPATH", "")) if p)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, model, log: Path, *extra, parallel=PARALLEL, ctx=CTX):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "deepseek_cpu", "serve", str(model), "--port", str(self.port),
               "--parallel", str(parallel), "--ctx", str(ctx), "--threads", "2", "--alias", "tiny",
               "--ready-timeout", "300", *extra]
        self.proc = subprocess.Popen(cmd, env=_env(), stdout=open(log, "w"), stderr=subprocess.STDOUT)
        from deepseek_cpu.runtime.serve import wait_ready
        if not wait_ready(self.url, self.proc, timeout=300):
            self.stop()
            pytest.fail(f"server did not become ready:\n{log.read_text()[-4000:]}")

    def children(self) -> list[int]:
        try:
            return [int(p) for p in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()]
        except OSError:
            return []

    def stop(self, sig=signal.SIGTERM, timeout=60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def client(self):
        import openai
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=120)


def post(url, body: bytes, ctype="application/json"):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": ctype}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
