"""Model-load settings that llama-cpp-python's Llama() has no argument for, for one load.

Llama.__init__ builds its llama_model_params from llama_model_default_params(); while
no_repacking() or with_mtp() is active, the defaults it reads carry the setting. mapped() sets the engine's
DEEPSEEK_CPU_MAPPED for the load, environment() any such variable (DEEPSEEK_CPU_REPACK_CACHE).
"""
from __future__ import annotations

import contextlib
import os

import llama_cpp

from .memory_budget import MAPPED_ENV


@contextlib.contextmanager
def _patched_defaults(change):
    mod = llama_cpp.llama.llama_cpp
    orig = mod.llama_model_default_params

    def defaults():
        p = orig()
        change(p)
        return p
    mod.llama_model_default_params = defaults
    try:
        yield
    finally:
        mod.llama_model_default_params = orig


def no_repacking():
    """Every weight in the plain CPU buffer: used from the file mapping, nothing copied
    (llama.cpp's extra, repacking, buffer types off)."""
    def change(p):
        p.use_extra_bufts = False
    return _patched_defaults(change)


def with_mtp():
    """Load the multi-token-prediction (MTP) layer too: llama.cpp skips it unless asked (it is
    only the draft head; runtime/mtp.py)."""
    def change(p):
        p.load_mtp = True
    return _patched_defaults(change)


@contextlib.contextmanager
def rollback_snapshots(n: int):
    """Contexts made meanwhile keep n snapshots of a recurrent state per sequence, so that the last
    n positions can be dropped again (speculative drafts the sampler rejects). Only caches with such
    a state use it (DeepSeek-V4's compressors); llama.cpp ignores it for the others."""
    mod = llama_cpp.llama.llama_cpp
    orig = mod.llama_context_default_params

    def defaults():
        p = orig()
        p.n_rs_seq = n
        return p
    mod.llama_context_default_params = defaults
    try:
        yield
    finally:
        mod.llama_context_default_params = orig


@contextlib.contextmanager
def environment(name: str, value: str | None):
    """The engine's loader setting `name` (an environment variable it reads while loading) set to
    `value` for one load, as it was afterwards; None: left as it is."""
    if value is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def mapped(pattern: str):
    """Tensors whose name matches `pattern` (a regular expression, searched) stay in the plain CPU
    buffer, used from the file mapping; the others are placed as usual (repacked, copied). The
    engine's loader reads DEEPSEEK_CPU_MAPPED (src/dsc/loader-mapped.cpp): llama.cpp's own tensor
    overrides still repack a tensor overridden to the CPU buffer type."""
    return environment(MAPPED_ENV, pattern)
