"""A memory budget: the routed experts used from the file mapping, the rest copied as usual, popular
experts warmed from saved statistics (runtime/memory_budget.py, runtime/prefetch.py), under a real
memory limit too."""
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import runner_lacks
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
    assert memory_budget.format_size(hot // 2) in msg and "always-hot" in msg


@pytest.fixture(scope="module")
def q4(converted, tmp_path_factory):
    """The fixture at q4_0 (llama.cpp's quantizer): weights the engine repacks by default, so a
    budget changes which kernels run the experts (an f32 model is never repacked)."""
    from deepseek_cpu.hub.conversion import quantize
    return str(quantize(converted(MODEL, "f32"), tmp_path_factory.mktemp("q4") / f"{MODEL}-q4_0.gguf", "q4_0",
                        progress=False, nthread=2))


def _load_logged(path, **kw):
    """A Llama and its engine's log of the load (verbose: llama.cpp's log goes to sys.stderr)."""
    import io
    from deepseek_cpu import Llama
    log = io.StringIO()
    with contextlib.redirect_stderr(log):
        llm = Llama(path, n_ctx=64, logits_all=True, verbose=True, **kw)
    return llm, log.getvalue()


def _repacked(log: str) -> set[str]:
    """The tensors ggml's CPU repack buffer says it repacked ("repack: repack tensor X with ...")."""
    import re
    return set(re.findall(r"repack tensor (\S+) with", log))


def _gguf_py_experts(path) -> dict[str, tuple[int, int]]:
    """The routed experts' tensors by gguf-py (not by memory_budget's pattern): gguf-py's names for
    ffn_{gate,up,down}_exps in each block after the leading dense ones, each stacked over
    expert_count; name -> (offset in the file, bytes)."""
    import gguf as gguf_py
    r = gguf_py.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    n_layer = int(r.fields[f"{arch}.block_count"].contents())
    n_dense = int(r.fields[f"{arch}.leading_dense_block_count"].contents())
    n_expert = int(r.fields[f"{arch}.expert_count"].contents())
    kinds = (gguf_py.MODEL_TENSOR.FFN_GATE_EXP, gguf_py.MODEL_TENSOR.FFN_UP_EXP, gguf_py.MODEL_TENSOR.FFN_DOWN_EXP)
    names = {gguf_py.TENSOR_NAMES[k].format(bid=b) + ".weight" for b in range(n_dense, n_layer) for k in kinds}
    found = {t.name: t for t in r.tensors if t.name in names}
    assert set(found) == names and n_layer > n_dense, (sorted(names), sorted(found))
    assert all(len(t.shape) == 3 and int(t.shape[2]) == n_expert for t in found.values())
    return {n: (int(t.data_offset), int(t.n_bytes)) for n, t in found.items()}  # data_offset: in the file


def test_budgeted_model_gives_the_same_logits(q4):
    """Under a budget the routed experts, and only they, leave the repacked path (the engine's own
    log says which tensors it repacked), the logits follow the full load's, and the statistics of
    one run place expert slices, all inside the experts' bytes, at the next start."""
    experts = _gguf_py_experts(q4)
    full, full_log = _load_logged(q4)
    ref = _logits(full)
    full.close()
    llm, log = _load_logged(q4, mem_budget="1G")
    # the default repacks the experts (else the budget has nothing to change here); the budget
    # leaves them in the file mapping and repacks the rest as before
    assert set(experts) <= _repacked(full_log), sorted(set(experts) - _repacked(full_log))
    assert _repacked(log) == _repacked(full_log) - set(experts), sorted(_repacked(log) ^ _repacked(full_log))
    layout = llm.memory_layout
    assert {t.name: (t.offset, t.nbytes) for t in layout.expert_tensors} == experts
    assert prefetch.file_mapping(layout.path) is not None  # the file is mapped: the experts are read from it
    # other kernels, the same products (as in test_experts_stay_in_the_file_mapping)
    got = _logits(llm)
    assert (got.argmax(axis=1) == ref.argmax(axis=1)).mean() >= 0.75
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-2 * np.abs(ref).max())
    # no statistics yet: nothing placed; this run's routings are saved at close ...
    assert not llm.memory_placement.warm and not llm.memory_placement.hot
    llm.close()
    again, _ = _load_logged(q4, mem_budget="1G")
    try:
        # ... and the next start reads ahead the experts they used, inside the experts' bytes
        placed = again.memory_placement.warm + again.memory_placement.hot
        assert placed, "statistics saved, yet the next start placed nothing"
        for r in placed:
            name = r.what.rsplit("[", 1)[0]
            start, n = experts[name]
            assert start <= r.offset and r.offset + r.length <= start + n, (r, start, n)
        assert sum(r.length for r in placed) <= sum(n for _, n in experts.values())
    finally:
        again.close()


def test_a_budgeted_load_reads_the_header_once(gguf, monkeypatch):
    """The context, the budget plan and the layout all come from one reading of the GGUF's header
    (a real model's has a 100k-token vocabulary to walk)."""
    from deepseek_cpu import Llama, gguf_header
    reads, parse = [], gguf_header._parse
    monkeypatch.setattr(gguf_header, "_parse", lambda *a: reads.append(a[0]) or parse(*a))
    Llama(gguf, mem_budget="1G", verbose=False).close()
    assert len(reads) == 1, reads


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
    assert "DEEPSEEK_CPU_MAPPED" not in os.environ  # set for the load only


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


