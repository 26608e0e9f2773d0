"""The installed engine is ours, reached by a plain `import llama_cpp`, and fails safely."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, run_python

SERIES = [l.strip() for l in (REPO / "patches" / "series").read_text().splitlines() if l.strip() and not l.startswith("#")]


def test_plain_import_llama_cpp_loads_the_patched_library():
    code = (
        "import ctypes, os, llama_cpp\n"
        "f = llama_cpp.llama_cpp._lib.deepseek_cpu_build_info\n"
        "f.restype = ctypes.c_char_p\n"
        "print(f().decode())\n"
        "print(llama_cpp.llama_print_system_info().decode())\n"
        "print([l.split()[-1] for l in open('/proc/self/maps') if l.rstrip().endswith('libllama.so')][0])\n"
    )
    r = run_python(code, unset=("LLAMA_CPP_LIB_PATH", "DEEPSEEK_CPU_DISABLE"))
    assert r.returncode == 0, r.stderr
    marker, sysinfo, path = r.stdout.strip().splitlines()
    assert marker.startswith("deepseek-cpu ")
    # the exact change set: the sha256 of the patches' bytes in series order, then of each
    # own file's path under patches/files and its bytes
    import hashlib
    h = hashlib.sha256(b"".join((REPO / "patches" / p).read_bytes() for p in SERIES))
    files = REPO / "patches" / "files"
    for f in sorted(p for p in files.rglob("*") if p.is_file()):
        h.update(f.relative_to(files).as_posix().encode() + b"\0" + f.read_bytes())
    digest = h.hexdigest()
    assert f"{len(SERIES)} patches, series {digest[:12]}" in marker, marker
    assert "DEEPSEEK_CPU = deepseek-cpu" in sysinfo
    import deepseek_cpu
    assert Path(path).resolve().parent == (Path(deepseek_cpu.__file__).parent / "lib").resolve()


def test_opt_out_leaves_llama_cpp_alone():
    r = run_python("import os; print(os.environ.get('LLAMA_CPP_LIB_PATH', 'unset'))",
                   env_extra={"DEEPSEEK_CPU_DISABLE": "1"}, unset=("LLAMA_CPP_LIB_PATH",))
    assert r.stdout.strip() == "unset"
    r = run_python("import os; print(os.environ.get('LLAMA_CPP_LIB_PATH', 'unset'))", unset=("LLAMA_CPP_LIB_PATH",))
    assert r.stdout.strip().endswith("deepseek_cpu/lib")


def test_user_lib_path_is_respected(tmp_path):
    r = run_python("import os; print(os.environ['LLAMA_CPP_LIB_PATH'])", env_extra={"LLAMA_CPP_LIB_PATH": str(tmp_path)})
    assert r.stdout.strip() == str(tmp_path)


def test_info_command_reports_patches_and_library():
    r = subprocess.run([sys.executable, "-m", "deepseek_cpu", "info", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["patched"] is True
    assert d["patches"] == SERIES
    assert len(d["llama_cpp_commit"]) == 40
    assert d["library"].endswith("deepseek_cpu/lib/libllama.so")
    assert d["default_threads"] >= 1


def _tiny_llama_gguf(path: Path):
    """A 2-layer random 'llama' model: not DeepSeek, must load as stock would."""
    import gguf
    rng = np.random.default_rng(0)
    V, H, F, L, NH = 64, 32, 64, 2, 4
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(L); w.add_context_length(128); w.add_embedding_length(H)
    w.add_feed_forward_length(F); w.add_head_count(NH); w.add_head_count_kv(NH)
    w.add_layer_norm_rms_eps(1e-5); w.add_rope_dimension_count(H // NH)
    w.add_tokenizer_model("gpt2"); w.add_tokenizer_pre("default")
    toks = [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(V)]
    w.add_token_list(toks); w.add_token_types([1] * V); w.add_token_merges(["a a"])
    w.add_bos_token_id(0); w.add_eos_token_id(1)

    def t(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))
    t("token_embd.weight", V, H); w.add_tensor("output_norm.weight", np.ones(H, np.float32)); t("output.weight", V, H)
    for i in range(L):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(H, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(H, np.float32))
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(f"blk.{i}.{n}.weight", H, H)
        t(f"blk.{i}.ffn_gate.weight", F, H); t(f"blk.{i}.ffn_up.weight", F, H); t(f"blk.{i}.ffn_down.weight", H, F)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


def test_non_deepseek_gguf_still_loads(tmp_path):
    p = tmp_path / "llama.gguf"
    _tiny_llama_gguf(p)
    from deepseek_cpu import Llama
    # logits_all: without it llama-cpp-python 0.3.36 never writes `scores` (np.ndarray, uninitialized)
    llm = Llama(str(p), n_ctx=64, logits_all=True, verbose=False)
    llm.eval([2, 3, 4])
    scores = np.array(llm.scores[:3])
    assert np.isfinite(scores).all() and (np.abs(scores).max(axis=1) > 0).all()
    llm.close()


def test_truncated_gguf_is_an_exception_not_a_crash(converted, tmp_path):
    src = converted("v2_greedy", "f32").read_bytes()
    for cut in (len(src) // 2, 200, 9):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(src[:cut])
        code = (f"from deepseek_cpu import Llama\n"
                f"try:\n    Llama({str(bad)!r}, verbose=False)\n"
                f"except Exception as e:\n    print('EXC', type(e).__name__, e)\n")
        r = run_python(code)
        assert r.returncode == 0, f"process died (rc {r.returncode}) on a GGUF cut at {cut} bytes: {r.stderr[-500:]}"
        assert r.stdout.startswith("EXC"), r.stdout


def test_v2_lite_shape_with_other_layer_count_loads(converted):
    """Stock fails with "key not found in model: deepseek2.attention.q_lora_rank"; ours loads it
    and computes transformers' logits (reference.npz), as test_parity does for every fixture."""
    import json
    from conftest import fixture_dir
    from test_parity import TOL, engine_logits, rel_errors
    cfg = json.loads((fixture_dir("v2_lite") / "config.json").read_text())
    assert cfg["q_lora_rank"] is None and cfg["num_hidden_layers"] not in (26, 27)
    ref = np.load(fixture_dir("v2_lite") / "reference.npz")
    got = engine_logits(converted("v2_lite", "f32"), ref["tokens"])
    err = rel_errors(got, ref["logits"])
    assert err.max() <= TOL, f"max relative error {err.max():.3g} at position {err.argmax()}"
    assert (got.argmax(1) == ref["logits"].argmax(1)).all()


