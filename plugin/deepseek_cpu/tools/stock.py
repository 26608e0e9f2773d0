"""Stock llama.cpp: the pinned llama-cpp-python sdist built WITHOUT our patches, for
side-by-side comparisons (`deepseek-cpu bench --compare-stock`).

Built once into stock-<commit>/ under the cache root ($DEEPSEEK_CPU_CACHE, default
~/.cache/deepseek-cpu; see cache.py) with the same CMake flags as our engine (Release,
shared libraries, GGML_NATIVE, OpenMP, CPU backend only): the only difference is the patch
series. On a CPU with AMX it is built for the CPU's extensions without AMX
(stock-<commit>-noamx): see cmake_flags(). A process selects it with
LLAMA_CPP_LIB_PATH=<that dir>/lib (the drop-in respects a path the caller set).

    python -m deepseek_cpu.tools.stock            # build (if needed) and print the lib dir
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..cache import cache_root
from ..runtime.engine import cpu_flags
from ..errors import DeepseekCpuError

class StockBuildError(DeepseekCpuError, RuntimeError):
    """The stock llama.cpp could not be prepared or built; the message says where it failed."""


def _prepare_module():
    """vendor/prepare.py, which the wheel ships as deepseek_cpu/vendor (a namespace portion:
    the build runs the same file as a script, before the package exists)."""
    try:
        from ..vendor import prepare
    except ImportError as e:
        # a source checkout on PYTHONPATH (plugin/) has no vendor/: that lives at the repository root
        raise StockBuildError(f"deepseek_cpu.vendor.prepare is not available ({e}); build stock llama.cpp "
                              "from an installed deepseek-cpu (not a source checkout on PYTHONPATH), "
                              "or give `bench` a --stock-lib") from None
    return prepare


def pin() -> dict:
    import tomllib
    prep = _prepare_module()
    return tomllib.loads((Path(prep.__file__).parent / "pin.toml").read_text())["sdist"]


def stock_dir(commit: str | None = None) -> Path:
    suffix = "-noamx" if cpu_has_amx() else ""
    return cache_root() / f"stock-{commit or pin()['llama_cpp_commit']}{suffix}"


def stock_lib_dir(commit: str | None = None) -> Path | None:
    """The lib dir of a finished stock build, or None."""
    d = stock_dir(commit)
    if (d / "stock.json").is_file() and (d / "lib" / "libllama.so").is_file():
        return d / "lib"
    return None


# the same switches as our CMakeLists.txt (native flavour), minus everything we do not need
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_NATIVE=ON",
    "-DGGML_OPENMP=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_COMMON=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    # one unversioned file per library, found through $ORIGIN (as in our wheel)
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
    "-DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON",
]
TARGETS = ["llama", "ggml", "ggml-base", "ggml-cpu"]

# On a CPU with AMX, -march=native compiles llama.cpp's AMX buffer type, and at this commit the
# stock library then aborts on any DeepSeek-V2 model (the scheduler cannot place MLA's attn_k_b
# product) and, past that, crashes in ldtilecfg (llama.cpp #20824); our fixes/ggml-cpu-no-amx-extra-buffer.patch drops that buffer.
# A comparison needs a stock library that runs, so there it is built for the same instruction set
# extensions named one by one (GGML_NATIVE=OFF), without AMX: /proc/cpuinfo flag -> ggml switch.
X86_SWITCHES = [
    ("sse4_2", "GGML_SSE42"), ("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("bmi2", "GGML_BMI2"),
    ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"), ("avx_vnni", "GGML_AVX_VNNI"),
    ("avx512f", "GGML_AVX512"), ("avx512vbmi", "GGML_AVX512_VBMI"), ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
]


def cpu_has_amx() -> bool:
    return "amx_int8" in cpu_flags()


def cmake_flags() -> list[str]:
    """CMAKE_FLAGS, or on an AMX CPU the same build for this CPU's extensions minus AMX."""
    if not cpu_has_amx():
        return list(CMAKE_FLAGS)
    have = cpu_flags()
    flags = [f for f in CMAKE_FLAGS if f != "-DGGML_NATIVE=ON"] + ["-DGGML_NATIVE=OFF"]
    flags += [f"-D{switch}={'ON' if flag in have else 'OFF'}" for flag, switch in X86_SWITCHES]
    return flags + ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]


