"""DeepSeek-V4 (DeepseekV4ForCausalLM -> deepseek4): the converter and the engine against transformers.

The fixture tests/fixtures/v4_flash (make_v4_fixture.py) is a tiny V4 stored as DeepSeek publishes
V4-Flash: DeepSeek's tensor names, FP8 projections with UE8M0 block scales, MXFP4 routed experts,
a hash-routed layer, sliding-window / CSA / HCA layers, an MTP block; reference.npz holds
transformers' float32 logits for 160 tokens (longer than the window, the HCA ratio 128 and the
indexer's reach), from the dequantized weights.
"""
import json
import shutil

import gguf
import numpy as np
import pytest

from conftest import fixture_dir
from test_convert import _drop_tensor, assert_nothing_written, edit_config
from test_parity import TOL, _with_value, engine_logits, rel_errors

NAME = "v4_flash"
N_CTX = 256


def reference():
    return np.load(fixture_dir(NAME) / "reference.npz")


@pytest.mark.parametrize("n_batch", [256, 37, 1], ids=["one_batch", "batches_of_37", "token_by_token"])
def test_f32_logits_match_transformers(converted, n_batch):
    """Every position within 1e-4 of transformers, in one batch, in batches that cut the compressors'
    windows (4 and 128 tokens) anywhere, and one token at a time (the compressors' carried state)."""
    ref = reference()
    got = engine_logits(converted(NAME, "f32"), ref["tokens"], n_batch=n_batch, n_ctx=N_CTX)
    err = rel_errors(got, ref["logits"])
    assert err.max() <= TOL, f"max relative error {err.max():.3g} at position {err.argmax()}"
    assert (got.argmax(1) == ref["logits"].argmax(1)).all()
    # the fixture reaches what it is meant to: margins clear of round-off
    assert ref["indexer_margin"].min() > 1e-3 and ref["routing_margin"].min() > 1e-3


@pytest.mark.parametrize("n_batch", [256, 1], ids=["one_batch", "token_by_token"])
def test_default_f16_cache_matches_transformers(converted, n_batch):
    """The cache users get (f16), through ggml-cpu's attention kernels for V4 (prompts: the tiled flash
    attention over the f16 cache with sinks; one token: the shared-head kernel with sinks). The bound is
    the cache's f16 rounding (measured 0.015, both paths and stock's products alike); a kernel that
    dropped the sinks is off by 0.86."""
    from deepseek_cpu import Llama
    ref = reference()
    llm = Llama(str(converted(NAME, "f32")), n_ctx=N_CTX, n_batch=n_batch, logits_all=True, n_threads=2,
                flash_attn=False, verbose=False)
    llm.eval([int(t) for t in ref["tokens"]])
    got = np.array(llm.scores[: len(ref["tokens"])], dtype=np.float32)
    llm.close()
    err = rel_errors(got, ref["logits"])
    assert err.max() <= 0.03, f"max relative error {err.max():.3g} at position {err.argmax()}"
    assert (got.argmax(1) == ref["logits"].argmax(1)).all()


def test_published_precision_is_stored_exactly(converted):
    """The default conversion keeps DeepSeek's values bit for bit: MXFP4 experts as GGML MXFP4, FP8 x
    power-of-two scales as bf16, F32 as F32, the hash table as I32; each tensor dequantized equals the
    f32 conversion (whose logits match transformers). The engine runs it; on random weights the
    activations' rounding (bf16, and q8 beside MXFP4) flips near-tie routing, so top-1 is what is asserted."""
    exact = gguf.GGUFReader(converted(NAME, "bf16"))
    full = {t.name: t for t in gguf.GGUFReader(converted(NAME, "f32")).tensors}
    types = {}
    for t in exact.tensors:
        types[t.name] = t.tensor_type.name
        ref = full[t.name]
        if t.tensor_type == gguf.GGMLQuantizationType.I32:
            assert np.array_equal(t.data, ref.data), t.name
            continue
        got = gguf.quants.dequantize(t.data, t.tensor_type).reshape(ref.data.shape)
        assert np.array_equal(got, ref.data), t.name
    assert types["blk.1.ffn_gate_exps.weight"] == "MXFP4" and types["blk.1.attn_q_a.weight"] == "BF16"
    assert types["blk.0.ffn_gate_tid2eid.weight"] == "I32" and types["blk.1.hc_attn_fn.weight"] == "F32"
    assert types["blk.1.attn_compressor_ape.weight"] == "F32" and types["blk.1.attn_sinks.weight"] == "F32"
    ref = reference()
    got = engine_logits(converted(NAME, "bf16"), ref["tokens"], n_ctx=N_CTX)
    assert np.isfinite(got).all()
    assert (got.argmax(1) == ref["logits"].argmax(1)).mean() >= 0.9