def test_op_profile_reports_where_graph_time_went(converted):
    """DEEPSEEK_CPU_OP_PROFILE=1 (dsc/op-profile.c): at exit, a table of graph time by op and weight, the
    weight's layers summed; unset, nothing is printed."""
    code = ("from deepseek_cpu import Llama\n"
            f"llm = Llama({str(converted('v2_greedy', 'f32'))!r}, n_ctx=64, n_threads=2, verbose=False)\n"
            "llm.eval([1, 2, 3, 4, 5])\n"
            "llm.eval([6])\n")
    r = run_python(code, env_extra={"DEEPSEEK_CPU_OP_PROFILE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    table = r.stderr[r.stderr.index("deepseek-cpu op profile:"):].splitlines()
    rows = [l.split() for l in table[1:] if l.strip().endswith("]")]
    shares = [float(row[0].rstrip("%")) for row in rows]
    assert abs(sum(shares) - 100) < 0.5 and shares == sorted(shares, reverse=True)
    # per call: the node's time to the end of the barrier after it, and thread 0's own part
    assert all(row[7] == "(own" and 0 <= float(row[8].rstrip(")")) <= float(row[5]) + 0.05 for row in rows), rows
    # the prompt's and the decoded token's products are separate rows, summed over layers
    keys = [" ".join(row[9:]) for row in rows]
    assert any(k.startswith("MUL_MAT_ID f32 ffn_up_exps.weight [5 tok]") for k in keys), keys
    assert any(k.startswith("MUL_MAT_ID f32 ffn_up_exps.weight [1 tok]") for k in keys), keys
    # other ops are keyed by their whole shape: the prompt's per-head query concat is its own row
    concat = [k for k in keys if k.startswith("CONCAT f32 [")]
    assert any(k.endswith(" x 5]") for k in concat) and any(" x " not in k for k in concat), concat
    counts = {" ".join(row[9:]): int(row[3]) for row in rows}
    assert counts["MUL_MAT f32 output.weight [1 tok]"] == 2  # one row of logits per eval
    r = run_python(code, unset=("DEEPSEEK_CPU_OP_PROFILE",))
    assert r.returncode == 0 and "op profile" not in r.stderr


_DECODE_LOGITS = """
import sys, numpy as np, llama_cpp as lc
from deepseek_cpu.runtime.llama import Llama
path, nt, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
llm = Llama(path, n_ctx=512, n_batch=320, n_ubatch=320, n_threads=nt, n_threads_batch=nt, verbose=False)
ctx, nv = llm._ctx.ctx, llm.n_vocab()
b = lc.llama_batch_init(320, 0, 1)
def step(toks, p0):
    b.n_tokens = len(toks)
    for i, t in enumerate(toks):
        b.token[i] = t; b.pos[i] = p0 + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = i == len(toks) - 1
    assert lc.llama_decode(ctx, b) == 0
    return np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1), shape=(nv,)).copy()
rows = [step([3 + (i * 37) % 250 for i in range(300)], 0)]
for k in range(6):
    rows.append(step([int(rows[-1].argmax())], 300 + k))
np.save(out, np.array(rows))
"""


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    from deepseek_cpu.tools import synth
    # V2-Lite's widths, the dense layer and one MoE layer, random weights (~0.4 GB)
    return synth.synthesize(tmp_path_factory.mktemp("det") / "v2-lite-2.gguf", "v2-lite", "q4_0", layers=2,
                            tokenizer="bytes", progress=False)


def test_decode_is_deterministic_and_thread_count_invariant(moe_model, tmp_path):
    """Greedy decoding gives the same logits, bit for bit, on every run and with 1 or 2 threads.
    300 cached tokens are 5 key blocks of the one-token MLA attention kernel (dsc/mla-attention.cpp): when each thread
    folded the blocks it happened to take into its own partial (until 2026-12-02), the float sums depended on
    timing, logits moved by ~1e-6 between runs, and greedy outputs of a real model could fork."""
    got = {}
    for name, nt in (("t2a", 2), ("t2b", 2), ("t1", 1)):
        out = tmp_path / f"{name}.npy"
        r = subprocess.run([sys.executable, "-c", _DECODE_LOGITS, str(moe_model), str(nt), str(out)],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        got[name] = np.load(out)
    assert got["t2a"].shape == (7, got["t2a"].shape[1]) and np.isfinite(got["t2a"]).all()
    assert np.array_equal(got["t2a"], got["t2b"]), np.abs(got["t2a"] - got["t2b"]).max()
    assert np.array_equal(got["t2a"], got["t1"]), np.abs(got["t2a"] - got["t1"]).max()


def test_the_drop_in_keeps_interpreter_start_up_cheap():
    """The .pth drop-in runs in every Python process of the environment: it may set a
    variable, but must not pull in importlib.metadata (tens of ms; the package version is
    read lazily), numpy or llama_cpp. Measured on the Zen 5 EPYC: `python -c pass` 449 ms
    with the eager version lookup, 105 ms without (medians of 8, interleaved, under load)."""
    r = run_python("import sys, os; print(sorted(m for m in ('importlib.metadata', 'numpy', 'llama_cpp', 'gguf') "
                   "if m in sys.modules)); print(os.environ.get('LLAMA_CPP_LIB_PATH', 'unset'))",
                   unset=("LLAMA_CPP_LIB_PATH", "DEEPSEEK_CPU_DISABLE"))
    loaded, lib = r.stdout.strip().splitlines()
    assert loaded == "[]", loaded
    assert lib.endswith("deepseek_cpu/lib")
    import deepseek_cpu
    assert deepseek_cpu.__version__ == __import__("importlib.metadata").metadata.version("deepseek-cpu")
