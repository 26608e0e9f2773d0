"""Logits of our engine vs transformers' DeepseekV2/V3ForCausalLM (the oracle).

Fixtures (tests/fixtures/*, made by make_fixtures.py with transformers) are tiny random
checkpoints in the layout DeepSeek publishes: bf16 shards, per-expert tensors, original
config.json. reference.npz holds transformers' float32 logits for a token sequence.
We convert to an f32 GGUF, run with an f32 KV cache, and compare every position.
"""
import numpy as np
import pytest

from conftest import CHECKPOINTS, fixture_dir

TOL = 1e-4


def engine_logits(gguf_path, tokens, n_batch=128, n_ctx=128, flash_attn=False, **kw):
    from deepseek_cpu import Llama
    llm = Llama(str(gguf_path), n_ctx=n_ctx, n_batch=n_batch, logits_all=True, n_threads=2,
                type_k=0, type_v=0, flash_attn=flash_attn, verbose=False, **kw)  # 0 = GGML_TYPE_F32
    llm.eval([int(t) for t in tokens])
    out = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    llm.close()
    return out


def rel_errors(got, ref):
    return np.abs(got - ref).max(axis=1) / np.abs(ref).max(axis=1)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_logits_match_transformers(converted, name):
    ref = np.load(fixture_dir(name) / "reference.npz")
    got = engine_logits(converted(name, "f32"), ref["tokens"])
    err = rel_errors(got, ref["logits"])
    assert err.max() <= TOL, f"{name}: max relative error {err.max():.3g} at position {err.argmax()} (per position: {np.round(err, 6)})"
    # same argmax everywhere: the error bound means the same greedy output
    assert (got.argmax(1) == ref["logits"].argmax(1)).all()


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_token_by_token_decode_matches_transformers(converted, name):
    """One token per llama_decode, as in generation: MLA's single-token attention path
    (our graph runs it as one matrix product over all heads) against the oracle."""
    ref = np.load(fixture_dir(name) / "reference.npz")
    got = engine_logits(converted(name, "f32"), ref["tokens"], n_batch=1)
    err = rel_errors(got, ref["logits"])
    assert err.max() <= TOL, f"{name}: max relative error {err.max():.3g} at position {err.argmax()}"
    assert (got.argmax(1) == ref["logits"].argmax(1)).all()


@pytest.mark.parametrize("n_batch", [128, 1], ids=["prefill", "token_by_token"])
@pytest.mark.parametrize("form", ["absorbed", "decompressed"])
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_both_mla_attention_forms_match_transformers(converted, monkeypatch, name, form, n_batch):
    """The MLA graph (src/dsc/mla-attention-graph.cpp) attends through K/V decompressed from the latent cache when that is cheaper
    (prefill) and in the absorbed form otherwise (decode); the engine picks by cost, so the
    tiny fixtures would exercise only one. DEEPSEEK_CPU_MLA_MHA forces each form here."""
    monkeypatch.setenv("DEEPSEEK_CPU_MLA_MHA", "1" if form == "decompressed" else "0")
    ref = np.load(fixture_dir(name) / "reference.npz")
    got = engine_logits(converted(name, "f32"), ref["tokens"], n_batch=n_batch)
    err = rel_errors(got, ref["logits"])
    assert err.max() <= TOL, f"{name} ({form}): max relative error {err.max():.3g} at position {err.argmax()}"
    assert (got.argmax(1) == ref["logits"].argmax(1)).all()


LONG = [n for n in CHECKPOINTS if (fixture_dir(n) / "reference_long.npz").exists()]
ATTENTION = {  # environment that forces each of the engine's attention paths for a batch
    "absorbed": {"DEEPSEEK_CPU_MLA_MHA": "0"},
    "decompressed_flash_tiles": {"DEEPSEEK_CPU_MLA_MHA": "1", "DEEPSEEK_CPU_MLA_FA": "1"},
    "decompressed_kq_softmax": {"DEEPSEEK_CPU_MLA_MHA": "1", "DEEPSEEK_CPU_MLA_FA": "0"},
}


