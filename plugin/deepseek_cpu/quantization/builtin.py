"""The built-in quantization schemes, registered through the hook like a plugin's:
llama.cpp's file types and the DeepSeek mixes (quantization/schemes.py)."""
from __future__ import annotations

from ..hookspecs import hookimpl
from .schemes import DEEPSEEK_MIXES, llama_cpp_schemes


@hookimpl
def deepseek_cpu_quant_schemes():
    return [*llama_cpp_schemes(), *DEEPSEEK_MIXES]
