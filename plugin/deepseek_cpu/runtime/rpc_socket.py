"""What the RPC client modules share, below both the wire (rpc_wire.py) and the key handshake
(rpc_auth.py, which the wire runs first): the error of a worker that cannot be used, and reading
an exact number of bytes from a worker's socket."""
from __future__ import annotations

import socket

from ..errors import DeepseekCpuError


class RpcError(DeepseekCpuError):
    """A worker could not be used: unparsable endpoint, unreachable, busy, another version, a key
    it does not share."""


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the worker")
        buf += chunk
    return bytes(buf)