@pytest.mark.parametrize("n_batch", [512, 100], ids=["one_batch", "batches_of_100"])
@pytest.mark.parametrize("attn", sorted(ATTENTION))
@pytest.mark.parametrize("name", LONG)
def test_long_prefill_matches_transformers(converted, monkeypatch, name, attn, n_batch):
    """The MLA graph prefills through flash attention in 64-query x 64-key tiles, skipping the tiles
    the causal mask hides; 160 tokens span full, partial and skipped tiles. In batches of 100 the
    second batch (60 queries) attends to cached keys. On x86, our tiled kernel (dsc/flash-attn-f32.cpp) runs both batches
    (from 16 queries); elsewhere ggml's tiled kernel runs >= 64 queries and its untiled one the
    rest. reference_long.npz: tests/fixtures/make_long_reference.py."""
    for k, v in ATTENTION[attn].items():
        monkeypatch.setenv(k, v)
    ref = np.load(fixture_dir(name) / "reference_long.npz")
    assert len(ref["tokens"]) > 2 * 64
    got = engine_logits(converted(name, "f32"), ref["tokens"], n_batch=n_batch, n_ctx=256)
    err = rel_errors(got, ref["logits"])
    assert err.max() <= TOL, f"{name} ({attn}): max relative error {err.max():.3g} at position {err.argmax()}"
    assert (got.argmax(1) == ref["logits"].argmax(1)).all()


@pytest.mark.parametrize("n_batch", [100, 1], ids=["batches_of_100", "token_by_token"])
@pytest.mark.parametrize("form", ["absorbed", "decompressed"])
@pytest.mark.parametrize("name", LONG)
def test_flash_attn_on_matches_transformers(converted, monkeypatch, name, form, n_batch):
    """flash_attn=True (f32 cache): a prefill batch still takes the decompressed
    form, which attends through the tiled f32 flash attention; single tokens take the absorbed
    form through flash attention over the latent cache. Both forms are forced here, in batches of
    100 (the second batch attends to cached keys) and token by token. A single token in the
    absorbed form runs our one-query kernel (dsc/mla-attention.cpp) on the f32 cache as it is (5.8e-7 here; ggml's
    own kernel on a cache cast to f16 was 4.7e-4 off, as on stock 0.3.36). Batches in the absorbed
    form still run ggml's own kernel, which we do not change, hence their looser bound."""
    monkeypatch.setenv("DEEPSEEK_CPU_MLA_MHA", "1" if form == "decompressed" else "0")
    ref = np.load(fixture_dir(name) / "reference_long.npz")
    got = engine_logits(converted(name, "f32"), ref["tokens"], n_batch=n_batch, n_ctx=256, flash_attn=True)
    err = rel_errors(got, ref["logits"])
    tol = TOL if form == "decompressed" or n_batch == 1 else 1e-3
    assert err.max() <= tol, f"{name} ({form}, flash_attn): max relative error {err.max():.3g} at position {err.argmax()}"
    assert (got.argmax(1) == ref["logits"].argmax(1)).all()


def test_fixtures_cover_the_cases_the_patches_fix():
    import json
    cfgs = {n: json.loads((fixture_dir(n) / "config.json").read_text()) for n in CHECKPOINTS}
    assert any(c.get("topk_method") == "group_limited_greedy" and c["n_group"] > c["topk_group"] > 0 for c in cfgs.values())
    assert any(c.get("q_lora_rank") is None and c["num_hidden_layers"] not in (26, 27) for c in cfgs.values())
    assert any((c.get("rope_scaling") or {}).get("type") == "yarn" for c in cfgs.values())
    assert any(c.get("topk_method") == "noaux_tc" for c in cfgs.values())


# outtype -> (the engine's name for the file type, bound on the median per-position error).
# The fixtures' weights are bf16, so the error comes from the engine's activations in
# these types (and q8_0's weight rounding). Measured medians on the four fixtures: f16
# 3.1-4.1e-4, bf16 2.6-3.0e-3, q8_0 1.4-1.8e-2; the single worst position can be 10x
# that where a rounded router score picks another expert, hence the median. A tensor the
# engine read in the wrong layout or type gives errors of order 1.
STORED_TYPES = {"f16": ("F16", 1.5e-3), "bf16": ("BF16", 1e-2), "q8_0": ("Q8_0", 5e-2)}


