"""A memory budget: weights used from the file mapping, the always-hot set locked, popular experts
warmed from saved statistics (runtime/memory_budget.py, runtime/prefetch.py)."""
import json

import numpy as np
import pytest

from deepseek_cpu.runtime import memory_budget, prefetch

MODEL = "v2_lite"
TOKENS = [3, 17, 42, 99, 120, 7, 250, 31, 64, 128, 200, 11]


@pytest.fixture(scope="module")
def gguf(converted):
    return str(converted(MODEL, "f32"))


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPSEEK_CPU_CACHE", str(tmp_path / "cache"))


def _logits(llm):
    llm.reset()
    llm.eval(TOKENS)
    return np.asarray(llm.scores[:len(TOKENS)]).copy()


@pytest.mark.parametrize("text, n", [("4G", 4 << 30), ("512M", 512 << 20), ("1.5GiB", int(1.5 * 2**30)),
                                     ("4096", 4096), (1 << 20, 1 << 20)])
def test_sizes(text, n):
    assert memory_budget.parse_size(text) == n


@pytest.mark.parametrize("bad", ["", "four", "-1G", "0", "4X"])
def test_bad_sizes_are_clear_errors(bad):
    with pytest.raises(memory_budget.MemoryBudgetError, match="memory budget"):
        memory_budget.parse_size(bad)


def test_budget_below_the_always_hot_set_names_both_sizes(gguf):
    from deepseek_cpu import Llama
    hot, experts = memory_budget.tensor_bytes(gguf)
    assert hot > 0 and experts > 0
    with pytest.raises(memory_budget.MemoryBudgetError) as e:
        Llama(gguf, n_ctx=64, mem_budget=hot // 2, verbose=False)
    msg = str(e.value)
    assert memory_budget.gib(hot // 2) in msg and "always-hot" in msg


def test_budgeted_model_gives_the_same_logits(gguf):
    from deepseek_cpu import Llama
    ref = _logits(Llama(gguf, n_ctx=64, logits_all=True, verbose=False))
    llm = Llama(gguf, n_ctx=64, logits_all=True, mem_budget="1G", verbose=False)
    np.testing.assert_allclose(_logits(llm), ref, rtol=0, atol=1e-5)
    layout = llm.memory_layout
    assert {t.name for t in layout.expert_tensors} == {t.name for t in layout.tensors
                                                        if memory_budget.EXPERT_TENSORS.search(t.name)}
    assert not llm.memory_placement.warm and not llm.memory_placement.hot  # no statistics yet
    # the file is mapped: the experts are read from it
    assert prefetch.file_mapping(layout.path) is not None


def _anonymous_kib() -> int:
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Anonymous:"):
            return int(line.split()[1])
    raise AssertionError("no Anonymous line in smaps_rollup")


def test_experts_stay_in_the_file_mapping(tmp_path_factory):
    """On a quantized model (where the engine would otherwise repack every weight into anonymous
    memory), a budgeted load copies only the always-hot set: the engine's loader reads the experts'
    DEEPSEEK_CPU_MAPPED pattern. The logits follow the fully repacked load's (other kernels, the same
    products)."""
    from deepseek_cpu import Llama
    from deepseek_cpu.tools import synth
    path = synth.synthesize(tmp_path_factory.mktemp("budget") / "v2-lite-3.gguf", "v2-lite", "q4_0", layers=3,
                            tokenizer="offline", progress=False)
    hot, experts = memory_budget.tensor_bytes(path)
    assert experts > hot
    before = _anonymous_kib()
    full = Llama(str(path), n_ctx=64, logits_all=True, verbose=False)
    grown_full = (_anonymous_kib() - before) << 10
    ref = _logits(full)
    full.close()
    del full
    before = _anonymous_kib()
    llm = Llama(str(path), n_ctx=64, logits_all=True, mem_budget="2G", verbose=False)
    grown = (_anonymous_kib() - before) << 10
    assert grown_full > experts * 0.9, (grown_full, experts)       # the default copies the experts
    assert grown < grown_full - experts * 0.9, (grown, grown_full)  # the budgeted load does not
    got = _logits(llm)
    print("max |diff| / max |logit|:", np.abs(got - ref).max() / np.abs(ref).max(),
          "same top token:", (got.argmax(axis=1) == ref.argmax(axis=1)).mean())
    assert (got.argmax(axis=1) == ref.argmax(axis=1)).mean() >= 0.75
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-2 * np.abs(ref).max())
    assert "DEEPSEEK_CPU_MAPPED" not in __import__("os").environ  # set for the load only


def test_statistics_persist_and_warm_the_next_start(gguf):
    from deepseek_cpu import Llama
    llm = Llama(gguf, n_ctx=64, mem_budget="1G", verbose=False)
    llm.reset_expert_usage()
    llm.eval(TOKENS)
    path = llm.save_expert_usage()
    assert path is not None and path.exists()
    saved = json.loads(path.read_text())
    assert saved["model_id"] == llm.memory_layout.model_id and sum(map(sum, saved["counts"].values())) > 0
    again = Llama(gguf, n_ctx=64, mem_budget="1G", verbose=False)
    warm = again.memory_placement.warm
    assert warm and all("_exps.weight[" in r.what for r in warm)
    # the most used expert of the most used layer comes first
    counts = {int(k): v for k, v in saved["counts"].items()}
    layer = max(counts, key=lambda k: max(counts[k]))
    assert warm[0].what.startswith(f"blk.{layer}.") and warm[0].what.endswith(f"[{int(np.argmax(counts[layer]))}]")


def test_a_corrupt_or_foreign_sidecar_is_ignored_with_a_warning(gguf):
    layout = prefetch.layout(gguf)
    path = prefetch.sidecar_path(layout)
    path.parent.mkdir(parents=True)
    for content in ("{not json", json.dumps({"version": 1, "model_id": "another", "counts": {}})):
        path.write_text(content)
        with pytest.warns(UserWarning, match="ignored"):
            assert prefetch.load_counts(layout) is None


def test_a_policy_that_raises_falls_back_to_the_built_in(gguf, monkeypatch):
    class Broken:
        def plan(self, model, counts, budget):
            raise RuntimeError("boom")
    monkeypatch.setattr(prefetch, "policies", lambda: {"popular": prefetch.PopularExperts(), "broken": Broken()})
    layout = prefetch.layout(gguf)
    budget = memory_budget.plan(gguf, 1 << 30, 0)
    with pytest.warns(UserWarning, match="'broken' failed .*boom"):
        placement, _, used = prefetch.run_policy("broken", layout, budget)
    assert used == "popular" and isinstance(placement, prefetch.Placement)
    with pytest.raises(ValueError, match="unknown prefetch policy 'nope'"):
        prefetch.run_policy("nope", layout, budget)


def test_built_in_policies_come_through_the_hook():
    found = prefetch.policies()
    assert {"popular", "none"} <= set(found)


def test_a_memory_cgroup_limit_bounds_the_memory_we_plan_for(tmp_path):
    """A process in a memory cgroup (v1 here) sees the room under its limit, not the machine's
    free memory: default contexts and budgets are sized for the container."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path("/sys/fs/cgroup/memory")
    if os.geteuid() != 0 or not (root / "cgroup.procs").exists():
        pytest.skip("needs root and the cgroup v1 memory controller")
    group = root / f"dsc-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(1 << 30))
        code = "from deepseek_cpu.runtime import resources as r; print(r.available_memory())"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
        assert out.returncode == 0, out.stderr
        assert 0 < int(out.stdout) <= 1 << 30
    finally:
        group.rmdir()