def test_tensor_table_is_the_fixture_checkpoint():
    """The table from config.json alone names exactly the checkpoint's tensors (logical shapes: an
    MXFP4 byte holds two values), the MTP block's too."""
    from deepseek_cpu.converters.deepseek_v4 import DeepseekV4Converter
    from deepseek_cpu.converters.quantized import open_checkpoint
    cfg = json.loads((fixture_dir(NAME) / "config.json").read_text())
    ck = open_checkpoint(fixture_dir(NAME), cfg)
    try:
        real = {n: ck.shape(n) for n in ck.names()}
    finally:
        ck.close()
    assert DeepseekV4Converter(cfg, fixture_dir(NAME)).checkpoint_tensors() == real


# (GGUF key the converter writes, another value the engine also runs)
ENGINE_READ_KEYS = [("deepseek4.attention.indexer.top_k", 4), ("deepseek4.attention.sliding_window", 8),
                    ("deepseek4.hyper_connection.sinkhorn_iterations", 3), ("deepseek4.expert_weights_norm", False)]


@pytest.mark.parametrize("key,other", ENGINE_READ_KEYS, ids=[k.split(".", 1)[1] for k, _ in ENGINE_READ_KEYS])
def test_engine_reads_the_value_the_converter_wrote(converted, tmp_path, key, other):
    ref = reference()
    changed = _with_value(converted(NAME, "f32"), tmp_path / "changed.gguf", key, other)
    err = rel_errors(engine_logits(changed, ref["tokens"], n_ctx=N_CTX), ref["logits"])
    assert err.max() > 100 * TOL, f"{key} = {other!r} changed nothing (max relative error {err.max():.3g})"


def _copy(tmp_path):
    return shutil.copytree(fixture_dir(NAME), tmp_path / NAME, ignore=shutil.ignore_patterns("reference.npz"))


BAD_CONFIG = [
    ({"compress_ratios": [0, 4, 128]}, ["compress_ratios", "one ratio per layer (4)"]),
    ({"compress_ratios": [0, 4, 64, 4, 4]}, ["compress_ratios holds 64"]),
    ({"scoring_func": "sigmoid"}, ["scoring_func 'sigmoid'"]),
    ({"index_head_dim": 32}, ["index_head_dim 32"]),
    ({"num_hash_layers": 9}, ["num_hash_layers"]),
    ({"hc_mult": None}, ["lacks hc_mult"]),
]


@pytest.mark.parametrize("change,needles", BAD_CONFIG, ids=[next(iter(c)) for c, _ in BAD_CONFIG])
def test_hyper_parameters_the_engine_cannot_run_are_clear_errors(tmp_path, change, needles):
    from deepseek_cpu.conversion.convert import convert
    from deepseek_cpu.converters.base import ConversionError
    model = _copy(tmp_path)
    edit_config(model, **change)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConversionError) as ei:
        convert(model, out / "m.gguf", outtype="f32", progress=False)
    for n in needles:
        assert n in str(ei.value), str(ei.value)
    assert "\n" not in str(ei.value)
    assert_nothing_written(out)


BAD_TENSORS = [
    ("layers.0.ffn.gate.tid2eid", ["layers.0.ffn.gate.tid2eid is missing"]),
    ("layers.1.attn.wq_a.scale", ["layers.1.attn.wq_a.weight has no block scale"]),
    ("layers.2.ffn.experts.3.w2.scale", ["layers.2.ffn.experts.3.w2.weight"]),
]


