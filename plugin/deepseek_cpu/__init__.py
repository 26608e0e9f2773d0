"""deepseek-cpu: the DeepSeek-V2 family on CPUs, correct and fast.

`from deepseek_cpu import Llama` gives llama_cpp.Llama with DeepSeek-friendly CPU
defaults; `deepseek_cpu.convert(...)` turns a Hugging Face checkpoint into a GGUF,
`deepseek_cpu.quantize(...)` quantizes one by a scheme (`deepseek_cpu.Scheme`).
Attributes are loaded lazily so that `import deepseek_cpu` stays cheap.

The package, one folder per concern, each importing only the ones above it in this list
(tests/test_house.py checks it):
    errors, atomic, cache, gguf_header, hookspecs, plugins, _dropin   the foundations
    converters/    the built-in DeepSeek converter (a plugin; top-level converters/ in the repo)
    quantization/  types, schemes (a registry fed by the hook), quantize, imatrix, evaluate
    conversion/    a Hugging Face checkpoint to a GGUF through the converter plugins
    runtime/       the engine, the drop-in Llama, resources, memory budgets, RPC, llama-server
    hub/           from a hub repo to a ready GGUF: download, convert, quantize, cache
    tools/         bench, synth, the stock llama.cpp build, demo
    commands/      the `deepseek-cpu` commands, each a built-in plugin (the only click users
                   besides cli.py, the command group)
    data/          the demo model
"""
from __future__ import annotations

__all__ = ["Llama", "convert", "quantize", "Scheme", "engine_info", "__version__"]


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
    if name == "quantize":
        from .quantization.quantize import quantize
        return quantize
    if name == "Scheme":
        from .quantization.schemes import Scheme
        return Scheme
    if name == "engine_info":
        from .runtime.engine import engine_info
        return engine_info
    raise AttributeError(name)
