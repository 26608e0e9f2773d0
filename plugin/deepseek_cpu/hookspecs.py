"""The extension points of deepseek-cpu.

A plugin is a module or object with functions marked `@deepseek_cpu.hookimpl`, made
known through the `deepseek_cpu` entry-point group of its distribution:

    [project.entry-points.deepseek_cpu]
    my_arch = "my_package.plugin"

Built-in features (the DeepSeek converters, quantization schemes, prefetch policies)
are registered through the same hooks.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    import numpy as np

PROJECT = "deepseek_cpu"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def deepseek_cpu_converter(config: dict, model_dir: "Path") -> Any:
    """Return a converter for this checkpoint, or None if the plugin does not handle it.

    `config` is the checkpoint's config.json. The first non-None answer wins. A converter
    is an object with `describe()`, `architectures` and the methods used by
    `deepseek_cpu.convert` (see converters/base.py)."""


@hookspec
def deepseek_cpu_supported_architectures() -> list[str]:
    """Names of the `config.json` architectures this plugin converts (for error messages
    and `deepseek-cpu plugins`)."""


@hookspec
def deepseek_cpu_tensor_transforms(converter: Any) -> list[Callable[[str, "np.ndarray"], "np.ndarray"]]:
    """Per-tensor transforms applied, in plugin order, to every output tensor of a
    conversion, as `fn(gguf_name, array) -> array` (same shape). Return [] or None to add none."""


@hookspec
def deepseek_cpu_quant_schemes() -> dict[str, Any]:
    """Quantization schemes this plugin provides, by name.

    The built-in types (f32 ... q8_0 written by the converter, llama.cpp's q4_0 ... iq4_xs)
    are not registered through this hook: they live in one table, deepseek_cpu/quantization/types.py,
    which the CLI choices, the converter, `pull` and `synth` read."""


@hookspec
def deepseek_cpu_prefetch_policies() -> dict[str, Any]:
    """Cold/hot weight prefetch policies this plugin provides, by name."""


@hookspec
def deepseek_cpu_register_commands(cli: Any) -> None:
    """Add click commands to the `deepseek-cpu` command group."""
