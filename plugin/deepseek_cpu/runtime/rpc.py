"""Models split across hosts: llama.cpp's RPC backend, built from our patched tree.

A worker (`deepseek-cpu rpc-worker`, runtime/rpc_worker.py) holds a contiguous range of layers
in its memory and computes them when asked; the client holds the token embeddings (and any
layers given to it with `rpc_local`), runs the graph and passes activations along. Each layer's
weights go to its host once, at load; a worker started with a cache keeps them on its disk, so
a reconnect sends hashes, not weights.

This module is the client's side: endpoints parsed and probed (in Python, with a timeout, before
llama.cpp connects: its own connect aborts the process on a dead endpoint), the workers'
devices registered in this process, the layers split by the memory each host offers, and the
patched backend's record of lost workers read back (patches/rpc/, ggml-rpc/dsc-rpc.h).
"""
from __future__ import annotations

import ctypes
import os
import re
import socket
import struct
from dataclasses import dataclass, field

from ..errors import DeepseekCpuError

DEFAULT_PORT = 50052
ENV_TIMEOUT = "DEEPSEEK_CPU_RPC_TIMEOUT"  # seconds; read by the patched backend too (dsc-rpc.cpp)
DEFAULT_TIMEOUT = 15

# the wire protocol (ggml/include/ggml-rpc.h, ggml/src/ggml-rpc/ggml-rpc.cpp at the pinned commit)
PROTO_MAJOR = 7
CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
CONN_CAPS_SIZE = 24

# what a worker needs beyond its layers' weights: the compute buffer (activations of one batch)
COMPUTE_RESERVE_MIN = 256 << 20
COMPUTE_RESERVE_FRACTION = 0.10


class RpcError(DeepseekCpuError):
    """A worker could not be used: unparsable endpoint, unreachable, busy, another version."""


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


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the worker")
        buf += chunk
    return bytes(buf)


def _call(sock: socket.socket, cmd: int, payload: bytes, reply_size: int) -> bytes:
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size != reply_size:
        raise ConnectionError(f"unexpected reply size {size} to command {cmd}")
    return _recv_exact(sock, size)


def probe(endpoint: str, timeout: float | None = None) -> Worker:
    """Handshake with a worker and ask for its memory; RpcError (never a hang) if it does not answer.

    A worker serves one client at a time: while another client holds it, the connection is
    accepted by the kernel but nothing answers, which is reported as busy."""
    timeout = timeout or timeout_s()
    host, port = endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            hello = _call(s, CMD_HELLO, bytes(CONN_CAPS_SIZE), 4 + CONN_CAPS_SIZE)
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


# ---- the engine's side: devices registered in this process ----

_attached: dict[str, list[int]] = {}  # endpoint -> its ggml_backend_dev_t handles


def _lib(name: str) -> ctypes.CDLL:
    from .engine import lib_dir
    return ctypes.CDLL(os.path.join(str(lib_dir()), name))


def attach(endpoints: list[str]) -> list[int]:
    """The workers' device handles, in the order given (made once per endpoint). They are handed to
    the model load directly and never registered with ggml: a registered device would be used by
    every later load in this process (llama_cpp.Llama's too), which connects to it, holds the
    worker busy, and aborts if it is gone."""
    import llama_cpp  # noqa: F401  (loads our libllama and its libggml first)
    ggml = _lib("libggml.so")
    ggml.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    ggml.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    rpc = ggml.ggml_backend_reg_by_name(b"RPC")
    if not rpc:
        raise RpcError("this build of the engine has no RPC backend (rebuild deepseek-cpu)")
    add = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(
        ggml.ggml_backend_reg_get_proc_address(rpc, b"ggml_backend_rpc_add_server"))
    devices = []
    for ep in endpoints:
        if ep not in _attached:
            probe(ep)  # a clear error instead of llama.cpp's abort on a dead endpoint
            reg = add(ep.encode())
            if not reg:
                raise RpcError(f"worker {ep} reports no devices")
            _attached[ep] = [ggml.ggml_backend_reg_dev_get(reg, i) for i in range(ggml.ggml_backend_reg_dev_count(reg))]
        devices += _attached[ep][:1]  # a CPU worker has one device
    return devices


