"""`deepseek-cpu synth`: random-weight GGUFs with the real models' shapes, types and metadata."""
import json

import gguf
import numpy as np
import pytest

from conftest import CHECKPOINTS, FIXTURES

from deepseek_cpu import synth

Q = gguf.GGMLQuantizationType


def _tensors(path):
    r = gguf.GGUFReader(str(path))
    # GGUF stores dims innermost first; the plans use numpy order
    return r, {t.name: (tuple(int(x) for x in reversed(t.shape)), t.tensor_type) for t in r.tensors}


def _field(r, key):
    f = r.fields.get(key)
    if f is None:
        return None
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v.tolist()[0]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_header_only_plan_equals_real_conversion(converted, name):
    """The stand-in checkpoint synth builds from a config.json must be exactly what the
    converter sees in a real checkpoint: same tensors, shapes and types after conversion."""
    cfg = json.loads((FIXTURES / name / "config.json").read_text())
    _conv, plans = synth.converter_plan(cfg, Q.F32)
    _r, real = _tensors(converted(name, "f32"))
    assert [p.name for p in plans] == list(real)
    for p in plans:
        assert (p.shape, p.qtype) == real[p.name], p.name


def test_v2_lite_shapes_are_the_real_ones():
    cfg, _conv, ts = synth.synth_plan("v2-lite", "q4_0")
    t = {x.name: x for x in ts}
    assert cfg["num_hidden_layers"] == 27 and len(ts) == 404
    assert t["token_embd.weight"].shape == (102400, 2048)
    assert t["blk.0.ffn_gate.weight"].shape == (10944, 2048)          # first layer dense
    assert t["blk.1.ffn_gate_exps.weight"].shape == (64, 1408, 2048)
    assert t["blk.1.ffn_down_exps.weight"].shape == (64, 2048, 1408)
    assert t["blk.1.ffn_up_shexp.weight"].shape == (2816, 2048)
    assert t["blk.5.attn_q.weight"].shape == (3072, 2048)               # no q-LoRA
    assert t["blk.5.attn_kv_a_mqa.weight"].shape == (576, 2048)
    assert t["blk.5.attn_k_b.weight"].shape == (16, 512, 128)
    assert t["blk.5.attn_v_b.weight"].shape == (16, 128, 512)
    # 15.7 B parameters; Q4_0 with llama-quantize's Q6_K output: ~8.9 GB
    n = sum(x.n_elem for x in ts)
    assert 15.6e9 < n < 15.8e9
    assert 8.7e9 < sum(x.nbytes for x in ts) < 9.0e9
    assert t["output.weight"].qtype == Q.Q6_K and t["blk.1.ffn_gate_inp.weight"].qtype == Q.F32


def test_v2_and_v3_shapes():
    _cfg, _conv, ts = synth.synth_plan("v2", "q4_0", layers=2)
    t = {x.name: x.shape for x in ts}
    assert t["blk.0.attn_q_a.weight"] == (1536, 5120) and t["blk.0.attn_q_b.weight"] == (128 * 192, 1536)
    assert t["blk.1.ffn_gate_exps.weight"] == (160, 1536, 5120)
    _cfg, _conv, ts = synth.synth_plan("v3", "q4_0", layers=4)
    t = {x.name: x.shape for x in ts}
    assert "blk.2.ffn_gate.weight" in t and t["blk.2.ffn_gate.weight"] == (18432, 7168)  # 3 dense layers
    assert t["blk.3.ffn_gate_exps.weight"] == (256, 2048, 7168)
    assert t["blk.3.exp_probs_b.bias"] == (256,)
    assert t["token_embd.weight"] == (129280, 7168)


def test_q4_k_m_follows_llama_quantize():
    _cfg, _conv, ts = synth.synth_plan("v2-lite", "q4_k_m")
    t = {x.name: x.qtype for x in ts}
    assert t["token_embd.weight"] == Q.Q4_K and t["output.weight"] == Q.Q6_K
    assert t["blk.4.attn_q.weight"] == Q.Q4_K and t["blk.4.attn_output.weight"] == Q.Q4_K
    assert t["blk.4.attn_k_b.weight"] == Q.Q5_0      # rows of 128: Q4_K falls back to Q5_0
    # ffn_down: Q6_K in use_more_bits layers (0-2, 5, 8, ..., 24-26 of 27), else Q4_K;
    # the experts' rows of 1408 are not whole 256-blocks: Q6_K -> Q8_0, Q4_K -> Q5_0
    assert t["blk.1.ffn_down_exps.weight"] == Q.Q8_0 and t["blk.3.ffn_down_exps.weight"] == Q.Q5_0
    assert t["blk.5.ffn_down_exps.weight"] == Q.Q8_0
    assert t["blk.1.ffn_down_shexp.weight"] == Q.Q6_K and t["blk.3.ffn_down_shexp.weight"] == Q.Q4_K
    assert t["blk.0.ffn_down.weight"] == Q.Q8_0      # 10944 columns
    assert t["blk.3.ffn_gate_exps.weight"] == Q.Q4_K
    assert t["blk.3.attn_norm.weight"] == Q.F32 and t["blk.3.ffn_gate_inp.weight"] == Q.F32


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K,
                                   Q.Q6_K, Q.F16, Q.BF16, Q.F32])