@contextlib.contextmanager
def memory_cgroup(limit: int):
    """A v1 memory cgroup limited to `limit` bytes (page cache included); yields a preexec_fn that
    moves a child process into it before it starts."""
    root = Path("/sys/fs/cgroup/memory")
    if os.geteuid() != 0:
        runner_lacks("root", f"uid {os.geteuid()}: memory cgroups")
    if not (root / "cgroup.procs").exists():
        runner_lacks("cgroup1", f"no {root / 'cgroup.procs'}")
    group = root / f"dsc-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit))
        yield lambda: (group / "cgroup.procs").write_text(str(os.getpid()))
    finally:
        for _ in range(50):  # the last child may still be leaving the group
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_a_memory_cgroup_limit_bounds_the_memory_we_plan_for():
    """A process in a memory cgroup (v1 here) sees the room under its limit, not the machine's
    free memory: default contexts and budgets are sized for the container."""
    with memory_cgroup(1 << 30) as join:
        code = "from deepseek_cpu.runtime import resources as r; print(r.available_memory())"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             preexec_fn=join)
    assert out.returncode == 0, out.stderr
    assert 0 < int(out.stdout) <= 1 << 30


RUN_UNDER_LIMIT = """
import sys, numpy as np
from deepseek_cpu import Llama
kw = dict(mem_budget=sys.argv[2]) if sys.argv[2] != "none" else {}
llm = Llama(sys.argv[1], n_ctx=256, verbose=False, **kw)
rng = np.random.default_rng(0)
llm.eval(rng.integers(1000, 100000, 16).tolist())
for t in rng.integers(1000, 100000, 8).tolist():
    llm.eval([int(t)])
print("decoded", llm.n_tokens)
"""


def test_a_model_larger_than_the_memory_limit_runs_under_a_budget(tmp_path_factory):
    """A real limit, enforced by the kernel: a q4_0 model whose experts alone exceed the cgroup's
    memory. Loaded as usual (every weight copied) it cannot run there: killed, or stalled until
    the timeout; under a budget it loads and decodes."""
    from deepseek_cpu.tools import synth
    path = synth.synthesize(tmp_path_factory.mktemp("limit") / "v2-lite-6.gguf", "v2-lite", "q4_0", layers=6,
                            tokenizer="offline", progress=False)
    hot, experts = memory_budget.tensor_bytes(path)
    limit = int(hot + experts * 0.3) + (320 << 20)  # the process itself: Python, libraries, buffers
    assert experts > limit
    with memory_cgroup(limit) as join:
        def run(budget, timeout):
            try:
                return subprocess.run([sys.executable, "-c", RUN_UNDER_LIMIT, str(path), budget], capture_output=True,
                                      text=True, timeout=timeout, preexec_fn=join)
            except subprocess.TimeoutExpired:
                return None
        default = run("none", 120)
        budgeted = run(str(limit - (320 << 20)), 600)
    assert default is None or default.returncode != 0, default.stdout
    assert budgeted is not None and budgeted.returncode == 0, budgeted and budgeted.stderr[-2000:]
    assert "decoded 24" in budgeted.stdout


def test_the_documented_policy_example_runs(gguf):
    """docs/plugins.md's prefetch-policy example, registered as a plugin, plans within the budget."""
    import re

    from deepseek_cpu import plugins
    text = Path(__file__).resolve().parents[1].joinpath("docs", "plugins.md").read_text()
    section = text[text.index("## deepseek_cpu_prefetch_policies()"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "plugins.md", "exec"), namespace)

    class Example:
        deepseek_cpu_prefetch_policies = staticmethod(namespace["deepseek_cpu_prefetch_policies"])
    pm = plugins.load()
    pm.register(Example(), name="docs-example")
    try:
        layout = prefetch.layout(gguf)
        budget = memory_budget.plan(gguf, 1 << 30, 0)
        placement, name = prefetch.plan_policy("first-layers", layout, budget)
    finally:
        pm.unregister(name="docs-example")
    assert name == "first-layers" and placement.warm
    assert sum(r.length for r in placement.warm) <= budget.expert_cache
    assert {r.what.split(".")[1] for r in placement.warm} <= {str(t.layer) for t in layout.expert_tensors}


def test_pregating_predicts_the_next_layers_experts_better_than_chance(converted):
    """Under a budget the engine predicts each MoE layer's experts from the previous layer's router
    input (dsc/expert-prefetch.c) and counts how often the router then chose them. On the model
    trained here on real text (8 experts, 2 per token), a guess hits 2/8 of the time; the
    prediction must do better, and the counters must see every routing of the predicted layers."""
    from deepseek_cpu import Llama
    from deepseek_cpu.runtime import experts
    from fixture_paths import FIXTURES
    llm = Llama(str(converted("trained_v2", "f32")), n_ctx=512, n_batch=1, mem_budget="1G", verbose=False)
    tokens = llm.tokenize((FIXTURES / "text" / "heldout.txt").read_text()[:4000].encode())[:256]
    level = experts.set_expert_prefetch(2)  # pre-gating is opt-in (memory_budget.EXPERT_PREFETCH_LEVEL)
    try:
        experts.expert_prefetch_stats(reset=True)
        llm.eval(tokens)  # one token per batch: decode, where pre-gating matters
        st = experts.expert_prefetch_stats()
    finally:
        experts.set_expert_prefetch(level)
        llm.close()
    print("pre-gating:", st, "hit rate", st["chosen_predicted"] / st["chosen"])
    # layer 2 predicted from layer 1 for every token but the first (its router is learnt in the first graph)
    assert st["predicted"] == st["chosen"] == 2 * (len(tokens) - 1)
    assert st["chosen_predicted"] / st["chosen"] > 0.25 + 0.1
