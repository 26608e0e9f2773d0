"""deepseek_cpu.Llama: same signature as llama_cpp.Llama, CPU defaults for DeepSeek."""
import os

import llama_cpp
import pytest

from deepseek_cpu.runtime import llama as dl
from deepseek_cpu.runtime import resources


def _context(llm):
    """What llama.cpp's context really runs with, read back from the C side."""
    c = llm._ctx.ctx
    return {"n_ctx": llama_cpp.llama_n_ctx(c), "n_batch": llama_cpp.llama_n_batch(c),
            "n_ubatch": llama_cpp.llama_n_ubatch(c), "n_threads": llama_cpp.llama_n_threads(c),
            "n_threads_batch": llama_cpp.llama_n_threads_batch(c),
            "flash_attn": llm.context_params.flash_attn_type != llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}


def test_defaults_reach_the_context(converted):
    """Given only a path: both thread counts are the cores we may use (llama-cpp-python: half the
    CPUs for one phase, all for the other), the context fits memory but not beyond the 256
    positions this model was trained on (config.json; llama-cpp-python: 512), flash attention
    off, batch sizes llama-cpp-python's (512, capped at n_ctx by llama.cpp)."""
    assert issubclass(dl.Llama, llama_cpp.Llama)  # a drop-in: isinstance checks still hold
    llm = dl.Llama(str(converted("v2_greedy", "f32")), verbose=False)
    got = _context(llm)
    llm.close()
    threads = resources.default_threads()
    assert threads <= len(os.sched_getaffinity(0))
    assert got == {"n_ctx": 256, "n_batch": 256, "n_ubatch": 256, "n_threads": threads,
                   "n_threads_batch": threads, "flash_attn": False}


def test_explicit_arguments_win(converted):
    # every keyword is llama_cpp.Llama's, forwarded unchanged over our defaults
    # (n_ctx beyond the model's own is the caller's choice; llama.cpp rounds it up to a multiple of 256)
    path = str(converted("v2_greedy", "f32"))
    llm = dl.Llama(path, n_ctx=768, n_batch=64, n_ubatch=32, n_threads=1, n_threads_batch=2, flash_attn=True,
                   verbose=False)
    got = _context(llm)
    llm.close()
    assert got == {"n_ctx": 768, "n_batch": 64, "n_ubatch": 32, "n_threads": 1, "n_threads_batch": 2,
                   "flash_attn": True}
    # n_threads alone sets both phases (llama-cpp-python would run prefill on every CPU)
    llm = dl.Llama(path, n_ctx=256, n_threads=1, verbose=False)
    got = _context(llm)
    llm.close()
    assert (got["n_threads"], got["n_threads_batch"]) == (1, 1)


def test_default_context_fits_memory_not_the_training_length(converted):
    path = str(converted("v2_lite", "f32"))  # declares a 163840-token training context
    shape = dl.read_shape(path)
    assert shape.n_ctx_train == 163840
    n = dl.default_n_ctx(shape)
    assert dl.MIN_DEFAULT_CTX <= n <= dl.MAX_DEFAULT_CTX
    # with little memory free the default shrinks instead of running out
    small = dl.default_n_ctx(shape, available=shape.file_size + 4 * 2000 * shape.kv_bytes_per_token)
    assert small == 1792  # 2000 tokens fit, rounded down to a multiple of 256
    tiny = dl.default_n_ctx(shape, available=shape.file_size)
    assert tiny == dl.MIN_DEFAULT_CTX
    llm = dl.Llama(path, verbose=False)
    assert llm.n_ctx() == n
    llm.close()


def test_affinity_limits_threads(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert resources.default_threads() == 1


def test_cgroup_quota_limits_threads(monkeypatch):
    monkeypatch.setattr(resources, "cgroup_cpu_limit", lambda: 1.0)
    assert resources.default_threads() == 1