def test_random_blocks_decode_to_small_finite_weights(qtype):
    n = 256 * 64
    raw = np.concatenate([np.ascontiguousarray(c).view(np.uint8) for c in synth.RandomBlocks(1).chunks(qtype, n)])
    assert raw.nbytes == n // gguf.GGML_QUANT_SIZES[qtype][0] * gguf.GGML_QUANT_SIZES[qtype][1]
    if qtype == Q.F32:
        w = raw.view(np.float32)
    elif qtype == Q.F16:
        w = raw.view(np.float16).astype(np.float32)
    else:
        w = gguf.quants.dequantize(raw.reshape(1, -1), qtype).reshape(-1)
    assert np.isfinite(w).all()
    assert 0.01 < w.std() < 0.04, w.std()
    assert abs(w.mean()) < 0.01


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth")
    out = {}

    def get(quant):
        if quant not in out:
            out[quant] = synth.synthesize(d / f"v2-lite-2-{quant}.gguf", "v2-lite", quant, layers=2,
                                          tokenizer="offline", progress=False)
        return out[quant]
    return get


@pytest.mark.parametrize("quant", ["q4_0", "q4_k_m"])
def test_small_file_loads_and_gives_finite_logits(small_files, quant):
    path = small_files(quant)
    r, tensors = _tensors(path)
    _cfg, _conv, ts = synth.synth_plan("v2-lite", quant, layers=2)
    assert {t.name: (t.shape, t.qtype) for t in ts} == tensors
    assert _field(r, "deepseek2.block_count") == 2
    assert _field(r, "deepseek2.expert_count") == 64
    assert _field(r, "deepseek2.attention.kv_lora_rank") == 512
    assert _field(r, "deepseek2.attention.q_lora_rank") == 0    # truncated, so that stock loads it too
    assert _field(r, "general.file_type") == int(synth.MIXES[quant].file_type)
    assert _field(r, "tokenizer.ggml.pre") == "deepseek-llm"
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 102400

    import llama_cpp
    from deepseek_cpu import Llama
    llm = Llama(str(path), n_ctx=64, n_batch=64, n_threads=2, verbose=False)
    toks = llm.tokenize(b"Random weights, real shapes.")
    llm.eval(toks)
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),)).copy()
    llm.close()
    assert np.isfinite(logits).all()
    assert 0.05 < logits.std() < 20


def test_prefaulting_tensor_destinations_changes_neither_logits_nor_peak_rss(small_files):
    """Patch 0042 faults in each large tensor's destination (here the 104 MB expert tensors) from
    several threads before the loader copies it, one tensor at a time: the same logits, and no
    more resident memory at the peak than faulting page by page during the copy (faulting the
    whole buffer in at once would add the repacked weights on top of the mapped file)."""
    code = ("import json, numpy as np, llama_cpp\n"
            "from deepseek_cpu import Llama\n"
            f"llm = Llama({str(small_files('q4_0'))!r}, n_ctx=64, n_batch=64, n_threads=2, verbose=False)\n"
            "llm.eval([100, 200, 300, 400])\n"
            "lg = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))\n"
            "hwm = int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]) * 1024\n"
            "print(json.dumps({'logits': lg.tolist(), 'hwm': hwm}))\n")
    import json
    from conftest import run_python
    res = {}
    for v in ("1", "0"):
        r = run_python(code, env_extra={"DEEPSEEK_CPU_PREFAULT": v})
        assert r.returncode == 0, r.stderr[-2000:]
        res[v] = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["1"]["logits"] == res["0"]["logits"]
    size = small_files("q4_0").stat().st_size
    assert res["1"]["hwm"] <= res["0"]["hwm"] + 0.02 * size, (res["1"]["hwm"], res["0"]["hwm"], size)


def test_full_file_metadata_is_the_converters(tmp_path):
    """An untruncated plan writes exactly the converter's metadata (no q_lora_rank key for
    V2-Lite, whose 27 layers stock recognises)."""
    cfg = synth.real_config("v2-lite")
    conv = synth.converter_for(cfg)
    w = gguf.GGUFWriter(None, conv.arch)
    conv.write_metadata(w)
    keys = set(w.kv_data[0])
    assert "deepseek2.attention.q_lora_rank" not in keys
    assert "deepseek2.rope.scaling.type" in keys and "deepseek2.expert_weights_scale" in keys


def test_atomic_write_leaves_nothing_on_error(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk on fire")
    monkeypatch.setattr(synth, "_write_streamed", boom)
    with pytest.raises(RuntimeError):
        synth.synthesize(tmp_path / "x.gguf", "v2-lite", "q4_0", layers=1, tokenizer="bytes", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_byte_level_tokenizer_fallback():
    cfg = synth.real_config("v3")
    tok, src = synth.synth_tokenizer("v3", cfg, "bytes")
    assert len(tok.tokens) == 129280 and tok.bos_id == 0 and tok.eos_id == 1 and tok.pre == "deepseek-v3"
    assert "stand-in" in src
