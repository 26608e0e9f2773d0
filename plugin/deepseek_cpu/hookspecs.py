"""The extension points of deepseek-cpu.

A plugin is a module or object with functions marked `@deepseek_cpu.hookimpl`, made
known through the `deepseek_cpu` entry-point group of its distribution:

    [project.entry-points.deepseek_cpu]
    my_arch = "my_package.plugin"

The built-in features register through the same hooks, listed in
deepseek_cpu.plugins.DEFAULT_PLUGINS: the DeepSeek converter (converters/deepseek.py), the
quantization schemes (quantization/builtin.py), the prefetch policies (runtime/prefetch.py) and
every command, one module per job under commands/ (info, plugins, convert, run, chat, serve,
rpc-worker, experts, pull, schemes, quantize, imatrix, eval, demo, synth, bench).
docs/plugins.md has a runnable example for each hook.
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

    `config` is the checkpoint's config.json. The first non-None answer wins. What
    `deepseek_cpu.convert` uses of a converter (converters/deepseek.py is the built-in one):
      arch                      the GGUF architecture name (str), e.g. "deepseek2"
      write_metadata(writer)    add the model's GGUF keys to a gguf.GGUFWriter
      plan(checkpoint, outtype) -> list[converters.base.TensorPlan]: every output tensor's
                                name, shape, type and a function producing its float32 data
    The tokenizer is written by the framework (converters/tokenizer.py), not by the converter."""


@hookspec
def deepseek_cpu_supported_architectures() -> list[str]:
    """Names of the `config.json` architectures this plugin converts (for error messages
    and `deepseek-cpu plugins`)."""


@hookspec
def deepseek_cpu_tensor_transforms(converter: Any) -> list[Callable[[str, "np.ndarray"], "np.ndarray"]]:
    """Per-tensor transforms applied, in plugin order, to every output tensor of a
    conversion, as `fn(gguf_name, array) -> array` (same shape). Return [] or None to add none."""


@hookspec
def deepseek_cpu_quant_schemes() -> list[Any]:
    """Quantization schemes this plugin provides: a list of `deepseek_cpu.Scheme`.

    A scheme is a name, a description, a base file type (one of quantization/types.py:
    its general.file_type, default type and llama.cpp's own per-tensor recipe), rules
    `(regular expression searched in the GGUF tensor name, GGML type)` that override the
    recipe (first match wins; llama.cpp's `--tensor-type`), and whether it wants an importance
    matrix. Every command that takes a quantization (`quantize --scheme`, `convert --quant`,
    `pull --quant`, `synth --quant`) accepts every registered name; `deepseek-cpu schemes`
    lists them with bits per weight. The built-ins (llama.cpp's types and the DeepSeek mixes)
    come through this hook too (quantization/builtin.py). Two plugins giving one name is an error."""


@hookspec
def deepseek_cpu_prefetch_policies() -> dict[str, Any]:
    """Prefetch policies this plugin provides, by name: objects with
      plan(model, counts, budget) -> deepseek_cpu.runtime.prefetch.Placement
    `model` is a prefetch.ModelLayout (each tensor's offset and size in the GGUF; a stacked
    routed-expert tensor's `expert_slice(e)`), `counts` the expert-usage statistics saved for this
    model ({layer: routings per expert}) or None, `budget` a memory_budget.BudgetPlan. The
    Placement's `hot` ranges are locked in memory, its `warm` ranges read ahead in order.
    Used under a memory budget (`Llama(mem_budget=..., prefetch=NAME)`, `--prefetch NAME`); the
    built-ins are `popular` (the default) and `none` (runtime/prefetch.py). A policy that raises
    is reported and `popular` is used instead."""


@hookspec
def deepseek_cpu_register_commands(cli: Any) -> None:
    """Add click commands to the `deepseek-cpu` command group (`cli.add_command(...)`), as every
    built-in command module does (commands/)."""