def losses() -> tuple[int, str]:
    """(how many worker losses this process has seen, the latest one's message)."""
    try:
        fn = _lib("libggml-rpc.so").ggml_dsc_rpc_lost
    except (OSError, AttributeError):
        return 0, ""
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    buf = ctypes.create_string_buffer(512)
    n = fn(buf, len(buf))
    return n, buf.value.decode(errors="replace")


# ---- splitting the layers by memory ----

@dataclass
class Share:
    host: str                 # "local" or an endpoint
    offered: int              # bytes
    units: list[int] = field(default_factory=list)  # layer indices; n_layer is the output layer
    bytes: int = 0


OUTPUT_PATTERN = r"^output\.weight$"  # kept on this host: 20 KiB of hidden state cross the link, not the logits


@dataclass
class Split:
    n_layer: int
    local: Share      # its units: the first layers, if any, and always the output (n_layer)
    workers: list[Share]

    @property
    def n_gpu_layers(self) -> int:
        """llama.cpp's count of layers placed on the devices: the output counts as one (its norm goes
        to the last worker; its weight is overridden to this host's CPU, OUTPUT_PATTERN)."""
        return self.n_layer + 1 - len([u for u in self.local.units if u < self.n_layer])

    @property
    def tensor_split(self) -> list[float]:
        counts = [float(len(w.units)) for w in self.workers]
        counts[-1] += 1  # llama.cpp's output "layer"
        return counts

    def describe(self) -> str:
        def rng(units):
            layers = [u for u in units if u < self.n_layer]
            text = f"layers {layers[0]}-{layers[-1]}" if layers else ""
            if self.n_layer in units:
                text = f"{text} + output" if text else "output"
            return text or "nothing"
        local = f"this host: {rng(self.local.units)} ({self.local.bytes / 2**30:.2f} GiB)"
        return "; ".join([local] + [f"{s.host}: {rng(s.units)} ({s.bytes / 2**30:.2f} of {s.offered / 2**30:.2f} GiB)"
                                    for s in self.workers])


def unit_sizes(model: str, kv_bytes_per_layer: int = 0) -> tuple[int, list[int]]:
    """(n_layer, bytes of each unit): the weights of layer i (plus its KV cache), then the output."""
    from ..gguf_header import read
    h = read(model)
    n_layer = int(h.get(f"{h.arch}.block_count") or 0)
    sizes = [kv_bytes_per_layer] * n_layer + [0]
    for t in h.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        if m and int(m.group(1)) < n_layer:
            sizes[int(m.group(1))] += t.nbytes
        elif t.name.startswith("output"):
            sizes[n_layer] += t.nbytes
    return n_layer, sizes