def _log(msg: str) -> None:
    print(f"deepseek-cpu: {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], log: Path, what: str, progress: bool) -> None:
    with open(log, "a") as lf:
        lf.write("$ " + " ".join(cmd) + "\n")
        lf.flush()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        tail: list[str] = []
        last = 0.0
        for line in p.stdout:
            lf.write(line)
            tail = (tail + [line])[-40:]
            # ninja prints "[n/m] ..." per step: show it at most every 2 s
            if progress and line.startswith("[") and time.time() - last > 2:
                last = time.time()
                _log(f"{what} {line.split(']')[0]}]")
        rc = p.wait()
    if rc != 0:
        raise StockBuildError(f"{what} failed (exit {rc}); full log in {log}:\n{''.join(tail)}")


@contextlib.contextmanager
def _lock(path: Path):
    import fcntl
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_stock_build(progress: bool = True, jobs: int | None = None) -> Path:
    """Build stock llama.cpp once (a few minutes) and return its lib dir."""
    prep = _prepare_module()
    p = pin()
    commit = p["llama_cpp_commit"]
    found = stock_lib_dir(commit)
    if found:
        return found
    d = stock_dir(commit)
    with _lock(cache_root() / f".stock-{commit}.lock"):
        found = stock_lib_dir(commit)  # another process may have built it meanwhile
        if found:
            return found
        t0 = time.time()
        d.mkdir(parents=True, exist_ok=True)
        log = d / "build.log"
        log.write_text("")
        src, build, lib = d / "src", d / "build", d / "lib"
        if progress:
            _log(f"building stock llama.cpp {commit[:8]} (llama-cpp-python {p['version']}, no patches) "
                 f"into {d}; once only, takes a few minutes")
        try:
            prep.prepare(src, None)
        except prep.PrepareError as e:
            raise StockBuildError(str(e)) from None
        cmake = shutil.which("cmake") or "cmake"
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        flags, amx = cmake_flags(), cpu_has_amx()
        if progress and amx:
            _log("this CPU has AMX: stock is built without it (its AMX path crashes at this commit)")
        _run([cmake, "-S", str(src), "-B", str(build), *gen, *flags], log, "stock: cmake configure", progress)
        jobs = jobs or os.cpu_count() or 1
        _run([cmake, "--build", str(build), "--target", *TARGETS, "-j", str(jobs)], log, "stock: build", progress)
        tmp = d / "lib.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for so in (build / "bin").glob("*.so"):
            shutil.copy2(so, tmp / so.name)
        if not (tmp / "libllama.so").is_file():
            raise StockBuildError(f"the stock build produced no libllama.so in {build / 'bin'} (log: {log})")
        shutil.rmtree(lib, ignore_errors=True)
        os.replace(tmp, lib)
        info = {"commit": commit, "version": p["version"], "patches": [], "cmake_flags": flags,
                "variant": "no AMX (GGML_NATIVE=OFF, this CPU's other extensions)" if amx else "native",
                "built_in_s": round(time.time() - t0, 1)}
        (lib / "deepseek-cpu-source.json").write_text(json.dumps({k: info[k] for k in ("commit", "version", "patches")}))
        (d / "stock.json").write_text(json.dumps(info, indent=2))
        # the object files are not needed any more; the source tree is small, keep it for reading
        shutil.rmtree(build, ignore_errors=True)
        if progress:
            _log(f"stock llama.cpp built in {time.time() - t0:.0f} s: {lib}")
        return lib


if __name__ == "__main__":
    try:
        print(ensure_stock_build())
    except StockBuildError as e:
        print(f"deepseek-cpu: error: {e}", file=sys.stderr)
        sys.exit(1)
