"""Point llama-cpp-python at the patched engine, before anything imports it.

Run at interpreter start-up by `deepseek_cpu_dropin.pth` in site-packages, so a plain
`import llama_cpp` (LangChain, llama_cpp.server, user scripts) loads our libraries
without importing deepseek_cpu first. It must stay cheap and must never raise: it runs
in every Python process of the environment. Only the standard library is imported.

Opt out with DEEPSEEK_CPU_DISABLE=1. A LLAMA_CPP_LIB_PATH the user set is respected.
"""
import os

LIB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
ENV_DISABLE = "DEEPSEEK_CPU_DISABLE"
ENV_LIB = "LLAMA_CPP_LIB_PATH"


def disabled() -> bool:
    return os.environ.get(ENV_DISABLE, "").strip().lower() in ("1", "true", "yes", "on")


def find_lib_dir() -> str | None:
    """Our lib/ beside this file; from a source checkout on PYTHONPATH, the installed one."""
    import sys
    for d in [LIB_DIR] + [os.path.join(p, "deepseek_cpu", "lib") for p in sys.path if p]:
        if os.path.exists(os.path.join(d, "libllama.so")):
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
