"""The quantization-type registry (deepseek_cpu/quantization/types.py) and everything that reads it."""
import inspect

import click
import gguf
import pytest

from deepseek_cpu.quantization import types as qt
from deepseek_cpu.quantization.types import QUANT_TYPES

Q = gguf.GGMLQuantizationType


def _llama_cpp_name(name: str) -> str:
    """llama.cpp's own name for the file type called `name` (as llama-quantize spells it)."""
    return "LLAMA_FTYPE_" + ("ALL_F32" if name == "f32" else "MOSTLY_" + name.upper())


@pytest.mark.parametrize("name", list(QUANT_TYPES))
def test_file_types_are_llama_cpps(name):
    from deepseek_cpu.runtime import llama as _engine  # noqa: F401  (our libllama first)
    import llama_cpp.llama_cpp as ll
    t = QUANT_TYPES[name]
    assert t.name == name and name == name.lower()
    assert t.llama_ftype == _llama_cpp_name(name)
    # the constant llama.cpp's quantizer takes, and what general.file_type stores
    assert getattr(ll, t.llama_ftype) == int(t.file_type)
    assert t.file_type.name == t.ftype


@pytest.mark.parametrize("name", list(QUANT_TYPES))
def test_main_tensor_type_and_bits_per_weight(name):
    t = QUANT_TYPES[name]
    # the GGML type the file type is named after (K-quant mixes: _S/_M/_L are sizes of one type)
    base = name.upper()
    if base.endswith("_MOE"):  # mxfp4_moe: the routed experts' type (everything else q8_0)
        base = base[: -len("_MOE")]
    for suffix in ("_S", "_M", "_L"):
        if "_K" in base and base.endswith(suffix):
            base = base[: -len(suffix)]
    assert t.ggml_type == Q[base]
    block, type_size = gguf.GGML_QUANT_SIZES[t.ggml_type]
    bits = 8 * type_size / block
    if t.direct:  # every matrix in this type: the file is that many bits per weight
        assert t.bpw == bits
    else:  # llama-quantize's mixes give some tensors more bits, never fewer
        assert bits <= t.bpw < bits + 1


def test_direct_and_llama_quantized_split_the_names():
    assert qt.NAMES == tuple(QUANT_TYPES)
    assert qt.DIRECT == ("f32", "f16", "bf16", "q8_0")
    assert set(qt.DIRECT) | set(qt.LLAMA_QUANTIZED) == set(qt.NAMES)
    assert not set(qt.DIRECT) & set(qt.LLAMA_QUANTIZED)
    assert qt.NAMES[:len(qt.DIRECT)] == qt.DIRECT  # the CLI lists the converter's own first
    assert qt.DEFAULT_PULL in qt.LLAMA_QUANTIZED


def _param(command: str, option: str):
    from deepseek_cpu.cli import cli
    cmd = cli.get_command(click.Context(cli), command)
    return next(p for p in cmd.params if p.name == option)


def test_cli_choices_are_the_registrys():
    from deepseek_cpu.quantization import registry
    from deepseek_cpu.commands.options import SchemeName
    p = _param("convert", "outtype")
    assert tuple(p.type.choices) == qt.DIRECT
    # every scheme name (built-in types, DeepSeek mixes, plugins') is taken by every command
    # pull's default is the model's (hub.default_quant: DEFAULT_PULL, ds-v4 for V4), chosen after config.json
    for command, option, default in (("pull", "quant", None), ("convert", "quant", None),
                                     ("quantize", "scheme", "q4_k_m"), ("synth", "quant", "q4_0")):
        p = _param(command, option)
        assert isinstance(p.type, SchemeName) and p.default == default, command
    assert set(qt.NAMES) <= set(registry.schemes())


def test_converter_and_synth_read_the_registry():
    from deepseek_cpu.conversion import convert
    from deepseek_cpu.quantization import registry
    from deepseek_cpu.converters.base import OUTTYPES
    assert OUTTYPES == {n: QUANT_TYPES[n].ggml_type for n in qt.DIRECT}
    assert list(OUTTYPES) == list(qt.DIRECT)
    for n in qt.DIRECT:
        assert convert._file_type(n) == QUANT_TYPES[n].file_type
    for name, t in QUANT_TYPES.items():
        s = registry.get(name)
        assert (s.base, s.file_type, s.rules, s.direct) == (name, t.file_type, (), t.direct)


def test_pull_reads_the_registry():
    from deepseek_cpu import hub
    assert hub.QUANTS == qt.NAMES and hub.DIRECT == qt.DIRECT
    assert inspect.signature(hub.pull).parameters["quant"].default is None
    from deepseek_cpu.runtime.llama import Llama
    assert inspect.signature(Llama.from_hub).parameters["quant"].default is None
    from deepseek_cpu.hub.pipeline import default_quant
    assert default_quant({"model_type": "deepseek_v3"}) == qt.DEFAULT_PULL
    assert default_quant({"model_type": "deepseek_v4"}) == "ds-v4"
    cfg = {"torch_dtype": "bfloat16"}
    for name, t in QUANT_TYPES.items():
        need = hub.estimate_disk(2 * 10**9, 0, cfg, name)  # 1e9 bf16 parameters
        assert need["output"] == int(10**9 * t.bpw / 8)
        assert need["intermediate"] == (0 if t.direct else 2 * 10**9)
