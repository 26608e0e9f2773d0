"""`serve --rpc`: llama-server over RPC workers, kept answering while a worker is gone.

llama-server runs with DEEPSEEK_CPU_RPC_LOST_EXIT set, so the patched backend makes it exit with
that status as soon as a worker is lost (the request in flight ends with a cut connection, within
DEEPSEEK_CPU_RPC_TIMEOUT). Its weights on that worker are gone with the worker's process, so the
model must load again: until every worker answers, a stand-in on the same port answers 503 with
Retry-After; then llama-server starts again (a worker's disk cache spares resending weights).
"""
from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import rpc

LOST_EXIT = 75  # EX_TEMPFAIL: the status llama-server exits with when a worker is lost
POLL_S = 1.0

log = logging.getLogger(__name__)


def server_args(model: str, spec: str, local: str | None, n_ctx: int, header=None,
                say=log.info, key_file=None) -> tuple[list[str], list[str], dict[str, str]]:
    """(endpoints, llama-server flags, its environment) for a split over the workers in spec.
    key_file: the workers' shared key, proved by our probes and, through DEEPSEEK_CPU_RPC_KEY_FILE
    (the path only), by llama-server's connections."""
    import os
    from . import rpc_auth
    from .resources import parse_size
    endpoints = rpc.parse_endpoints(spec)
    rpc_auth.use(endpoints, rpc_auth.resolve(key_file=key_file))  # first: a bad key file is reported at once
    env = {"DEEPSEEK_CPU_RPC_LOST_EXIT": str(LOST_EXIT)}
    if key_file:
        env[rpc_auth.ENV_KEY_FILE] = os.path.abspath(key_file)
    split = rpc.plan_for(model, endpoints, parse_size(local, "--rpc-local") if local else 0, n_ctx, header)
    say(f"split over {len(endpoints)} worker(s): {split.describe()}")
    args = ["--rpc", ",".join(endpoints), "-ngl", str(split.n_gpu_layers),
            "--tensor-split", ",".join(f"{x:g}" for x in split.tensor_split),
            "--override-tensor", f"{rpc.OUTPUT_PATTERN}=CPU"]
    return endpoints, args, env


class _Unavailable(BaseHTTPRequestHandler):
    message = "a worker of this model's split is unreachable; the server restarts when it is back"

    def _answer(self):
        body = json.dumps({"error": {"code": 503, "message": self.message, "type": "unavailable_error"}}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Retry-After", "5")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = _answer

    def log_message(self, *args):  # quiet
        pass


class _StandIn(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True


class _StandIn6(_StandIn):
    address_family = socket.AF_INET6


def stand_in(host: str, port: int, timeout: float = 10.0) -> _StandIn:
    """A 503 server on host:port (retried while the exiting llama-server still holds the port), on
    IPv6 where the host is an IPv6 address or name (`serve --host ::`), as llama-server listened."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    cls = _StandIn6 if family == socket.AF_INET6 else _StandIn
    deadline = time.monotonic() + timeout
    while True:
        try:
            server = cls((host, port), _Unavailable)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def wait_for_workers(workers: list[str], stop: list, say=log.info) -> bool:
    said = None
    while not stop:
        try:
            for ep in workers:
                rpc.probe(ep, timeout=rpc.timeout_s())
            return True
        except rpc.RpcError as e:
            if str(e) != said:
                said = str(e)
                say(f"waiting: {said}")
            time.sleep(POLL_S)
    return False


def run_supervised(run_once, host: str, port: int, workers: list[str], say=log.info) -> int:
    import signal
    while True:
        rc = run_once()
        if rc != LOST_EXIT:
            return rc
        say("a worker was lost; answering 503 until every worker is back")
        server = stand_in(host, port)
        stop: list = []
        old = {s: signal.signal(s, lambda signum, frame: stop.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            back = wait_for_workers(workers, stop, say)
        finally:
            server.shutdown()
            server.server_close()
            for s, h in old.items():
                signal.signal(s, h)
        if not back:
            return 0
        say("every worker answers again; restarting the server")
