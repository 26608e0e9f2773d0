"""Portable builds: every x86 CPU variant built, the best one for this CPU chosen at run time,
reached from a plain `import llama_cpp` (fixes/ggml-find-backends-next-to-libggml.patch; llama-cpp-python#2069).

Builds our CMake project with DEEPSEEK_CPU_PORTABLE=ON (the libraries only), then checks which
libggml-cpu-*.so a fresh interpreter maps. "Best" is ggml's own verdict: every variant library
exports ggml_backend_score() (ggml-cpu/arch/x86/cpu-feats.cpp, run on this CPU: 0 if it lacks
one of the variant's features, else more for more features), and ggml's loader is to map the
highest-scoring variant it finds.
"""
import json
import os
import shutil
import subprocess

import pytest

from conftest import REPO, run_python
from deepseek_cpu.runtime.engine import cpu_flags

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def portable_bin(tmp_path_factory):
    if shutil.which("ninja") is None:
        pytest.skip("no ninja")
    b = tmp_path_factory.mktemp("portable")
    cfg = ["cmake", "-S", str(REPO), "-B", str(b), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
           "-DDEEPSEEK_CPU_PORTABLE=ON", "-DDEEPSEEK_CPU_BUILD_SERVER=OFF", "-DDEEPSEEK_CPU_BUILD_TESTS=OFF"]
    r = subprocess.run(cfg, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # the default target: what a portable wheel ships (libllama, libggml and every variant we list)
    r = subprocess.run(["cmake", "--build", str(b), "-j", str(os.cpu_count() or 2)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return b / "bin"


def ggml_scores(bin_dir) -> dict[str, int]:
    """Each built variant's score on this CPU, from the library itself (as ggml's loader asks it)."""
    code = ("import ctypes, glob, json, os\n"
            f"paths = sorted(glob.glob(os.path.join({str(bin_dir)!r}, 'libggml-cpu-*.so')))\n"
            "print(json.dumps({os.path.basename(p): ctypes.CDLL(p).ggml_backend_score() for p in paths}))\n")
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_portable_build_selects_this_cpus_variant(portable_bin, converted):
    scores = ggml_scores(portable_bin)
    assert len(scores) > 1 and max(scores.values()) > 0, scores
    model = converted("v2_greedy", "f32")
    code = (
        "import llama_cpp\n"
        "llama_cpp.llama_backend_init()\n"
        f"llm = llama_cpp.Llama({str(model)!r}, n_ctx=64, verbose=False)\n"
        "llm.eval([1, 2, 3])\n"
        "maps = [l.split()[-1] for l in open('/proc/self/maps') if 'libggml-cpu' in l]\n"
        "import json; print(json.dumps(sorted(set(p.rsplit('/', 1)[-1] for p in maps))))\n"
        "print(llama_cpp.llama_print_system_info().decode())\n"
    )
    r = run_python(code, env_extra={"LLAMA_CPP_LIB_PATH": str(portable_bin)}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded, sysinfo = r.stdout.strip().splitlines()[:2]
    loaded = json.loads(loaded)
    assert len(loaded) == 1 and scores[loaded[0]] == max(scores.values()), (loaded, scores)
    # the scores do tell CPUs apart: with AVX2 here, the choice beats the plain x86-64 variant
    if "avx2" in cpu_flags():
        assert scores[loaded[0]] > scores["libggml-cpu-x64.so"], scores
    assert "portable build" in sysinfo
