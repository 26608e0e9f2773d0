"""`deepseek_cpu.Llama`: llama_cpp.Llama with CPU defaults chosen for DeepSeek models.

Same signature as llama_cpp.Llama; only arguments the caller leaves out get our
defaults:
  - n_threads / n_threads_batch: physical cores of this process (affinity, cgroup quota)
  - n_ctx: the largest context (up to the model's own, at most 32768) whose KV cache fits
    in a quarter of the memory left after the weights, instead of llama-cpp-python's 512
    or the 163840-token training length that runs machines out of memory
  - flash_attn: off; on CPU it costs accuracy (~2% on logits) for a speed gain we have
    not yet measured on our build
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from . import _dropin, resources

_dropin.activate()

import llama_cpp  # noqa: E402  (after the drop-in has chosen the library)

MAX_DEFAULT_CTX = 32768
MIN_DEFAULT_CTX = 512


@dataclass
class ModelShape:
    arch: str
    n_layer: int
    n_ctx_train: int
    kv_bytes_per_token: int  # f16 KV cache
    file_size: int


def read_shape(path: str) -> ModelShape | None:
    """The few GGUF keys needed to size a context (None if the file is unreadable)."""
    import gguf
    try:
        r = gguf.GGUFReader(path, "r")
    except Exception:
        return None

    def val(key, default=None):
        f = r.fields.get(key)
        if f is None or not f.data:
            return default
        return f.parts[f.data[0]].tolist()[0] if len(f.data) == 1 else default

    arch_f = r.fields.get("general.architecture")
    arch = bytes(arch_f.parts[arch_f.data[0]]).decode() if arch_f else "unknown"
    n_layer = int(val(f"{arch}.block_count", 0) or 0)
    n_ctx_train = int(val(f"{arch}.context_length", 4096) or 4096)
    kv_lora = val(f"{arch}.attention.kv_lora_rank")
    if kv_lora is not None:
        # MLA: one latent row (kv_lora + rope dims) per token and layer
        per_layer = int(kv_lora) + int(val(f"{arch}.rope.dimension_count", 64))
    else:
        heads_kv = int(val(f"{arch}.attention.head_count_kv", 1) or 1)
        per_layer = heads_kv * (int(val(f"{arch}.attention.key_length", 128)) + int(val(f"{arch}.attention.value_length", 128)))
    return ModelShape(arch, n_layer, n_ctx_train, 2 * per_layer * max(n_layer, 1), os.path.getsize(path))


def default_n_ctx(shape: ModelShape | None, available: int | None = None) -> int:
    if shape is None:
        return 4096
    available = resources.available_memory() if available is None else available
    budget = max(0, available - shape.file_size) // 4
    fits = budget // max(shape.kv_bytes_per_token, 1)
    n = min(shape.n_ctx_train, MAX_DEFAULT_CTX, max(fits, MIN_DEFAULT_CTX))
    return max(MIN_DEFAULT_CTX, n // 256 * 256) if n >= 256 else n


def cpu_defaults(model_path: str, given: dict) -> dict:
    out = {}
    if given.get("n_threads") is None:
        out["n_threads"] = resources.default_threads()
    if given.get("n_threads_batch") is None:
        out["n_threads_batch"] = given.get("n_threads") or out.get("n_threads")
    if "n_ctx" not in given:
        out["n_ctx"] = default_n_ctx(read_shape(model_path))
    if "flash_attn" not in given:
        out["flash_attn"] = False
    return out


class Llama(llama_cpp.Llama):
    __doc__ = (llama_cpp.Llama.__doc__ or "") + "\n\n" + (__doc__ or "")

    def __init__(self, model_path: str, *args, **kwargs):
        if not args:
            kwargs = {**cpu_defaults(model_path, kwargs), **kwargs}
        super().__init__(model_path, *args, **kwargs)
