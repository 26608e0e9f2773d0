"""Portable builds: every x86 CPU variant built, the best one for this CPU chosen at run time,
reached from a plain `import llama_cpp` (patch 0004; llama-cpp-python#2069).

Builds our CMake project with DEEPSEEK_CPU_PORTABLE=ON but only a few variants (time), then
checks which libggml-cpu-*.so a fresh interpreter maps.
"""
import os
import shutil
import subprocess

import pytest

from conftest import REPO, run_python
from deepseek_cpu.engine import cpu_flags

pytestmark = pytest.mark.slow

# ggml's x86 variants (ggml/src/CMakeLists.txt) and its ranking (ggml-cpu/arch/x86/cpu-feats.cpp):
# a variant scores 0 if the CPU lacks one of its features, else 1 + the weights of its features;
# the loader maps the highest-scoring one. Mirrored here so the expectation holds on any x86 CPU
# (an AMX Xeon picks sapphirerapids, a Zen 4 zen4, an AVX2-only guest haswell).
FEATURES = {  # ggml feature -> (/proc/cpuinfo flags, score weight)
    "FMA": (["fma"], 1), "F16C": (["f16c"], 1 << 1), "SSE42": (["sse4_2"], 1 << 2),
    "BMI2": (["bmi2"], 1 << 3), "AVX": (["avx"], 1 << 4), "AVX2": (["avx2"], 1 << 5),
    "AVX_VNNI": (["avx_vnni"], 1 << 6),
    "AVX512": (["avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"], 1 << 7),
    "AVX512_VBMI": (["avx512vbmi"], 1 << 8), "AVX512_BF16": (["avx512_bf16"], 1 << 9),
    "AVX512_VNNI": (["avx512_vnni"], 1 << 10), "AMX_INT8": (["amx_int8"], 1 << 11),
    "AMX_TILE": ([], 0),  # compiled in, not scored
}
_BASE = ["SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2"]
VARIANTS = {
    "x64": [], "sse42": ["SSE42"], "sandybridge": ["SSE42", "AVX"], "ivybridge": ["SSE42", "AVX", "F16C"],
    "piledriver": ["SSE42", "AVX", "F16C", "FMA"], "haswell": _BASE,
    "skylakex": _BASE + ["AVX512"], "cannonlake": _BASE + ["AVX512", "AVX512_VBMI"],
    "cascadelake": _BASE + ["AVX512", "AVX512_VNNI"], "icelake": _BASE + ["AVX512", "AVX512_VBMI", "AVX512_VNNI"],
    "cooperlake": _BASE + ["AVX512", "AVX512_VNNI", "AVX512_BF16"],
    "zen4": _BASE + ["AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"],
    "alderlake": _BASE + ["AVX_VNNI"],
    "sapphirerapids": _BASE + ["AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX_TILE", "AMX_INT8"],
}


def variant_score(name: str, flags: set[str]) -> int:
    score = 1
    for feat in VARIANTS[name]:
        need, weight = FEATURES[feat]
        if not all(f in flags for f in need):
            return 0
        score += weight
    return score


def best_variant(flags: set[str]) -> str:
    return max(VARIANTS, key=lambda v: variant_score(v, flags))


def expected_variant() -> str:
    return best_variant(cpu_flags())


def test_variant_ranking_mirrors_ggml():
    # the mirror itself: a Zen 4's flags pick zen4, the same plus AMX sapphirerapids, AVX2 only haswell
    zen4 = {"sse4_2", "avx", "f16c", "fma", "avx2", "bmi2", "avx512f", "avx512cd", "avx512vl", "avx512dq",
            "avx512bw", "avx512vbmi", "avx512_vnni", "avx512_bf16"}
    assert best_variant(zen4) == "zen4"
    assert best_variant(zen4 | {"amx_tile", "amx_int8"}) == "sapphirerapids"
    assert best_variant({"sse4_2", "avx", "f16c", "fma", "avx2", "bmi2"}) == "haswell"
    assert best_variant({"sse4_2", "avx", "f16c", "fma", "avx2", "bmi2", "avx_vnni"}) == "alderlake"


@pytest.fixture(scope="module")
def portable_bin(tmp_path_factory):
    if shutil.which("ninja") is None and shutil.which("make") is None:
        pytest.skip("no build tool")
    b = tmp_path_factory.mktemp("portable")
    cfg = ["cmake", "-S", str(REPO), "-B", str(b), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
           "-DDEEPSEEK_CPU_PORTABLE=ON", "-DDEEPSEEK_CPU_BUILD_SERVER=OFF", "-DDEEPSEEK_CPU_BUILD_TESTS=OFF"]
    r = subprocess.run(cfg, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    targets = ["llama", "ggml"] + [f"ggml-cpu-{v}" for v in VARIANTS]
    r = subprocess.run(["cmake", "--build", str(b), "--target", *targets, "-j", str(os.cpu_count() or 2)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return b / "bin"


def test_portable_build_selects_this_cpus_variant(portable_bin, converted):
    model = converted("v2_greedy", "f32")
    code = (
        "import llama_cpp\n"
        "llama_cpp.llama_backend_init()\n"
        f"llm = llama_cpp.Llama({str(model)!r}, n_ctx=64, verbose=False)\n"
        "llm.eval([1, 2, 3])\n"
        "maps = [l.split()[-1] for l in open('/proc/self/maps') if 'libggml-cpu' in l]\n"
        "print(sorted(set(p.rsplit('/', 1)[-1] for p in maps)))\n"
        "print(llama_cpp.llama_print_system_info().decode())\n"
    )
    r = run_python(code, env_extra={"LLAMA_CPP_LIB_PATH": str(portable_bin)}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded, sysinfo = r.stdout.strip().splitlines()[:2]
    assert loaded == str([f"libggml-cpu-{expected_variant()}.so"]), (loaded, sysinfo)
    assert "portable build" in sysinfo
