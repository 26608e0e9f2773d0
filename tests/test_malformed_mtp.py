"""Hand-made or damaged GGUFs the engine used to abort on are load errors (issues 49 and 47).

- DeepSeek's MTP ("nextn") layers that do not match `<arch>.nextn_predict_layers`: the key says 1
  but the MTP block has no nextn tensors, nextn tensors in a block the key calls a main layer, two
  MTP layers where llama.cpp's graph runs one. With `mtp=True` each aborted the process in the MTP
  graph (GGML_ASSERT "MTP block missing nextn.eh_proj", "only supports a single MTP block"); without
  it some loaded a model with a layer silently dropped.
- 1-D tensors (norm weights, biases, sinks, V4's mHC base and scale) stored as BF16 or F16: every
  architecture aborted in ggml's CPU element-wise kernels (ggml_compute_forward_mul: unsupported
  types) or on an F32 assertion.
- Memory-budget messages print sizes below 1 GiB in a unit that shows them.

Each file is a converted fixture with one thing changed, loaded in a child process (an abort must
not take pytest down); the runtime's pre-load check is runtime/model_check.py.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import gguf
import numpy as np
import pytest

from child_loads import run_in_children

Q = gguf.GGMLQuantizationType
PROMPT = [1, 17, 230, 5]

# loads "path mtp" per stdin line, greedy-decodes a few tokens; one JSON line before and after each
# file, so the parent knows which one killed the child. The engine's error-level log is recorded (the
# loader's reason; the exception itself says only "Failed to load model from file"), and what the
# runtime printed (MTP off: ...)
CHILD = textwrap.dedent("""
    import contextlib, io, json, sys
    from deepseek_cpu import Llama
    from deepseek_cpu.runtime import llama_log
    errors, _write, _level = [], llama_log._log_write, [0]
    def _record(level, text):
        if level != 5:  # GGML_LOG_LEVEL_CONT continues the line before
            _level[0] = level
        if _level[0] == 4 and text:  # GGML_LOG_LEVEL_ERROR
            errors.append(text.decode("utf-8", "replace"))
        _write(level, text)
    llama_log._log_write = _record
    for line in sys.stdin:
        path, mtp = line.split()
        print(json.dumps({"start": line.strip()}), flush=True)
        errors.clear()
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                llm = Llama(path, n_ctx=64, n_threads=1, verbose=False, mtp=int(mtp))
            toks = []
            for t in llm.generate(%r, reset=True, temp=0.0):
                toks.append(int(t))
                if len(toks) >= 6:
                    break
            llm.close()
            out = {"outcome": "loaded", "tokens": toks}
        except Exception as e:
            out = {"outcome": "exception", "type": type(e).__name__, "message": str(e)}
        out.update(key=line.strip(), log="".join(errors), said=said.getvalue())
        print(json.dumps(out), flush=True)
