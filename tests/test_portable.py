"""Portable builds: every x86 CPU variant built, the best one for this CPU chosen at run time,
reached from a plain `import llama_cpp` (patch 0004; llama-cpp-python#2069).

Builds our CMake project with DEEPSEEK_CPU_PORTABLE=ON but only a few variants (time), then
checks which libggml-cpu-*.so a fresh interpreter maps.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_python

pytestmark = pytest.mark.slow

# variant -> /proc/cpuinfo flags it needs (a subset of ggml's own table, enough to rank these)
VARIANTS = {
    "x64": [],
    "haswell": ["avx2", "fma", "f16c", "bmi2"],
    "skylakex": ["avx2", "fma", "f16c", "bmi2", "avx512f"],
    "zen4": ["avx2", "fma", "f16c", "bmi2", "avx512f", "avx512vbmi", "avx512_vnni", "avx512_bf16"],
}


def expected_variant() -> str:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    best = "x64"
    for name, need in VARIANTS.items():  # ordered from least to most capable
        if all(f in flags for f in need):
            best = name
    return best


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
