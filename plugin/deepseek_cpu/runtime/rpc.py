"""Models split across hosts: llama.cpp's RPC backend, built from our patched tree.

A worker (`deepseek-cpu rpc-worker`, runtime/rpc_worker.py) holds a contiguous range of layers
in its memory and computes them when asked; the client holds the token embeddings (and any
layers given to it with `rpc_local`), runs the graph and passes activations along. Each layer's
weights go to its host once, at load; a worker started with a cache keeps them on its disk, so
a reconnect sends hashes, not weights.

This module is the client's side of a load: the workers' devices attached in this process, the
model's layers placed by the split, and the patched backend's record of lost workers read back
(patches/rpc/, ggml-rpc/dsc-rpc.h). Probing workers is rpc_wire.py's, planning the split
rpc_split.py's, the shared key rpc_auth.py's; their names are importable from here too.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from . import rpc_auth
from .rpc_split import (COMPUTE_RESERVE_FRACTION, COMPUTE_RESERVE_MIN, OUTPUT_PATTERN, Share, Split,  # noqa: F401
                        plan_split, unit_sizes, usable)
from .rpc_wire import (CMD_DEVICE_COUNT, CMD_GET_DEVICE_MEMORY, CMD_HELLO, CONN_CAPS_SIZE, DEFAULT_PORT,  # noqa: F401
                       DEFAULT_TIMEOUT, ENV_TIMEOUT, PROTO_MAJOR, RpcError, RpcWorkerLost, Worker, _call, parse_endpoints,
                       probe, timeout_s)


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
    rpc_auth.engine_keys(_lib("libggml-rpc.so"), endpoints)  # before any connection of the engine's
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


# ---- a load over workers ----

DEFAULT_CTX = 4096  # the KV cache lives on the workers, so the local memory rule does not apply


def plan_for(model: str, endpoints: list[str], local_offer: int, n_ctx: int, header=None) -> Split:
    """Probe each worker for the memory it offers and split the model's layers by it."""
    from ..gguf_header import read
    from .model_file import read_shape
    header = header or read(model)
    shape = read_shape(model, header)
    n_layer = shape.n_layer if shape else 0
    kv_per_layer = (shape.kv_bytes_per_token // max(n_layer, 1)) * n_ctx if shape else 0
    n_layer, sizes = unit_sizes(model, kv_per_layer, header)
    workers = [(ep, probe(ep).free) for ep in endpoints]
    return plan_split(n_layer, sizes, local_offer, workers)


@dataclass
class RpcLoad:
    """A model load over workers: the split, and `params`, the context manager under which
    llama_cpp.Llama loads with the workers' devices (only those) and the split's layer counts.
    The load points the engine at C arrays this object holds: keep it as long as the model."""
    split: Split
    params: object
    _arrays: tuple


def prepare(model: str, rpc_servers, rpc_local, kwargs: dict, verbose: bool = True, header=None,
            rpc_key: str | bytes | None = None, rpc_key_file=None) -> RpcLoad:
    """For Llama(..., rpc_servers=...): sets kwargs' layer counts from the split over the workers.
    rpc_key / rpc_key_file: the workers' shared key (rpc_auth.py); neither: DEEPSEEK_CPU_RPC_KEY_FILE's."""
    import sys
    from . import model_params
    from .resources import parse_size
    endpoints = parse_endpoints(rpc_servers)
    rpc_auth.use(endpoints, rpc_auth.resolve(rpc_key, rpc_key_file))
    kwargs.setdefault("n_ctx", DEFAULT_CTX)
    for arg in ("n_gpu_layers", "tensor_split"):
        if arg in kwargs:
            raise RpcError(f"{arg} is set from the split over rpc_servers; leave it out")
    split = plan_for(model, endpoints, parse_size(rpc_local, "rpc_local") if rpc_local else 0, kwargs["n_ctx"], header)
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
    return RpcLoad(split, model_params._patched_defaults(change), (array, overrides))


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
