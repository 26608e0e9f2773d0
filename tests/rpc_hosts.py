"""RPC workers for the tests: on loopback, or as separate hosts (a network namespace each, joined to
this one by a veth pair, optionally in a memory cgroup and behind `tc netem`)."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import runner_lacks
from deepseek_cpu.runtime import rpc, rpc_auth

SUBNET = "10.231"
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(endpoint: str, proc: subprocess.Popen, timeout: float = 30, key: bytes | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker {endpoint} exited ({proc.returncode})")
        try:
            rpc.probe(endpoint, timeout=2, key=key)
            return
        except rpc.RpcError:
            time.sleep(0.1)
    raise TimeoutError(f"worker {endpoint} not ready")


class Worker:
    """`deepseek-cpu rpc-worker` (the supervisor) and its server process. key_file: the worker's
    shared key (--key-file); without one, a worker in a network namespace runs --insecure (only
    this test reaches it)."""

    def __init__(self, host: str, port: int, args=(), netns: str | None = None, cgroup: Path | None = None,
                 env: dict | None = None, log: Path | None = None, key_file: Path | None = None):
        self.endpoint = f"{host}:{port}"
        self.host, self.port, self.args, self.netns, self.cgroup = host, port, list(args), netns, cgroup
        self.key_file = key_file
        self.key = rpc_auth.read_key_file(key_file) if key_file else None
        self.env = {**os.environ, **(env or {})}
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self):
        cmd = [sys.executable, "-m", "deepseek_cpu", "rpc-worker", "--host", self.host, "--port", str(self.port),
               *self.args, *(["--key-file", str(self.key_file)] if self.key_file else
                             [] if self.host == "127.0.0.1" else ["--insecure"])]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        group = self.cgroup

        def join():
            if group is not None:
                (group / "cgroup.procs").write_text(str(os.getpid()))
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                     preexec_fn=join, start_new_session=True)
        wait_ready(self.endpoint, self.proc, key=self.key)
        return self

    def server_pid(self) -> int:
        """The ggml-rpc-server under this worker's supervisor (`ip netns exec` execs: the same pid)."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid), "-f", "ggml-rpc-server"],
                             capture_output=True, text=True).stdout.split()
        return int(out[0])

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextlib.contextmanager
def loopback_workers(n: int, args=(), env=None, log_dir: Path | None = None, key_file: Path | None = None):
    workers = []
    try:
        for i in range(n):
            w = Worker("127.0.0.1", free_port(), args, env=env, log=(log_dir / f"worker{i}.log") if log_dir else None,
                       key_file=key_file)
            workers.append(w.start())
        yield workers
    finally:
        for w in workers:
            w.stop()


def need_root_networking():
    """Root and network namespaces, or a skip saying which is missing (a failure under CI unless
    the runner declares it: tests/conftest.py, runner_lacks)."""
    if os.geteuid() != 0:
        runner_lacks("root", f"uid {os.geteuid()}: network namespaces for the hosts")
    if shutil.which("ip") is None:
        runner_lacks("netns", "no `ip` (iproute2) on PATH")
    probe = subprocess.run(["ip", "netns", "add", "dsc-probe"], capture_output=True)
    subprocess.run(["ip", "netns", "del", "dsc-probe"], capture_output=True)
    if probe.returncode != 0:
        runner_lacks("netns", f"`ip netns add` failed: {probe.stderr.decode().strip()}")


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


class Host:
    """A network namespace `name` at SUBNET.k.2, reached from here at SUBNET.k.1 over a veth pair."""

    def __init__(self, k: int):
        self.k = k
        self.name = f"dsc-host{k}"
        self.veth = f"dsc-v{k}"
        self.addr = f"{SUBNET}.{k}.2"
        self.cgroup: Path | None = None

    def up(self):
        sh("ip", "netns", "add", self.name)
        sh("ip", "link", "add", self.veth, "type", "veth", "peer", "name", self.veth + "p")
        sh("ip", "link", "set", self.veth + "p", "netns", self.name)
        sh("ip", "addr", "add", f"{SUBNET}.{self.k}.1/24", "dev", self.veth)
        sh("ip", "link", "set", self.veth, "up")
        sh("ip", "netns", "exec", self.name, "ip", "addr", "add", f"{self.addr}/24", "dev", self.veth + "p")
        sh("ip", "netns", "exec", self.name, "ip", "link", "set", self.veth + "p", "up")
        sh("ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up")
        return self

    def limit_memory(self, limit: int):
        """A v1 memory cgroup for this host's processes (page cache included)."""
        if not (CGROUP_ROOT / "cgroup.procs").exists():
            runner_lacks("cgroup1", f"no {CGROUP_ROOT / 'cgroup.procs'}")
        self.cgroup = CGROUP_ROOT / f"deepseek-cpu-{self.name}-{os.getpid()}"
        self.cgroup.mkdir(exist_ok=True)
        (self.cgroup / "memory.limit_in_bytes").write_text(str(limit))
        return self

    def shape(self, rate: str, delay: str) -> str:
        """Both directions of the link: `rate` (e.g. 10gbit) and one-way `delay` (e.g. 0.1ms) with
        netem; where the kernel has no netem, the rate alone with tbf. Returns what was applied."""
        how = "netem"
        for dev, ns in ((self.veth, None), (self.veth + "p", self.name)):
            pre = ["ip", "netns", "exec", ns] if ns else []
            r = subprocess.run([*pre, "tc", "qdisc", "replace", "dev", dev, "root", "netem", "rate", rate, "delay", delay],
                               capture_output=True, text=True)
            if r.returncode != 0:
                bits = _bits(rate)
                burst = max(64 << 10, bits // 8 // 1000)  # a millisecond at the line rate
                subprocess.run([*pre, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                                "burst", str(burst), "latency", "50ms"], check=True, capture_output=True)
                how = "tbf (no netem in this kernel: rate only, no added delay)"
        return how

    def down(self):
        for pid in subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.2)
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        if self.cgroup is not None:
            for _ in range(50):
                try:
                    self.cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def _bits(rate: str) -> int:
    units = {"gbit": 10**9, "mbit": 10**6, "kbit": 10**3, "bit": 1}
    for u, m in units.items():
        if rate.endswith(u):
            return int(float(rate[: -len(u)]) * m)
    raise ValueError(f"rate {rate!r}: use e.g. 10gbit, 100mbit")


@contextlib.contextmanager
def hosts(n: int, first: int = 1):
    need_root_networking()
    made = []
    try:
        for k in range(first, first + n):
            h = Host(k)
            h.down()  # a previous run's leftovers
            made.append(h.up())
        yield made
    finally:
        for h in made:
            h.down()