@pytest.mark.parametrize("drop,needles", BAD_TENSORS, ids=[d for d, _ in BAD_TENSORS])
def test_a_damaged_checkpoint_is_a_clear_error(tmp_path, drop, needles):
    from deepseek_cpu.conversion.convert import convert
    from deepseek_cpu.converters.checkpoint import CheckpointError
    model = _copy(tmp_path)
    _drop_tensor(model, drop)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CheckpointError) as ei:
        convert(model, out / "m.gguf", outtype="f32", progress=False)
    for n in needles:
        assert n in str(ei.value), str(ei.value)
    assert_nothing_written(out)


def test_synth_types_are_those_convert_writes_for_the_release(converted):
    """synth imitates a V4 release without a checkpoint (converter.release_storage): for the
    fixture's config its table and types equal the GGUF convert wrote from the fixture, whose
    storage make_v4_fixture.py chose independently."""
    from deepseek_cpu.tools.shapes import converter_plan
    cfg = json.loads((fixture_dir(NAME) / "config.json").read_text())
    conv, specs = converter_plan(cfg)
    real = {t.name: (t.tensor_type, tuple(int(x) for x in reversed(t.shape)))
            for t in gguf.GGUFReader(converted(NAME, "bf16")).tensors}
    assert [s.name for s in specs] == list(real)
    for s in specs:
        assert (conv.published_type(s), s.shape) == real[s.name], s.name


def test_synth_writes_a_v4_file_the_engine_runs(tmp_path, monkeypatch):
    """`synth --shape v4-flash` with the fixture's small dimensions (the real one is 3.4 GB a layer):
    MXFP4 random blocks, a valid hash table, and a file the engine loads and decodes."""
    from deepseek_cpu.tools import shapes, synth
    cfg = json.loads((fixture_dir(NAME) / "config.json").read_text())
    small = {**cfg, "_name_or_path": "deepseek-ai/DeepSeek-V4-Flash"}
    monkeypatch.setitem(shapes.REAL_CONFIGS, "v4-flash", small)
    path = synth.synthesize(tmp_path / "v4.gguf", shape="v4-flash", quant="bf16", tokenizer=str(fixture_dir(NAME)),
                            progress=False)
    r = gguf.GGUFReader(path)
    t = {x.name: x for x in r.tensors}
    ids = t["blk.0.ffn_gate_tid2eid.weight"].data
    assert ids.min() >= 0 and ids.max() < cfg["n_routed_experts"]
    assert all(len(set(row)) == len(row) for row in ids.tolist())
    assert t["blk.1.ffn_up_exps.weight"].tensor_type == gguf.GGMLQuantizationType.MXFP4
    w = gguf.quants.dequantize(t["blk.1.ffn_up_exps.weight"].data, gguf.GGMLQuantizationType.MXFP4)
    assert 0.01 < float(w.std()) < 0.05 and abs(float(w.mean())) < 1e-3
    with pytest.raises(synth.SynthError, match="--quant bf16"):
        synth.synthesize(tmp_path / "q.gguf", shape="v4-flash", quant="q4_0", progress=False)
    got = engine_logits(path, [0] + list(range(5, 60)), n_ctx=64)
    assert np.isfinite(got).all()


def test_synth_from_a_later_block_keeps_that_blocks_settings(tmp_path, monkeypatch):
    """`synth --from-layer K --layers N`: blocks K..K+N-1 with their own compression ratios and hash
    routing (V4-Flash's first blocks are sliding-window and hash-routed, unlike 40 of its 43), the MTP
    layer's ratio kept; the engine reads them and runs the file."""
    from deepseek_cpu.gguf_header import read
    from deepseek_cpu.tools import shapes, synth
    cfg = json.loads((fixture_dir(NAME) / "config.json").read_text())   # ratios [0, 4, 128, 4] + MTP [4]
    small = {**cfg, "_name_or_path": "deepseek-ai/DeepSeek-V4-Flash"}
    monkeypatch.setitem(shapes.REAL_CONFIGS, "v4-flash", small)
    path = synth.synthesize(tmp_path / "v4.gguf", shape="v4-flash", quant="bf16", tokenizer=str(fixture_dir(NAME)),
                            layers=2, first_layer=1, progress=False)
    h = read(path)
    assert list(h.array("deepseek4.attention.compress_ratios")) == [4, 128, 4]
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    assert "blk.0.ffn_gate_tid2eid.weight" not in names          # block 1 routes by its router
    assert "blk.0.indexer.proj.weight" in names and "blk.1.indexer.proj.weight" not in names   # CSA, then HCA
    got = engine_logits(path, [0] + list(range(5, 60)), n_ctx=64)
    assert np.isfinite(got).all()
    with pytest.raises(synth.SynthError, match="--from-layer"):
        shapes.real_config("v4-flash", 2, 4)


