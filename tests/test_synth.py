"""`deepseek-cpu synth`: random-weight GGUFs with the real models' shapes, types and metadata."""
import contextlib
import io
import json
import logging
import os
import re

import gguf
import numpy as np
import pytest

from conftest import CHECKPOINTS, fixture_dir

from deepseek_cpu.quantization import registry
from deepseek_cpu.tools import routing, synth


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
def test_config_only_plan_equals_real_conversion(converted, name):
    """The tensors synth takes from the converter's table for a config.json must be exactly
    what the converter writes for a real checkpoint: same tensors, order, shapes and types."""
    cfg = json.loads((fixture_dir(name) / "config.json").read_text())
    _conv, specs = synth.converter_plan(cfg)
    _r, real = _tensors(converted(name, "f32"))
    assert [p.name for p in specs] == list(real)
    for p in specs:
        assert (p.shape, p.qtype(Q.F32)) == real[p.name], p.name


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


def _skip_data(writer, name, nbytes, chunks):
    """synth's _write_streamed without the random bytes: the tensor's extent is left a hole (a
    sparse file), so a whole model's header, metadata and layout are written in a second."""
    fout = writer.fout[0]
    assert next(iter(writer.tensors[0])) == name
    writer.tensors[0].pop(name)
    writer.write_padding(fout, fout.tell())
    fout.seek(nbytes - 1, os.SEEK_CUR)
    fout.write(b"\0")  # the file reaches the tensor's end
    writer.write_padding(fout, nbytes)
    writer.state = gguf.gguf_writer.WriterState.WEIGHTS


@pytest.fixture(scope="module")
def full_size(tmp_path_factory):
    """full_size(shape): the untruncated model as synth.synthesize writes it in bf16 (the
    intermediate `pull` quantizes from), its 31 GB (V2-Lite) to 1.3 TB (V3) of weights holes."""
    d = tmp_path_factory.mktemp("full")
    made = {}

    def get(shape):
        if shape not in made:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(synth, "_write_streamed", _skip_data)
                made[shape] = synth.synthesize(d / f"{shape}-bf16.gguf", shape, "bf16", tokenizer="bytes",
                                               progress=False)
        return made[shape]
    yield get
    for p in made.values():
        p.unlink()


# llama.cpp's log line for each tensor of a quantization (dry run or not), e.g.
#   [  12/ 404]  blk.0.attn_q.weight - [ 2048,  3072, 1, 1], type = bf16, size = 12.000 MiB -> 3.375 MiB (q4_K)
# without the "(type)" at the end when the tensor keeps its type
_QUANT_LINE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s*(\w+), "
                         r"size = [^(\n]*(?:\((\w+)\))?\s*$", re.M)


def llama_quantize_types(src, quant: str) -> dict[str, gguf.GGMLQuantizationType]:
    """The type llama.cpp's quantizer (llama_model_quantize, as `pull` and llama-quantize run it)
    gives each tensor of `src` in mix `quant`. A dry run: the types are chosen from names, shapes
    and hyperparameters as in a real run, but no data is read: weights left as holes serve."""
    from deepseek_cpu.runtime import llama as _engine  # noqa: F401  (our libllama; its log callback writes sys.stderr)
    import llama_cpp
    import ctypes
    scheme = registry.get(quant)
    p = llama_cpp.llama_model_quantize_default_params()
    # the base mix by llama.cpp's own name for it, not by our table of file types
    p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_" + ("ALL_F32" if scheme.base == "f32" else "MOSTLY_" + scheme.base.upper()))
    p.dry_run, p.nthread = True, 1
    # the scheme's rules as llama-quantize's --tensor-type overrides
    rules = (llama_cpp.llama_model_tensor_override * (len(scheme.rules) + 1))()
    for i, (pattern, tname) in enumerate(scheme.rules):
        rules[i].pattern, rules[i].type = pattern.encode(), int(gguf.GGMLQuantizationType[tname.upper()])
    rules[len(scheme.rules)].pattern = None
    if scheme.rules:
        p.tt_overrides = ctypes.cast(rules, ctypes.POINTER(llama_cpp.llama_model_tensor_override))
    log = logging.getLogger("llama-cpp-python")  # its level decides which llama.cpp lines are printed
    level = log.level
    log.setLevel(logging.DEBUG)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(src.with_suffix(".unused")).encode(), p)
    finally:
        log.setLevel(level)
    assert rc == 0, buf.getvalue()[-3000:]
    assert int(scheme.file_type) == p.ftype  # and synth's general.file_type names that mix
    return {m[1]: Q[(m[3] or m[2]).upper()] for m in _QUANT_LINE.finditer(buf.getvalue())}