@pytest.mark.parametrize("outtype", sorted(STORED_TYPES))
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_every_outtype_is_loaded_and_used_by_the_engine(converted, name, outtype):
    """Each type the converter writes: the engine names the file type it read from
    general.file_type, and its logits follow transformers' within the type's precision."""
    import ctypes
    import llama_cpp
    from deepseek_cpu import Llama
    ftype, bound = STORED_TYPES[outtype]
    path = converted(name, outtype)
    llm = Llama(str(path), n_ctx=32, verbose=False)
    desc = ctypes.create_string_buffer(128)
    llama_cpp.llama_model_desc(llm.model, desc, len(desc))
    llm.close()
    assert desc.value.decode().split()[-1] == ftype, desc.value
    ref = np.load(fixture_dir(name) / "reference.npz")
    got = engine_logits(path, ref["tokens"])
    err = rel_errors(got, ref["logits"])
    assert np.median(err) <= bound, f"{name} {outtype}: median relative error {np.median(err):.3g} (per position {np.round(err, 4)})"
    assert (got.argmax(1) == ref["logits"].argmax(1)).mean() >= 0.9


def _with_value(src, dst, key, value):
    """A copy of GGUF `src` with metadata `key`'s scalar value replaced in place (same size:
    an integer, a bool, or a string of the same length)."""
    import struct
    import gguf
    from gguf_summary import value_span
    start, end = value_span(gguf.GGUFReader(src).fields[key])
    if isinstance(value, bool):
        new = bytes([value])
    elif isinstance(value, int):
        new = struct.pack("<I", value)
    else:
        new = value.encode()
    assert len(new) == end - start, (key, value)
    data = bytearray(src.read_bytes())
    data[start:end] = new
    dst.write_bytes(bytes(data))
    assert gguf.GGUFReader(dst).fields[key].contents() == value
    return dst


# (fixture, key the converter writes, another value the engine would also accept)
ENGINE_READ_KEYS = [
    ("v2_group", "deepseek2.expert_group_score_topk", 2),  # V2 ranks groups by their best expert
    ("v3_noaux", "deepseek2.expert_group_score_topk", 1),  # V3 by the sum of the top two
    ("v3_noaux", "deepseek2.expert_gating_func", 1),       # sigmoid, not softmax
    ("v3_noaux", "deepseek2.expert_weights_norm", False),
    ("v2_group", "deepseek2.rope.scaling.type", "none"),   # yarn
]


@pytest.mark.parametrize("name,key,other", ENGINE_READ_KEYS, ids=[f"{k[0]}-{k[1].split('.', 1)[1]}" for k in ENGINE_READ_KEYS])
def test_engine_reads_the_value_the_converter_wrote(converted, tmp_path, name, key, other):
    """The value we write is read and used: with it the engine matches transformers
    (test_logits_match_transformers), with another valid value it does not. A key the
    engine ignored, or read under another name, would give the same logits both ways."""
    ref = np.load(fixture_dir(name) / "reference.npz")
    changed = _with_value(converted(name, "f32"), tmp_path / "changed.gguf", key, other)
    err = rel_errors(engine_logits(changed, ref["tokens"]), ref["logits"])
    assert err.max() > 100 * TOL, f"{key} = {other!r} changed nothing (max relative error {err.max():.3g})"


def test_v32_keeping_every_key_is_v3s_attention(converted):
    """DeepSeek-V3.2 with the indexer's top-k at least the sequence is MLA over every earlier key:
    transformers' logits for that (reference_fulltopk.npz, equal to DeepseekV3ForCausalLM's on the
    same weights), with the top-k raised through the GGUF key the engine reads. With the fixture's
    own top-16 of 40 the sparse selection changes every later position (test_logits_match_transformers)."""
    ref = np.load(fixture_dir("v32_dsa") / "reference_fulltopk.npz")
    got = engine_logits(converted("v32_dsa", "f32"), ref["tokens"],
                        kv_overrides={"deepseek32.attention.indexer.top_k": int(ref["index_topk"])})
    err = rel_errors(got, ref["logits"])
    assert err.max() <= TOL, f"max relative error {err.max():.3g} at position {err.argmax()}"
    sparse = np.load(fixture_dir("v32_dsa") / "reference.npz")["logits"]
    assert np.abs(sparse - ref["logits"]).max() > 0.1  # the two references differ: the override took
