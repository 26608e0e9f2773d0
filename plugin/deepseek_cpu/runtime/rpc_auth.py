"""The shared key of RPC clients and workers (docs/multi-host.md#security).

A worker started with a key (`rpc-worker --key-file`, or DEEPSEEK_CPU_RPC_KEY_FILE) serves only
clients that prove they know it, and a client given one uses only workers that prove it:
challenge and response with HMAC-SHA-256 over both sides' fresh nonces, before llama.cpp's HELLO.
The worker's side, and the client side of llama.cpp's own connections, are C
(patches/files/ggml/src/ggml-rpc/dsc-rpc-auth.cpp; dsc-rpc.h has the message layout). This module
reads keys, keeps the one each endpoint is to be used with (here and in the engine), and runs the
client's side for the probe that talks to a worker before llama.cpp does.

A key file holds one key: the one line that is neither blank nor a '#' comment, spaces around it
dropped, at least MIN_KEY printable ASCII characters (`openssl rand -hex 32` makes one). A regular
file must be private (mode 600), as serve's API key file (runtime/private_file.py). The C reader
applies the same rules, for processes that read DEEPSEEK_CPU_RPC_KEY_FILE themselves.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import struct

from .private_file import read_private_file
from .rpc_socket import RpcError, recv_exact as _recv_exact

ENV_KEY_FILE = "DEEPSEEK_CPU_RPC_KEY_FILE"
CMD_AUTH = 0xD5           # DSC_RPC_CMD_AUTH: outside llama.cpp's command numbers
NONCE = 32
MIN_KEY = 16
MAX_KEY_FILE_BYTES = 4096
MAGIC_AUTH = b"DSCAUTH1"
MAGIC_NO_KEY = b"DSCNOKEY"    # a worker without a key, to a client that offered one
MAGIC_NEED_KEY = b"DSCNEEDK"  # a worker with a key, to a client that did not offer one
LABEL_WORKER = b"deepseek-cpu rpc auth v1 worker\0"
LABEL_CLIENT = b"deepseek-cpu rpc auth v1 client\0"
_SPACE = b" \t\r\v\f"

_keys: dict[str, bytes] = {}  # endpoint -> the key given for it (else DEEPSEEK_CPU_RPC_KEY_FILE applies)


def check_key(key: str | bytes, what: str = "the RPC key") -> bytes:
    """The key as bytes, spaces around it dropped; RpcError unless it is printable ASCII, MIN_KEY long."""
    if isinstance(key, str):
        try:
            key = key.encode("ascii")
        except UnicodeEncodeError:
            raise RpcError(f"{what} is not printable ASCII") from None
    key = bytes(key).strip(_SPACE + b"\n")
    if any(c < 0x20 or c > 0x7E for c in key):
        raise RpcError(f"{what} is not printable ASCII")
    if len(key) < MIN_KEY:
        raise RpcError(f"{what} is shorter than {MIN_KEY} characters (make one with: openssl rand -hex 32)")
    return key


def read_key_file(path: str | os.PathLike) -> bytes:
    """The key in an RPC key file (the module's docstring has the rules)."""
    data = read_private_file(path, "RPC key file", RpcError, MAX_KEY_FILE_BYTES)
    keys = [k for k in (line.strip(_SPACE) for line in data.split(b"\n")) if k and not k.startswith(b"#")]
    if not keys:
        raise RpcError(f"RPC key file {path} holds no key (one line; '#' starts a comment)")
    if len(keys) > 1:
        raise RpcError(f"RPC key file {path} holds {len(keys)} keys; it must hold one")
    return check_key(keys[0], f"the key in RPC key file {path}")


def env_key(environ=os.environ) -> bytes | None:
    path = environ.get(ENV_KEY_FILE)
    if not path:
        return None
    try:
        return read_key_file(path)
    except RpcError as e:
        raise RpcError(f"{e} (from {ENV_KEY_FILE})") from None


def resolve(key: str | bytes | None = None, key_file: str | os.PathLike | None = None) -> bytes | None:
    """The key a caller gave: `key` itself or the one in `key_file` (not both); None for neither."""
    if key is not None and key_file is not None:
        raise RpcError("give rpc_key or rpc_key_file, not both")
    if key is not None:
        return check_key(key)
    if key_file is not None:
        return read_key_file(key_file)
    return None


def use(endpoints: list[str], key: bytes | None) -> None:
    """Connect to these endpoints with `key` (None: as DEEPSEEK_CPU_RPC_KEY_FILE says) from now on.
    The engine's own connections learn it in engine_keys, once the engine is loaded."""
    for ep in endpoints:
        if key:
            _keys[ep] = key
        else:
            _keys.pop(ep, None)


def key_for(endpoint: str, environ=os.environ) -> bytes | None:
    return _keys[endpoint] if endpoint in _keys else env_key(environ)


def engine_keys(rpc_lib, endpoints: list[str]) -> None:
    """Hand each endpoint's key (or none) to the engine (libggml-rpc, ggml_dsc_rpc_set_key)."""
    try:
        set_key = rpc_lib.ggml_dsc_rpc_set_key
    except AttributeError:
        if any(ep in _keys for ep in endpoints):
            raise RpcError("this build of the engine cannot authenticate to RPC workers (rebuild deepseek-cpu)") from None
        return
    import ctypes
    set_key.restype = None
    set_key.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    for ep in endpoints:
        key = _keys.get(ep)
        set_key(ep.encode(), key, len(key) if key else 0)


def mac(key: bytes, label: bytes, nc: bytes, ns: bytes) -> bytes:
    return hmac.new(key, label + nc + ns, hashlib.sha256).digest()


def handshake(sock: socket.socket, key: bytes, endpoint: str) -> None:
    """The client's side: prove `key` to the worker on `sock`, and check that it knows it too.
    RpcError (one line, naming the worker) if it does not; socket.timeout propagates."""
    nc = secrets.token_bytes(NONCE)
    try:
        sock.sendall(struct.pack("<BQ", CMD_AUTH, len(MAGIC_AUTH) + NONCE) + MAGIC_AUTH + nc)
        (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
        reply = _recv_exact(sock, size) if size in (8, 8 + NONCE + 32) else b""
    except ConnectionError:
        raise RpcError(f"worker {endpoint} closed the connection at the key handshake: it does not authenticate "
                       f"(another deepseek-cpu version, or a stock ggml-rpc-server)") from None
    if reply == MAGIC_NO_KEY:
        raise RpcError(f"worker {endpoint} has no key, and this client was given one: "
                       f"start the worker with --key-file (or connect without a key)")
    if len(reply) != 8 + NONCE + 32 or not reply.startswith(MAGIC_AUTH):
        raise RpcError(f"worker {endpoint} answered the key handshake with something else (not a deepseek-cpu worker?)")
    ns, proof = reply[8:8 + NONCE], reply[8 + NONCE:]
    if not hmac.compare_digest(proof, mac(key, LABEL_WORKER, nc, ns)):
        raise RpcError(f"worker {endpoint} does not know this client's key (another key, or not the worker meant)")
    sock.sendall(struct.pack("<BQ", CMD_AUTH, 32) + mac(key, LABEL_CLIENT, nc, ns))


def need_key_message(endpoint: str) -> str:
    return (f"worker {endpoint} requires a key, and this client has none: give it the worker's key "
            f"(rpc_key_file=..., --rpc-key-file, or {ENV_KEY_FILE})")
