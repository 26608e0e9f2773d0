"""Point llama-cpp-python at the patched engine, before anything imports it.

Run at interpreter start-up by `deepseek_cpu_dropin.pth` in site-packages, so a plain
`import llama_cpp` (LangChain, llama_cpp.server, user scripts) loads our libraries
without importing deepseek_cpu first. It must stay cheap and must never raise: it runs
in every Python process of the environment. Only the standard library is imported.

Opt out with DEEPSEEK_CPU_DISABLE=1. A LLAMA_CPP_LIB_PATH the user set is respected.

This module also owns the one rule for where deepseek-cpu's engine is (find_lib_dir):
engine.lib_dir(), bench's --ours-lib, serve's llama-server and the llama-tests programs
all ask it, so the rule is written once, here, where start-up can use it too.
"""
import os

LIB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
ENV_DISABLE = "DEEPSEEK_CPU_DISABLE"
ENV_LIB = "LLAMA_CPP_LIB_PATH"
LIBLLAMA = "libllama.so"
TESTS = os.path.join(os.pardir, "llama-tests")  # llama.cpp's test programs, beside lib/


def disabled() -> bool:
    return os.environ.get(ENV_DISABLE, "").strip().lower() in ("1", "true", "yes", "on")


def lib_dir_candidates(explicit: str | None = None) -> list[str]:
    """Where deepseek-cpu's engine may be, best first: `explicit` (e.g. bench's --ours-lib),
    $LLAMA_CPP_LIB_PATH, this package's lib/, then deepseek_cpu/lib under each sys.path entry
    (a source checkout on PYTHONPATH has no lib/: it uses the installed package's engine)."""
    import sys
    cands = [explicit, os.environ.get(ENV_LIB), LIB_DIR]
    cands += [os.path.join(p, "deepseek_cpu", "lib") for p in sys.path if p]
    return list(dict.fromkeys(c for c in cands if c))


def find_lib_dir(explicit: str | None = None, name: str = LIBLLAMA) -> str | None:
    """The engine's library directory: the first of lib_dir_candidates(explicit) that holds
    `name` (a path relative to it: libllama.so, llama-server, TESTS), or None."""
    for d in lib_dir_candidates(explicit):
        if os.path.exists(os.path.join(d, name)):
            return d
    return None


def activate() -> None:
    try:
        if disabled() or ENV_LIB in os.environ:
            return
        lib = find_lib_dir()
        if lib is not None:
            os.environ[ENV_LIB] = lib
            # mtmd is loaded from its own variable; point it here only when we ship it
            if os.path.exists(os.path.join(lib, "libmtmd.so")):
                os.environ.setdefault("MTMD_CPP_LIB", lib)
    except Exception:  # pragma: no cover - never break interpreter start-up
        pass
