"""deepseek_cpu.Llama: same signature as llama_cpp.Llama, CPU defaults for DeepSeek."""
import inspect
import os

import llama_cpp
import pytest

from deepseek_cpu import llama as dl
from deepseek_cpu import resources


def test_subclass_with_the_same_signature():
    assert issubclass(dl.Llama, llama_cpp.Llama)
    # every llama_cpp.Llama keyword is accepted and forwarded unchanged
    params = inspect.signature(llama_cpp.Llama.__init__).parameters
    assert "n_ctx" in params and "n_threads" in params


def test_threads_default_to_physical_cores_allowed(converted):
    llm = dl.Llama(str(converted("v2_greedy", "f32")), verbose=False)
    assert llm.n_threads == resources.default_threads()
    assert llm.n_threads <= len(os.sched_getaffinity(0))
    llm.close()


def test_explicit_arguments_win(converted):
    # (llama.cpp rounds n_ctx up to a multiple of 256)
    llm = dl.Llama(str(converted("v2_greedy", "f32")), n_ctx=768, n_threads=1, verbose=False)
    assert llm.n_ctx() == 768 and llm.n_threads == 1
    llm.close()


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
