"""What engine this process runs: our library directory, the loaded libllama, its marker."""
from __future__ import annotations

import ctypes
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import _dropin
from ..errors import DeepseekCpuError
from .process_maps import mappings

PACKAGE_LIB_DIR = Path(_dropin.LIB_DIR)


class EngineNotPatched(DeepseekCpuError, RuntimeError):
    """The libllama that llama_cpp loaded is not deepseek-cpu's build."""


class EngineNotFound(DeepseekCpuError, FileNotFoundError):
    """No directory holds deepseek-cpu's engine (libllama.so)."""


def lib_dir() -> Path:
    """The directory llama_cpp loads from: ours, unless LLAMA_CPP_LIB_PATH says otherwise
    (also how a source checkout on PYTHONPATH finds the installed engine). The rule is
    _dropin.find_lib_dir's; where nothing holds a libllama.so, its first candidate."""
    return Path(_dropin.find_lib_dir() or _dropin.lib_dir_candidates()[0])


def tests_dir() -> Path:
    """llama.cpp's test programs shipped with the engine (deepseek_cpu/llama-tests), by the same rule."""
    return Path(os.path.normpath(os.path.join(_dropin.find_lib_dir(name=_dropin.TESTS) or str(lib_dir()),
                                              _dropin.TESTS)))


def llama_lib() -> ctypes.CDLL:
    """The libllama handle held by llama_cpp (importing it loads the library)."""
    _dropin.activate()
    import llama_cpp.llama_cpp as lc
    return lc._lib


def build_info(lib: ctypes.CDLL | None = None) -> str | None:
    """The marker string of the patched engine, or None for any other libllama."""
    lib = lib if lib is not None else llama_lib()
    try:
        fn = lib.deepseek_cpu_build_info
    except AttributeError:
        return None
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    return fn().decode()


def mapped_libllama() -> str | None:
    """The libllama file the dynamic loader mapped into this process."""
    for m in mappings():
        if m.path.endswith("/libllama.so") or "/libllama.so." in m.path:
            return os.path.realpath(m.path)
    return None


def mapped_cpu_backends() -> list[str]:
    """The CPU backend libraries (libggml-cpu*.so) mapped into this process."""
    found = []
    for m in mappings():
        name = os.path.basename(m.path)
        if name.startswith("libggml-cpu") and ".so" in name and m.path not in found:
            found.append(m.path)
    return found


def backend_function(name: str):
    """The C function `name` of our CPU backend loaded in this process (the kernels' own entry
    points: expert usage, read-ahead), or None where no loaded backend has it. The library is
    already mapped: CDLL gives the same copy, with the same state."""
    for path in mapped_cpu_backends():
        try:
            return getattr(ctypes.CDLL(path), name)
        except AttributeError:
            continue
    return None


def amx_status() -> str:
    """Whether the loaded engine multiplies prompts on AMX tiles: "on", or why not (the CPU
    variant was built without AMX, the CPU or the kernel lacks it, DEEPSEEK_CPU_AMX=0)."""
    llama_lib()
    import llama_cpp
    llama_cpp.llama_backend_init()  # maps the CPU backend
    for path in mapped_cpu_backends():
        try:
            fn = ctypes.CDLL(path).ggml_dsc_amx_status  # already mapped: the same copy
        except AttributeError:
            continue
        fn.restype, fn.argtypes = ctypes.c_char_p, []
        return fn().decode()
    return "unknown (no deepseek-cpu CPU backend is loaded)"


def loaded_library_path(lib: ctypes.CDLL | None = None) -> str:
    """The file the dynamic loader actually mapped for libllama."""
    lib = lib if lib is not None else llama_lib()
    return mapped_libllama() or lib._name


def system_info() -> str:
    import llama_cpp
    return llama_cpp.llama_print_system_info().decode()


def _cpuinfo(field: str) -> str:
    """The first CPU's /proc/cpuinfo `field` ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":", 1)[0].strip() == field:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_flags() -> set[str]:
    """The first CPU's /proc/cpuinfo flags (empty where there is none)."""
    return set(_cpuinfo("flags").split())


def cpu_model() -> str:
    """The CPU's name, as /proc/cpuinfo gives it ("" where it does not)."""
    return _cpuinfo("model name")


def cpu_features() -> list[str]:
    flags = cpu_flags()
    wanted = ["avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "avx512vbmi", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"]
    return [w for w in wanted if w in flags]


def source_info() -> dict:
    p = lib_dir() / "deepseek-cpu-source.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class EngineInfo:
    version: str
    llama_cpp_commit: str
    patches: list[str]
    series_sha256: str  # names the exact changes to llama.cpp (deepseek-cpu-source.json); "unknown" if unread
    library: str
    patched: bool
    build_info: str | None
    cpu_features: list[str]
    cpu_backend: str
    system_info: str
    amx: str  # amx_status()
    extra: dict = field(default_factory=dict)


def cpu_backend_name(sysinfo: str) -> str:
    """The CPU variant that ggml selected, as reported in system info (e.g. 'CPU : AVX512 = 1 ...')."""
    parts = [p.strip() for p in sysinfo.split("|")]
    feats = [p.split("=")[0].strip() for p in parts if p.endswith("= 1")]
    return " ".join(f for f in feats if f.startswith(("AVX", "AMX", "SSE", "F16C", "FMA", "BMI"))) or "unknown"


def engine_info() -> EngineInfo:
    from .. import __version__
    lib = llama_lib()
    marker = build_info(lib)
    src = source_info()
    sysinfo = system_info()
    return EngineInfo(
        version=__version__,
        llama_cpp_commit=src.get("commit", "unknown"),
        patches=src.get("patches", []),
        series_sha256=src.get("series_sha256", "unknown"),
        library=loaded_library_path(lib),
        patched=marker is not None,
        build_info=marker,
        cpu_features=cpu_features(),
        cpu_backend=cpu_backend_name(sysinfo),
        system_info=sysinfo,
        amx=amx_status(),
    )


def require_patched() -> str:
    marker = build_info()
    if marker is None:
        raise EngineNotPatched(
            f"llama_cpp loaded {loaded_library_path()}, which is not deepseek-cpu's engine. "
            f"Unset {_dropin.ENV_LIB} / {_dropin.ENV_DISABLE} or reinstall deepseek-cpu.")
    return marker
