"""Talking to an RPC worker before llama.cpp does: endpoints parsed, each probed (in Python, with a
timeout: llama.cpp's own connect aborts the process on a dead endpoint) for its protocol version
and the memory it offers. The wire format is llama.cpp's (ggml-rpc) at the pinned commit.
"""
from __future__ import annotations

import os
import re
import socket
import struct
from dataclasses import dataclass

from .rpc_socket import RpcError, recv_exact as _recv_exact  # noqa: F401  (RpcError: importable from here too)

DEFAULT_PORT = 50052
ENV_TIMEOUT = "DEEPSEEK_CPU_RPC_TIMEOUT"  # seconds; read by the patched backend too (dsc-rpc.cpp)
DEFAULT_TIMEOUT = 15

# the wire protocol (ggml/include/ggml-rpc.h, ggml/src/ggml-rpc/ggml-rpc.cpp at the pinned commit)
PROTO_MAJOR = 7
CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
CONN_CAPS_SIZE = 24


class RpcWorkerLost(RpcError):
    """A worker died or became unreachable while the model was in use."""


def timeout_s() -> int:
    try:
        return max(1, int(os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT)))
    except ValueError:
        return DEFAULT_TIMEOUT


def parse_endpoints(spec) -> list[str]:
    """'h1:p1,h2' (or a list) -> ['h1:p1', 'h2:50052']. IPv4 addresses or host names."""
    items = spec if isinstance(spec, (list, tuple)) else str(spec).split(",")
    out = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        m = re.fullmatch(r"([A-Za-z0-9.\-_]+)(?::(\d+))?", item)
        if not m or (m.group(2) and not 0 < int(m.group(2)) < 65536):
            raise RpcError(f"not a worker endpoint: {item!r} (expected HOST:PORT, e.g. 10.0.0.2:{DEFAULT_PORT})")
        out.append(f"{m.group(1)}:{m.group(2) or DEFAULT_PORT}")
    if not out:
        raise RpcError("no worker endpoints given")
    if len(set(out)) != len(out):
        raise RpcError(f"a worker is named twice: {','.join(out)}")
    return out


@dataclass
class Worker:
    endpoint: str
    devices: int
    free: int
    total: int


def _call(sock: socket.socket, cmd: int, payload: bytes, reply_size: int) -> bytes:
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size != reply_size:
        raise ConnectionError(f"unexpected reply size {size} to command {cmd}")
    return _recv_exact(sock, size)


_REGISTERED = object()


def probe(endpoint: str, timeout: float | None = None, key=_REGISTERED) -> Worker:
    """Handshake with a worker and ask for its memory; RpcError (never a hang) if it does not answer.

    A worker serves one client at a time: while another client holds it, the connection is
    accepted by the kernel but nothing answers, which is reported as busy. `key`: the shared key
    to prove (rpc_auth.py), None for none; by default the one given for this endpoint, else
    DEEPSEEK_CPU_RPC_KEY_FILE's."""
    from . import rpc_auth
    timeout = timeout or timeout_s()
    key = rpc_auth.key_for(endpoint) if key is _REGISTERED else key
    host, port = endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            if key:
                rpc_auth.handshake(s, key, endpoint)
            s.sendall(struct.pack("<BQ", CMD_HELLO, CONN_CAPS_SIZE) + bytes(CONN_CAPS_SIZE))
            (size,) = struct.unpack("<Q", _recv_exact(s, 8))
            if size == len(rpc_auth.MAGIC_NEED_KEY) and _recv_exact(s, size) == rpc_auth.MAGIC_NEED_KEY:
                raise RpcError(rpc_auth.need_key_message(endpoint))
            if size != 4 + CONN_CAPS_SIZE:
                raise ConnectionError(f"unexpected reply size {size} to command {CMD_HELLO}")
            hello = _recv_exact(s, size)
            major, minor, patch = hello[0], hello[1], hello[2]
            if major != PROTO_MAJOR:
                raise RpcError(f"worker {endpoint} speaks RPC protocol {major}.{minor}.{patch}, "
                               f"this client {PROTO_MAJOR}.x: run the same deepseek-cpu version on both")
            (n_dev,) = struct.unpack("<I", _call(s, CMD_DEVICE_COUNT, b"", 4))
            free, total = struct.unpack("<QQ", _call(s, CMD_GET_DEVICE_MEMORY, struct.pack("<I", 0), 16))
    except socket.timeout:
        raise RpcError(f"worker {endpoint} did not answer within {timeout:.0f} s "
                       f"(busy with another client, or not an RPC worker)") from None
    except (ConnectionError, OSError) as e:
        raise RpcError(f"worker {endpoint} is not reachable: {e}") from None
    return Worker(endpoint, n_dev, free, total)
