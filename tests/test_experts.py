"""The engine's expert-usage counters against transformers' router (routing_reference.npz: counts,
routing_choices.npz: each token's chosen experts; both made by tests/fixtures/make_routing_reference.py),
and `deepseek-cpu experts`.

The engine exposes counts only (dsc/expert-usage.c adds up the ids of every MUL_MAT_ID), so a
histogram alone would pass choices swapped between tokens. Each token's own choices are read from
the same counters by difference: after each token when decoding one at a time, and between
prefill batches of the first n and n-1 tokens (a causal model routes the first n-1 the same)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import FIXTURES, fixture_dir

REFERENCE = np.load(FIXTURES / "routing_reference.npz")
CASES = sorted(REFERENCE.files)
CHOICES = np.load(FIXTURES / "routing_choices.npz")  # [n_layer, n_tokens, k], ascending; dense layers -1
assert sorted(CHOICES.files) == CASES


def _llm(path, n_ctx=256):
    # logits_all: llama.cpp runs the last layer's FFN only for the tokens whose logits are asked
    # for, so without it the last layer routes only the batch's last token
    from deepseek_cpu import Llama
    return Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=2, logits_all=True,
                 verbose=False)


@pytest.mark.parametrize("case", CASES)
def test_counts_equal_the_routers_choices_in_transformers(converted, case):
    name, ref = case.split(".")
    want = REFERENCE[case]
    tokens = [int(t) for t in np.load(fixture_dir(name) / f"{ref}.npz")["tokens"]]
    llm = _llm(converted(name, "f32"))
    try:
        llm.reset_expert_usage()
        llm.eval(tokens)  # one batch: the prefill path
        usage = llm.expert_usage()
    finally:
        llm.close()
    moe = [i for i in range(want.shape[0]) if want[i].sum()]
    assert usage.layers == moe
    assert usage.counts.shape == (len(moe), want.shape[1])
    # f32 weights: the same hidden states up to float rounding, so the same top-k; a near-tie
    # may flip one choice in a long sequence, never more
    diff = np.abs(usage.counts.astype(np.int64) - want[moe]).sum()
    assert diff <= 2 * (len(tokens) // 100), (case, usage.counts, want[moe])
    assert usage.routings == len(tokens) * usage.experts_per_token * len(moe)


def _tokens_choices(counts_after, n_moe: int, k: int) -> np.ndarray:
    """[n_moe, steps, k]: the experts each step moved the counters of, from the engine's counts
    after each step (cumulative). Each step must add exactly one routing to k distinct experts
    of every MoE layer: one token's choices, nothing else."""
    prev, out = np.zeros((n_moe, 1), dtype=np.int64), []
    for counts in counts_after:
        counts = counts.astype(np.int64)
        moved, prev = counts - prev, counts
        assert set(np.unique(moved)) <= {0, 1} and (moved.sum(axis=1) == k).all(), (len(out), moved)
        out.append([np.flatnonzero(row) for row in moved])
    return np.array(out, dtype=np.int64).reshape(-1, n_moe, k).transpose(1, 0, 2)


def _mismatches(got: np.ndarray, want: np.ndarray) -> list[tuple[int, int]]:
    """(MoE layer row, token) where the chosen sets differ."""
    return [tuple(map(int, x)) for x in np.argwhere((got != want).any(axis=2))]


@pytest.mark.parametrize("path", ["decode", "prefill"])
@pytest.mark.parametrize("case", [c for c in CASES if c.endswith(".reference")])  # 24-56 tokens (prefill by
# prefixes costs n^2/2 token evaluations; the 160-token reference_long cases keep the histogram test)
def test_each_token_chooses_the_routers_experts_in_transformers(converted, case, path):
    """Which experts each token chose at each MoE layer, not only how often each expert was
    chosen: a router (or a counter) that swapped choices between tokens keeps every histogram."""
    name, ref = case.split(".")
    want_all = CHOICES[case]
    tokens = [int(t) for t in np.load(fixture_dir(name) / f"{ref}.npz")["tokens"]]
    moe = [i for i in range(want_all.shape[0]) if (want_all[i] >= 0).all()]
    want, k = want_all[moe], want_all.shape[2]
    llm = _llm(converted(name, "f32"))

    def decode():  # one token per llama_decode: the counters after each
        llm.reset_expert_usage()
        for t in tokens:
            llm.eval([t])
            yield llm.expert_usage().counts

    def prefill():  # the first n tokens as one batch, from an empty cache, for n = 1, 2, ...
        for n in range(1, len(tokens) + 1):
            llm.reset()
            llm.reset_expert_usage()
            llm.eval(tokens[:n])
            yield llm.expert_usage().counts
    try:
        got = _tokens_choices(decode() if path == "decode" else prefill(), len(moe), k)
    finally:
        llm.close()
    assert got.shape == want.shape
    # f32 weights: the same top-k for every token (measured: no difference on any fixture, either path)
    assert not _mismatches(got, want), (case, path, _mismatches(got, want)[:10])


def test_decoding_token_by_token_counts_the_same(converted):
    tokens = [int(t) for t in np.load(fixture_dir("v2_group") / "reference.npz")["tokens"]]
    llm = _llm(converted("v2_group", "f32"))
    try:
        llm.reset_expert_usage()
        for t in tokens:
            llm.eval([t])  # one token at a time: the decode path
        one_by_one = llm.expert_usage().counts.copy()
        llm.reset_expert_usage()
        assert llm.expert_usage().routings == 0
        llm.reset()
        llm.eval(tokens)
        batch = llm.expert_usage().counts
    finally:
        llm.close()
    assert (one_by_one == batch).all()
    assert (batch == REFERENCE["v2_group.reference"][1:]).all()


def test_coverage_and_shares():
    from deepseek_cpu.runtime.experts import ExpertUsage
    u = ExpertUsage(np.array([[8, 1, 1, 0], [1, 1, 1, 1]], dtype=np.uint64), [1, 2], 2)
    assert np.allclose(u.coverage(0.25), [0.8, 0.25]) and np.allclose(u.coverage(1.0), [1, 1])
    assert list(u.unused()) == [1, 0] and u.routings == 14


def test_experts_command_writes_a_heatmap_and_counts(converted, tmp_path):
    from deepseek_cpu.cli import cli
    text = tmp_path / "t.txt"
    text.write_text("def f(x):\n    return x * 2\n" * 40)
    png, js = tmp_path / "e.png", tmp_path / "e.json"
    r = CliRunner().invoke(cli, ["experts", str(converted("v2_group", "f32")), "--text", str(text), "--ctx", "64",
                                 "--png", str(png), "--json", str(js), "--quiet"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "MoE layers x 16 experts (4 per token)" in r.output and "top 10%" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    d = json.loads(js.read_text())
    assert d["layers"] == [1, 2, 3] and len(d["counts"][0]) == 16
