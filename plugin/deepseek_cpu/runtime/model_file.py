"""What a model's GGUF header says about running it: its shape, and the context that fits.

Light on purpose (the header reader and gguf's key names, no libllama): `serve` sizes a child
server's context with it without loading the engine into its own process. Each caller reads the
header once (gguf_header.read) and passes it to whatever else needs it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import gguf

from ..gguf_header import GGUFHeader, read
from . import resources

MAX_DEFAULT_CTX = 32768
MIN_DEFAULT_CTX = 512


@dataclass
class ModelShape:
    arch: str
    n_layer: int
    n_ctx_train: int
    kv_bytes_per_token: int  # f16 KV cache
    file_size: int


def read_shape(path: str | os.PathLike, header: GGUFHeader | None = None) -> ModelShape | None:
    """The few GGUF keys needed to size a context (None if the file is unreadable); from
    `header` where the caller has read it already."""
    if header is None:
        try:
            header = read(path)
        except (OSError, ValueError):
            return None
    h = header

    def val(key, default=None):
        v = h.get(key)
        return default if v is None or isinstance(v, str) else v

    K = gguf.Keys
    arch = h.arch
    n_layer = int(val(K.LLM.BLOCK_COUNT.format(arch=arch), 0) or 0)
    n_ctx_train = int(val(K.LLM.CONTEXT_LENGTH.format(arch=arch), 4096) or 4096)
    kv_lora = val(K.Attention.KV_LORA_RANK.format(arch=arch))
    if kv_lora is not None:
        # MLA: one latent row (kv_lora + rope dims) per token and layer
        per_layer = int(kv_lora) + int(val(K.Rope.DIMENSION_COUNT.format(arch=arch), 64))
    else:
        heads_kv = int(val(K.Attention.HEAD_COUNT_KV.format(arch=arch), 1) or 1)
        per_layer = heads_kv * (int(val(K.Attention.KEY_LENGTH.format(arch=arch), 128)) +
                                int(val(K.Attention.VALUE_LENGTH.format(arch=arch), 128)))
    return ModelShape(arch, n_layer, n_ctx_train, 2 * per_layer * max(n_layer, 1), h.size)


def default_n_ctx(shape: ModelShape | None, available: int | None = None, weights: int | None = None) -> int:
    """weights: the bytes the weights take in memory (default: the file's size)."""
    if shape is None:
        return 4096
    available = resources.available_memory() if available is None else available
    budget = max(0, available - (shape.file_size if weights is None else weights)) // 4
    fits = budget // max(shape.kv_bytes_per_token, 1)
    n = min(shape.n_ctx_train, MAX_DEFAULT_CTX, max(fits, MIN_DEFAULT_CTX))
    # a multiple of 256 (MIN_DEFAULT_CTX is one), never past the model's own context: a
    # floor above a short training length only buys positions the model never saw
    return n // 256 * 256 if n >= 256 else n


# llama-server's own prompt-cache limit (--cache-ram 8192 MiB), which it keeps whatever the machine has
MAX_PROMPT_CACHE = 8 << 30


def prompt_cache_bytes(shape: ModelShape | None, n_ctx: int, available: int | None = None,
                       weights: int | None = None) -> int:
    """What llama-server's prompt cache (--cache-ram) may hold: a quarter of the memory left beside
    the weights (default: the file's size) and the KV cache of n_ctx tokens, at most llama-server's
    own 8 GiB. The cache grows with every distinct prompt, so its default could take a small
    machine's last gigabytes."""
    if shape is None:
        return MAX_PROMPT_CACHE
    available = resources.available_memory() if available is None else available
    spare = available - (shape.file_size if weights is None else weights) - shape.kv_bytes_per_token * n_ctx
    return max(0, min(MAX_PROMPT_CACHE, spare // 4))