# the shapes synth writes with a scheme's types (V4 keeps its release's own: test_deepseek_v4.py)
SCHEME_SHAPES = [s for s in synth.SHAPES if not synth.is_published_precision(synth.REAL_CONFIGS[s])]


def _synth_writes(shape, quant):
    try:
        synth.synth_plan(shape, quant)
        return True
    except synth.SynthError:
        return False


# every (shape, scheme) synth writes: the schemes whose base recipe it imitates on every shape, and
# those whose rules name every tensor's type on a shape (ds-q3 / ds-q2 on V2, V2-Lite, Coder-V2-Lite)
SYNTH_CASES = [(shape, quant) for quant in registry.schemes() for shape in SCHEME_SHAPES if _synth_writes(shape, quant)]


def test_synth_writes_the_mixes_below_4_bits_and_refuses_what_it_cannot_predict():
    """ds-q3 and ds-q2 (q3_k_m and q2_k bases, recipes synth does not imitate) on the shapes where their
    rules cover every tensor; where one tensor has no rule (V3's MTP block), a clear error naming it."""
    assert {("v2-lite", "ds-q3"), ("v2-lite", "ds-q2"), ("v2", "ds-q2")} <= set(SYNTH_CASES)
    with pytest.raises(synth.SynthError, match=r"no rule of ds-q3 names a type for blk\.61\.nextn\."):
        synth.synth_plan("v3", "ds-q3")


