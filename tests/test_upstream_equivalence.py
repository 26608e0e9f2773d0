"""Our converter vs upstream's convert_hf_to_gguf.py (the pinned llama.cpp), tensor by tensor.

Upstream needs torch, which CI does not have, so its output is summarised once by
tests/fixtures/make_upstream_reference.py (run in the test-only venv) into
tests/fixtures/upstream/<fixture>.json: per tensor (shape, type, sha256 of the float32
bytes) and every non-tokenizer metadata key. Here we convert the same fixture with our
converter at f32 and require identical tensors (names, shapes, types, bytes) and identical
metadata except the differences listed, with their reasons, in INTENDED below.
"""
import json

import pytest

from conftest import FIXTURES, fixture_dir

import gguf_summary

UPSTREAM = FIXTURES / "upstream"
NAMES = sorted(p.stem for p in UPSTREAM.glob("*.json"))

# metadata key -> (why we differ from upstream there, when: the (upstream, ours) values for
# which the difference is allowed; None = absent). Every other key, and these keys outside
# their condition, must match in type and value.
INTENDED = {
    # our engine's routing rule (fixes/deepseek2-v2-group-limited-greedy-routing.patch): how groups of experts are ranked; upstream's
    # engine has no such key (and no group-limited greedy routing for V2)
    "deepseek2.expert_group_score_topk": ("engine patch key, not known upstream", lambda r, o: r is None),
    # upstream writes n_group/topk_group even when n_group == 1 (no grouping); we omit
    # them then. The engine treats absent and 1 alike (no group limit).
    "deepseek2.expert_group_count": ("omitted when n_group == 1", lambda r, o: r == ["UINT32", 1] and o is None),
    "deepseek2.expert_group_used_count": ("omitted when n_group == 1",
                                          lambda r, o: r == ["UINT32", 1] and o is None),
    # upstream writes it only when true; we always write it (false = the engine default)
    "deepseek2.expert_weights_norm": ("written explicitly when false", lambda r, o: r is None and o == ["BOOL", False]),
    # naming/labels from upstream's metadata heuristics (directory name title-cased,
    # parameter-count label); informational only, never read by the engine
    "general.name": ("from _name_or_path / directory name, not title-cased", lambda r, o: o is not None),
    "general.size_label": ("upstream's parameter-count label, not written", lambda r, o: o is None),
    "general.type": ("upstream's 'model' label, not written", lambda r, o: o is None),
}


@pytest.fixture(scope="module", params=NAMES)
def pair(request, converted):
    name = request.param
    ref = json.loads((UPSTREAM / f"{name}.json").read_text())
    ours = gguf_summary.summarize(converted(name, "f32"))
    return name, ref, ours


def test_reference_exists_for_each_architecture():
    archs = {json.loads((fixture_dir(n) / "config.json").read_text())["architectures"][0] for n in NAMES}
    assert archs == {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"}, archs


def test_same_tensors(pair):
    name, ref, ours = pair
    r, o = ref["tensors"], ours["tensors"]
    assert sorted(o) == sorted(r), (f"{name}: only upstream: {sorted(set(r) - set(o))}; "
                                    f"only ours: {sorted(set(o) - set(r))}")
    bad = {k: (r[k], o[k]) for k in r if r[k] != o[k]}
    assert not bad, f"{name}: {len(bad)} tensors differ (upstream, ours): {bad}"


def test_same_metadata_except_intended(pair):
    name, ref, ours = pair
    r, o = ref["metadata"], ours["metadata"]
    bad = {k: (r.get(k), o.get(k)) for k in sorted(set(r) | set(o))
           if r.get(k) != o.get(k) and not (k in INTENDED and INTENDED[k][1](r.get(k), o.get(k)))}
    assert not bad, f"{name}: metadata differs from upstream (upstream, ours): {bad}"
    assert o["general.architecture"] == ["STRING", "deepseek2"]


def test_intended_differences_are_real(pair):
    """Keep the allow-list honest: every entry must still differ on some fixture, or be
    an engine-only key; a stale entry would hide a future regression."""
    name, ref, ours = pair
    r, o = ref["metadata"], ours["metadata"]
    assert "deepseek2.expert_group_score_topk" not in r
    for k in ("general.size_label", "general.type"):
        assert k in r and k not in o, k
