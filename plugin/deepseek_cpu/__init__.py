"""deepseek-cpu: the DeepSeek-V2 family on CPUs, correct and fast.

`from deepseek_cpu import Llama` gives llama_cpp.Llama with DeepSeek-friendly CPU
defaults; `deepseek_cpu.convert(...)` turns a Hugging Face checkpoint into a GGUF.
Attributes are loaded lazily so that `import deepseek_cpu` stays cheap.
"""
from __future__ import annotations

__all__ = ["Llama", "convert", "engine_info", "__version__"]


def _version() -> str:
    from importlib import metadata
    try:
        return metadata.version("deepseek-cpu")
    except metadata.PackageNotFoundError:  # running from a source checkout
        return "0.0.0+src"


def __getattr__(name: str):
    # lazily, __version__ included: the .pth drop-in imports this package in every Python
    # process of the environment, and importlib.metadata alone costs tens of milliseconds
    if name == "__version__":
        globals()["__version__"] = v = _version()
        return v
    if name == "Llama":
        from .runtime.llama import Llama
        return Llama
    if name == "convert":
        from .conversion.convert import convert
        return convert
    if name == "engine_info":
        from .runtime.engine import engine_info
        return engine_info
    raise AttributeError(name)