@pytest.mark.parametrize(("shape", "quant"), SYNTH_CASES)
def test_tensor_types_are_llama_quantizes(full_size, shape, quant):
    """Every tensor of the whole model gets the type llama.cpp's quantizer picks for the real
    shapes: the k-quant mixes' per-layer choices (use_more_bits over 27, 60 or 61 layers), Q6_K
    output, and the fallbacks for rows that are not whole blocks (V2-Lite's 1408-wide experts,
    128-wide attn_k_b). synth writes the plan's types (test_small_file_loads_and_gives_finite_logits)."""
    got = llama_quantize_types(full_size(shape), quant)
    _cfg, _conv, ts = synth.synth_plan(shape, quant)
    assert len(got) == len(ts)  # a line for every tensor was read
    wrong = {t.name: (t.qtype.name, got[t.name].name) for t in ts if got.get(t.name) != t.qtype}
    assert not wrong, f"{len(wrong)} tensors differ, (synth, llama.cpp): {wrong}"


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
    assert _field(r, "general.file_type") == int(registry.get(quant).file_type)
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
    """The loader (src/dsc/loader-memory.cpp) faults in each large tensor's destination (here the 104 MB expert tensors) from
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


def test_full_file_metadata_is_the_converters(full_size, converted):
    """An untruncated file has the metadata keys `deepseek-cpu convert` writes for a checkpoint of
    V2-Lite's layout (the v2_lite fixture: V2-Lite's config.json but for the sizes), with the same
    values where the configs agree; in particular no q_lora_rank key (a truncated file adds one so
    that stock, which knows V2-Lite's layout only by its 26/27 layers, loads it)."""
    r = gguf.GGUFReader(str(full_size("v2-lite")))
    ref = gguf.GGUFReader(str(converted("v2_lite", "f32")))
    keys = {k for k in r.fields if k.startswith("deepseek2.")}
    assert keys == {k for k in ref.fields if k.startswith("deepseek2.")}
    assert "deepseek2.attention.q_lora_rank" not in keys and _field(r, "deepseek2.block_count") == 27
    for k in ("context_length", "rope.freq_base", "rope.scaling.type", "rope.scaling.factor",
              "rope.scaling.original_context_length", "rope.scaling.yarn_log_multiplier", "expert_weights_scale",
              "expert_shared_count", "leading_dense_block_count", "attention.layer_norm_rms_epsilon"):
        assert _field(r, "deepseek2." + k) == _field(ref, "deepseek2." + k), k


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


@pytest.fixture(scope="module")
def routed_files(tmp_path_factory):
    """3-layer V2-Lite q4_0 files (2 MoE layers) with each routing, written once."""
    d = tmp_path_factory.mktemp("routing")
    out = {}

    def get(kind):
        if kind not in out:
            out[kind] = synth.synthesize(d / f"v2-lite-3-{kind}.gguf", "v2-lite", "q4_0", layers=3, tokenizer="offline",
                                         progress=False, routing=routing.Routing(kind))
        return out[kind]
    return get


def _engine_top10(path):
    """Share of routings the most used 10% of experts took, per MoE layer, as the engine counted
    them over 1,024 random tokens (logits for every token, so the last layer routes them all)."""
    from deepseek_cpu import Llama
    llm = Llama(str(path), n_ctx=1024, n_batch=512, logits_all=True, verbose=False)
    rng = np.random.default_rng(7)
    llm.reset_expert_usage()
    for _ in range(2):
        llm.reset()
        llm.eval(rng.integers(1000, 100000, 512).tolist())
    usage = llm.expert_usage()
    llm.close()
    return usage.coverage(0.1)


def test_routing_is_what_synth_says(routed_files):
    """The engine's own routing counts: `random` weights send most tokens to a few experts,
    `uniform` spreads them, `skewed` plants the share it reports in the file (within what 1,024
    tokens can tell). The uniform bound 0.25 is 2.5x a perfect spread: random tokens still share
    some structure through attention."""
    from deepseek_cpu.gguf_header import read
    top = {kind: _engine_top10(routed_files(kind)) for kind in ("random", "uniform", "skewed")}
    assert (top["random"] > 0.6).all(), top
    assert (top["uniform"] < 0.25).all(), top
    planted = float(re.search(r"take (\d+)%", read(routed_files("skewed")).get(synth.ROUTING_KEY)).group(1)) / 100
    assert planted == pytest.approx(routing.DEFAULT_TOP10, abs=0.02)
    assert (abs(top["skewed"] - planted) < 0.12).all() and (top["skewed"] > top["uniform"] + 0.1).all(), (planted, top)


def test_zero_mean_blocks():
    """Where synth centres the quants (the routings' premise), each type decodes with mean ~0:
    below 2% of the weights' standard deviation over 64k blocks."""
    for qtype in synth._CENTRED:
        n = gguf.GGML_QUANT_SIZES[qtype][0] * 65536
        raw = np.concatenate([np.ascontiguousarray(c).view(np.uint8) for c in synth.RandomBlocks(3).chunks(qtype, n)])
        w = gguf.quants.dequantize(raw.reshape(1, -1), qtype).reshape(-1)
        assert abs(w.mean()) < 0.02 * w.std(), (qtype, w.mean(), w.std())
        old = np.concatenate([np.ascontiguousarray(c).view(np.uint8)
                              for c in synth.RandomBlocks(3, zero_mean=False).chunks(qtype, n)])
        w_old = gguf.quants.dequantize(old.reshape(1, -1), qtype).reshape(-1)
        assert abs(w_old.mean()) > 0.04 * w_old.std(), qtype  # what "random" keeps


def test_unplantable_skew_is_a_clear_error(tmp_path):
    with pytest.raises(synth.SynthError, match="cannot be planted"):
        synth.synthesize(tmp_path / "x.gguf", "v2-lite", "q4_0", layers=2, tokenizer="offline", progress=False,
                         routing=routing.Routing("skewed", 0.9))
    assert not list(tmp_path.iterdir())


def test_output_mode_follows_the_umask(tmp_path):
    """The finished file has the mode a plain open() gives under the user's umask, as convert's
    has: a model one user or container makes, another can read (mkstemp's 0600 did not)."""
    old = os.umask(0o002)  # 0664: neither mkstemp's 0600 nor the usual 0644 by chance
    try:
        out = synth.synthesize(tmp_path / "x.gguf", "v2-lite", "q4_0", layers=1, tokenizer="bytes",
                               progress=False)
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o664, oct(out.stat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["x.gguf"]  # and no partial file left beside it