def test_ds_v4_keeps_the_released_experts_bit_for_bit(converted, tmp_path):
    """The V4 mix: llama.cpp's quantizer copies the MXFP4 experts and the hash table unchanged (the
    bytes of the converted release), keeps mHC and position biases f32, rounds the rest to q8_0;
    an MXFP4 or I32 tensor is not refused as 'already quantized'. The engine runs the result."""
    from deepseek_cpu.quantization.quantize import quantize
    src = converted(NAME, "bf16")
    out = quantize(src, tmp_path / "ds-v4.gguf", "ds-v4", progress=False).path
    before = {t.name: t for t in gguf.GGUFReader(src).tensors}
    after = {t.name: t for t in gguf.GGUFReader(out).tensors}
    assert set(before) == set(after)
    Q = gguf.GGMLQuantizationType
    for name, t in after.items():
        b = before[name]
        if b.tensor_type in (Q.MXFP4, Q.I32) or "hc_" in name and name.endswith("_fn.weight") or "_ape." in name:
            assert t.tensor_type == b.tensor_type and np.array_equal(t.data, b.data), name
    assert after["blk.1.attn_q_b.weight"].tensor_type == Q.Q8_0
    ref = reference()
    got = engine_logits(out, ref["tokens"], n_ctx=N_CTX)
    assert np.isfinite(got).all()


def test_hash_layers_experts_are_read_ahead_from_the_token_ids(tmp_path):
    """V4's hash-routed layers choose experts from the token ids alone (tid2eid), so under a memory
    budget the engine reads every later hash layer's experts at the first hash layer's lookup
    (dsc/expert-prefetch.c), at the default read-ahead level. The fixture with a second hash layer (its own table, its router bias
    gone, as DeepSeek ships hash layers): from the second token on, each one-token graph reads ahead
    layer 1's two experts for that token, and layer 1's lookup then chooses exactly those."""
    from test_pre_tokenizers_in_engine import _write_safetensors

    from deepseek_cpu import Llama
    from deepseek_cpu.conversion.convert import convert
    from deepseek_cpu.runtime import experts
    model = tmp_path / "v4-two-hash-layers"
    shutil.copytree(fixture_dir(NAME), model)
    cfg = json.loads((model / "config.json").read_text())
    edit_config(model, num_hash_layers=2)
    _drop_tensor(model, "layers.1.ffn.gate.bias")
    rng = np.random.default_rng(0)
    k, n_expert = cfg["num_experts_per_tok"], cfg["n_routed_experts"]
    table = np.stack([rng.permutation(n_expert)[:k] for _ in range(cfg["vocab_size"])]).astype(np.int32)
    _write_safetensors(model / "model-hash.safetensors",
                       {"layers.1.ffn.gate.tid2eid": ("I32", table.shape, table.tobytes())})
    index = json.loads((model / "model.safetensors.index.json").read_text())
    index["weight_map"]["layers.1.ffn.gate.tid2eid"] = "model-hash.safetensors"
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    path = convert(model, tmp_path / "v4-two-hash.gguf", outtype="f32", progress=False)
    tokens = [int(t) for t in reference()["tokens"][:48]]
    llm = Llama(str(path), n_ctx=N_CTX, n_batch=1, mem_budget="8M", verbose=False)
    level = experts.set_expert_prefetch(1)  # the default under a budget: exact, so no pre-gating needed
    try:
        experts.expert_hash_prefetch_stats(reset=True)
        llm.eval(tokens)
        st = experts.expert_hash_prefetch_stats()
    finally:
        experts.set_expert_prefetch(level)
        llm.close()
    # the first graph learns layer 1's table at its lookup, after layer 0's: nothing read ahead then
    assert st == {"read_ahead": k * (len(tokens) - 1), "chosen": k * (len(tokens) - 1)}
    # and the chosen experts are the table's: the tokens' rows, k distinct experts each
    assert all(len(set(table[t])) == k for t in tokens)