def usable(offered: int) -> int:
    """What of a worker's offer its layers may take: the rest is its compute buffer (a tenth, at
    least 256 MiB, but never more than half: a tiny model's compute buffer is tiny too)."""
    reserve = max(int(offered * COMPUTE_RESERVE_FRACTION), min(COMPUTE_RESERVE_MIN, offered // 2))
    return max(0, offered - reserve)


def plan_split(n_layer: int, sizes: list[int], local_offer: int, workers: list[tuple[str, int]]) -> Split:
    """Contiguous layers: the local host first (llama.cpp keeps the first layers on the CPU), then
    each worker in the order given, in proportion to what each offers, none past its offer. The
    output stays on the local host, beside the embeddings: sending the logits back would cost
    n_vocab floats per token (400 KiB for DeepSeek's vocabulary) instead of one hidden state."""
    output = sizes[n_layer]
    sizes = sizes[:n_layer]
    shares = [Share("local", local_offer)] + [Share(ep, off) for ep, off in workers]
    caps = [usable(s.offered) if s.host != "local" else s.offered for s in shares]
    total, cap_total = sum(sizes), sum(caps)
    if total > cap_total:
        raise RpcError(f"the model's layers need {total / 2**30:.2f} GiB; the hosts offer "
                       f"{cap_total / 2**30:.2f} GiB for layers (after each worker's compute buffer): "
                       f"add a worker or give more memory (--mem)")

    def assign(proportional: bool) -> bool:
        for s in shares:
            s.units, s.bytes = [], 0
        u, done, cum_cap = 0, 0, 0
        for k, s in enumerate(shares):
            cum_cap += caps[k]
            target = total * cum_cap / cap_total if proportional else float("inf")
            last = k == len(shares) - 1
            while u < len(sizes) and s.bytes + sizes[u] <= caps[k] and (last or done + sizes[u] / 2 <= target):
                s.units.append(u)
                s.bytes += sizes[u]
                done += sizes[u]
                u += 1
        return u == len(sizes)

    if not assign(True) and not assign(False):
        big = max(sizes)
        raise RpcError(f"the layers do not fit the hosts' offers one range each (largest layer "
                       f"{big / 2**30:.2f} GiB; offers {', '.join(f'{c / 2**30:.2f}' for c in caps)} GiB)")
    shares[0].units.append(n_layer)
    shares[0].bytes += output
    return Split(n_layer, shares[0], shares[1:])


# ---- a load over workers ----

DEFAULT_CTX = 4096  # the KV cache lives on the workers, so the local memory rule does not apply


def plan_for(model: str, endpoints: list[str], local_offer: int, n_ctx: int) -> Split:
    """Probe each worker for the memory it offers and split the model's layers by it."""
    from .llama import read_shape
    shape = read_shape(model)
    n_layer = shape.n_layer if shape else 0
    kv_per_layer = (shape.kv_bytes_per_token // max(n_layer, 1)) * n_ctx if shape else 0
    n_layer, sizes = unit_sizes(model, kv_per_layer)
    workers = [(ep, probe(ep).free) for ep in endpoints]
    return plan_split(n_layer, sizes, local_offer, workers)


def prepare(model: str, rpc_servers, rpc_local, kwargs: dict, verbose: bool = True):
    """For Llama(..., rpc_servers=...): the split, and the context manager under which the model
    loads with the workers' devices (only those) and the split's layer counts."""
    import sys
    from . import model_params
    from .memory_budget import parse_size
    endpoints = parse_endpoints(rpc_servers)
    kwargs.setdefault("n_ctx", DEFAULT_CTX)
    for arg in ("n_gpu_layers", "tensor_split"):
        if arg in kwargs:
            raise RpcError(f"{arg} is set from the split over rpc_servers; leave it out")
    split = plan_for(model, endpoints, parse_size(rpc_local) if rpc_local else 0, kwargs["n_ctx"])
    devices = attach(endpoints)
    kwargs["n_gpu_layers"] = split.n_gpu_layers
    kwargs["tensor_split"] = split.tensor_split
    if verbose:
        print(f"deepseek-cpu: split over {len(endpoints)} worker(s): {split.describe()}", file=sys.stderr)
    array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
    overrides = _cpu_override(OUTPUT_PATTERN)

    def change(p):
        p.devices = ctypes.cast(array, ctypes.c_void_p)
        p.tensor_buft_overrides = ctypes.cast(overrides[0], ctypes.c_void_p)
    return split, model_params._patched_defaults(change), (array, overrides)


class _BuftOverride(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]  # llama_model_tensor_buft_override


def _cpu_override(pattern: str):
    """llama_model_params.tensor_buft_overrides placing weights matching `pattern` on this host's CPU."""
    ggml = _lib("libggml.so")
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    ggml.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    cpu = ggml.ggml_backend_dev_buffer_type(ggml.ggml_backend_dev_by_type(0))  # GGML_BACKEND_DEVICE_TYPE_CPU
    name = pattern.encode()
    table = (_BuftOverride * 2)(_BuftOverride(name, cpu), _BuftOverride(None, None))
    return table, name


def check(since: int) -> None:
    """Raise RpcWorkerLost if a worker was lost after loss count `since`."""
    n, message = losses()
    if n > since:
        raise RpcWorkerLost(f"{message}; this model cannot continue: load it again once the worker is back")