""" % (PROMPT,))


def load_all(items: list[tuple[object, int]]) -> dict[tuple[str, int], dict]:
    """(path, mtp) -> outcome: loaded (with the greedy tokens), exception, or died (a signal); a
    fresh child goes on after a death."""
    results = run_in_children(CHILD, [f"{p} {m}" for p, m in items], "key")
    return {(p, m): results[f"{p} {m}"] for p, m in ((str(p), m) for p, m in items)}


def rewrite(src, dst, drop=(), keys=None, tensors=None, types=None, split=0):
    """`src` written to `dst` with tensors dropped, metadata `keys` set (None: removed; a new key is
    a uint32), `tensors` (name -> f32 array, numpy order) replaced or added, and `types` (name ->
    BF16 / F16) stored in another type from the f32 values. split: shards of at most this many
    tensors (gguf-split's `<dst stem>-0000i-of-0000N.gguf`)."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents(), split_max_tensors=split)
    keys, tensors, types = dict(keys or {}), dict(tensors or {}), types or {}
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = keys.pop(name) if name in keys else f.contents()
        if value is not None:
            w.add_key_value(name, value, f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    for name, value in keys.items():
        if value is not None:
            w.add_uint32(name, value)
    for t in r.tensors:
        if t.name in drop:
            continue
        replaced = t.name in tensors
        data = tensors.pop(t.name) if replaced else np.array(t.data)
        if t.name in types:
            assert t.tensor_type == Q.F32, t.name
            w.add_tensor(t.name, gguf.quants.quantize(data, types[t.name]), raw_dtype=types[t.name])
        elif replaced or t.tensor_type in (Q.F32, Q.F16, Q.I32):
            w.add_tensor(t.name, data)
        else:  # the stored bytes as they are
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _tensors(path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}


# --- MTP layers that do not match nextn_predict_layers ---------------------------------------

V3, N = "deepseek2", 3  # v3_mtp: 3 main layers, its MTP layer is block 3


@pytest.fixture(scope="module")
def v3(converted):
    return converted("v3_mtp", "f32")


@pytest.fixture(scope="module")
def mtp_files(v3, converted, tmp_path_factory):
    """name -> (path, what the error names): v3_mtp (and v4_flash) with the MTP layer out of step
    with the key."""
    d = tmp_path_factory.mktemp("malformed_mtp")
    t = _tensors(v3)
    nextn = [n for n in t if ".nextn." in n]
    block = [n for n in t if n.startswith(f"blk.{N}.")]
    k_n, k_b = f"{V3}.nextn_predict_layers", f"{V3}.block_count"
    cases = {
        # the key says 1, the MTP block has its decoder layer but no nextn tensors
        "no_nextn_tensors": (dict(drop=nextn), f"blk.{N}.nextn.eh_proj.weight"),
        # only the probe the loader looks for is gone (the rest of the head loads as optional)
        "no_eh_proj": (dict(drop=[f"blk.{N}.nextn.eh_proj.weight"]), f"blk.{N}.nextn.eh_proj.weight"),
        # the key says 1 of 3 blocks is MTP: the last main layer, which has no head
        "key_on_a_main_layer": (dict(drop=block, keys={k_b: N}), f"blk.{N - 1}.nextn.eh_proj.weight"),
        # the key says 2: a main layer taken for an MTP layer
        "key_says_two": (dict(keys={k_n: 2}), k_n),
        # nextn tensors, the key says none (0 or missing)
        "key_says_none": (dict(keys={k_n: 0}), f"blk.{N}.nextn."),
        "key_missing": (dict(keys={k_n: None}), f"blk.{N}.nextn."),
        "key_says_none_fewer_blocks": (dict(keys={k_n: 0, k_b: N}), f"blk.{N}.nextn."),
    }
    files = {name: (rewrite(v3, d / f"{name}.gguf", **edit), needle) for name, (edit, needle) in cases.items()}
    # V4's loader makes such a block a main layer instead (its MTP graph would then abort)
    v4 = converted("v4_flash", "f32")
    drop = [t.name for t in gguf.GGUFReader(v4).tensors if ".nextn." in t.name]
    files["v4_no_nextn_tensors"] = (rewrite(v4, d / "v4.gguf", drop=drop), "blk.4.nextn.eh_proj.weight")
    return files


@pytest.fixture(scope="module")
def v3_shapes(v3, tmp_path_factory):
    """MTP tensors of the wrong shape: the engine's loader names them itself (check_tensor_dims)."""
    d = tmp_path_factory.mktemp("mtp_shapes")
    t, H = _tensors(v3), 64
    b = f"blk.{N}.nextn."
    cases = {b + "eh_proj.weight": t[b + "eh_proj.weight"][:, :H], b + "enorm.weight": np.ones(2 * H, np.float32),
             b + "hnorm.weight": np.ones(H + 1, np.float32), b + "shared_head_norm.weight": np.ones(2 * H, np.float32),
             b + "embed_tokens.weight": t[b + "embed_tokens.weight"][:-1],
             b + "shared_head_head.weight": t[b + "shared_head_head.weight"][:-2]}
    return {name: rewrite(v3, d / f"{name}.gguf", tensors={name: value}) for name, value in cases.items()}


def test_no_malformed_mtp_file_kills_the_process(v3, mtp_files, v3_shapes):
    """With and without mtp, every file is a load error that names the tensor or key, in the
    exception or in the loader's log; the undamaged file loads through the same harness."""
    files = [p for p, _ in mtp_files.values()] + list(v3_shapes.values())
    out = load_all([(v3, 0), (v3, 1)] + [(p, m) for p in files for m in (0, 1)])
    assert out[(str(v3), 0)]["outcome"] == "loaded" and out[(str(v3), 1)]["outcome"] == "loaded"
    assert out[(str(v3), 0)]["tokens"] == out[(str(v3), 1)]["tokens"]
    died = {k: r for k, r in out.items() if r["outcome"] == "died"}
    assert not died, died
    needles = {str(p): n for p, n in mtp_files.values()} | {str(p): n for n, p in v3_shapes.items()}
    for (p, m), r in out.items():
        if p != str(v3):
            assert r["outcome"] == "exception", (p, m, r)
            assert needles[p] in r["message"] + r["log"], (p, m, needles[p], r)


def test_mtp_layers_out_of_step_with_the_key_are_one_error_naming_them(mtp_files):
    """Not the engine's vague "wrong number of tensors" (or a layer silently dropped): the runtime's
    own error, with the key and the tensor."""
    items = [(p, m) for p, _ in mtp_files.values() for m in (0, 1)]
    out = load_all(items)
    for name, (p, needle) in mtp_files.items():
        for m in (0, 1):
            r = out[(str(p), m)]
            assert r["outcome"] == "exception" and r["type"] == "MalformedModel", (name, m, r)
            assert needle in r["message"] and "nextn_predict_layers" in r["message"], (name, m, r)
            assert "\n" not in r["message"], r["message"]
    from deepseek_cpu.errors import DeepseekCpuError
    from deepseek_cpu.runtime.model_check import MalformedModel
    assert issubclass(MalformedModel, DeepseekCpuError) and issubclass(MalformedModel, ValueError)


def test_a_stripped_or_second_mtp_layer_turns_mtp_off_and_decodes(v3, tmp_path):
    """The key kept but the MTP block's tensors stripped (a file llama.cpp's loader accepts), and a
    file with two MTP layers (its graph runs one): `mtp=True` says MTP is off in one line and
    decodes the tokens decoding without it gives."""
    t = _tensors(v3)
    stripped = rewrite(v3, tmp_path / "stripped.gguf", drop=[n for n in t if n.startswith(f"blk.{N}.")])
    second = {f"blk.{N + 1}." + n.split(".", 2)[2]: a for n, a in t.items() if n.startswith(f"blk.{N}.")}
    two = rewrite(v3, tmp_path / "two.gguf", tensors=second,
                  keys={f"{V3}.nextn_predict_layers": 2, f"{V3}.block_count": N + 2})
    # the control: a split model whose MTP layer is all in its second shard is not a stripped one
    first_mtp = [n.startswith(f"blk.{N}.") for n in t].index(True)
    rewrite(v3, tmp_path / "split.gguf", split=first_mtp)
    split = tmp_path / "split-00001-of-00002.gguf"
    out = load_all([(v3, 0), (stripped, 1), (two, 0), (two, 1), (split, 1)])
    want = out[(str(v3), 0)]["tokens"]
    for p, reason in ((stripped, "the head was stripped"), (two, "runs one")):
        r = out[(str(p), 1)]
        assert r["outcome"] == "loaded" and r["tokens"] == want, r
        assert r["said"].count("MTP off") == 1 and reason in r["said"], r
    assert out[(str(two), 0)]["outcome"] == "loaded" and out[(str(two), 0)]["tokens"] == want
    r = out[(str(split), 1)]
    assert r["outcome"] == "loaded" and r["tokens"] == want and "MTP off" not in r["said"], r


# --- 1-D tensors the CPU kernels take as F32 only ------------------------------------------------

# (fixture, tensor, type, mtp): norms, a bias, V4's sinks and mHC base, an MTP norm (used with mtp)
NON_F32 = [("v2_greedy", "blk.0.attn_norm.weight", Q.BF16, 0), ("v2_greedy", "output_norm.weight", Q.F16, 0),
           ("v32_dsa", "blk.0.indexer.k_norm.bias", Q.BF16, 0), ("v32_dsa", "blk.1.exp_probs_b.bias", Q.BF16, 0),
           ("v4_flash", "blk.1.attn_norm.weight", Q.BF16, 0), ("v4_flash", "output_norm.weight", Q.BF16, 0),
           ("v4_flash", "blk.1.attn_compressor_norm.weight", Q.BF16, 0),
           ("v4_flash", "blk.1.attn_sinks.weight", Q.BF16, 0), ("v4_flash", "blk.0.hc_attn_base.weight", Q.F16, 0),
           ("v3_mtp", f"blk.{N}.nextn.enorm.weight", Q.BF16, 1)]


def test_non_f32_norms_and_biases_are_load_errors_naming_the_tensor(converted, tmp_path):
    """A hand-made file with a BF16/F16 norm weight (the converter keeps them F32) aborted inside
    ggml_compute_forward_mul; now a MalformedModel naming the tensor and its type. The converter's
    own shipped-precision V4 file (bf16 matrices, MXFP4 experts, F32 vectors) still loads, and an MTP
    norm only matters when the MTP layer is loaded."""
    items, cases = [(converted("v4_flash", "bf16"), 0)], []
    for i, (name, tensor, qtype, mtp) in enumerate(NON_F32):
        p = rewrite(converted(name, "f32"), tmp_path / f"{i}.gguf", types={tensor: qtype})
        items.append((p, mtp))
        cases.append((p, tensor, qtype, mtp))
    mtp_off = cases[-1][0]
    out = load_all(items + [(mtp_off, 0)])
    assert out[(str(items[0][0]), 0)]["outcome"] == "loaded", out[(str(items[0][0]), 0)]
    assert out[(str(mtp_off), 0)]["outcome"] == "loaded", out[(str(mtp_off), 0)]
    for p, tensor, qtype, mtp in cases:
        r = out[(str(p), mtp)]
        assert r["outcome"] == "exception" and r["type"] == "MalformedModel", (tensor, r)
        assert f"tensor {tensor} is {qtype.name}" in r["message"] and "F32" in r["message"], r


def test_serve_refuses_a_file_the_engine_would_abort_on(converted, tmp_path):
    """serve starts llama-server without Llama(): it makes the same header check itself, so a
    hand-made file with a BF16 norm is one Error: line before anything starts, not a server that
    dies at its first request."""
    name, tensor, qtype, _ = NON_F32[0]
    bad = rewrite(converted(name, "f32"), tmp_path / "bad.gguf", types={tensor: qtype})
    r = subprocess.run([sys.executable, "-m", "deepseek_cpu", "serve", str(bad), "--dry-run"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert f"tensor {tensor} is {qtype.name}" in r.stderr, r.stderr
    ok = subprocess.run([sys.executable, "-m", "deepseek_cpu", "serve", str(converted(name, "f32")), "--dry-run"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr


def test_the_check_reads_only_the_header():
    """The check is the header's: the rule is stated on what gguf_header reads (no tensor data)."""
    from pathlib import Path

    from deepseek_cpu.gguf_header import GGUFHeader, TensorEntry
    from deepseek_cpu.runtime.model_check import MalformedModel, check
    h = GGUFHeader(Path("x.gguf"), 0, {"general.architecture": "deepseek2", "deepseek2.block_count": 2})
    h.tensors = [TensorEntry("blk.0.attn_norm.weight", (64,), Q.F32, 0, 256),
                 TensorEntry("blk.0.attn_q_a.weight", (64, 32), Q.BF16, 0, 4096),
                 TensorEntry("blk.0.ffn_gate_tid2eid.weight", (6, 400), Q.I32, 0, 9600)]
    check(h)  # matrices of any type, integer tables: fine
    h.tensors.append(TensorEntry("blk.1.ffn_norm.weight", (64,), Q.Q8_0, 0, 68))
    with pytest.raises(MalformedModel, match="blk.1.ffn_norm.weight is Q8_0"):
        check(h)


# --- memory-budget messages --------------------------------------------------------------------

def test_budget_messages_show_sizes_below_a_gib(converted, capfd):
    """A tiny model's always-hot set is some KiB: the error and the load's line say so instead of
    "0.00 GiB", and so does the plan of any size below 1 GiB."""
    from deepseek_cpu import Llama
    from deepseek_cpu.runtime import memory_budget
    gguf_path = str(converted("v2_lite", "f32"))
    hot, _ = memory_budget.tensor_bytes(gguf_path)
    with pytest.raises(memory_budget.MemoryBudgetError) as e:
        Llama(gguf_path, n_ctx=64, mem_budget=hot // 2, verbose=False)
    assert "0.00 GiB" not in str(e.value) and "KiB" in str(e.value), str(e.value)
    capfd.readouterr()
    Llama(gguf_path, n_ctx=64, mem_budget="1G", verbose=True).close()
    line = next(ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("deepseek-cpu: memory budget"))
    assert "0.00 GiB" not in line and "KiB" in line and "locked" in line, line
    # the one formatter all of them use
    size = memory_budget.format_size
    assert size(hot // 2) in str(e.value)
    assert [size(n) for n in (3 << 30, 1536 << 20, 3 << 20, 200 << 10, 512)] == \
        ["3.00 GiB", "1.50 GiB", "3.0 MiB", "200.0 KiB", "512 bytes"]
    plan = memory_budget.BudgetPlan(budget=512 << 20, hot_weights=3 << 20, expert_weights=40 << 20,
                                    kv_cache=200 << 10)
    assert plan.describe().startswith("memory budget 512.0 MiB: always-hot 3.2 MiB (weights 3.0 MiB, "
                                      "KV cache 200.0 KiB), routed experts 40.0 MiB")
