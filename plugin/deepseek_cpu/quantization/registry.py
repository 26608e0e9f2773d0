"""Every quantization scheme, from the `deepseek_cpu_quant_schemes` hook: the built-ins
(quantization/builtin.py, registered like any plugin) and those of installed plugins.

`pull --quant`, `convert --quant`, `quantize --scheme`, `synth --quant` and `schemes` all
read this one registry.
"""
from __future__ import annotations

from ..errors import DeepseekCpuError
from .schemes import Scheme


class UnknownScheme(DeepseekCpuError, KeyError):
    """A scheme name nobody registered; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class SchemeConflict(DeepseekCpuError, ValueError):
    """Two plugins registered the same scheme name, or a plugin returned something else."""


def schemes() -> dict[str, Scheme]:
    """name -> Scheme, built-ins first, then plugins in registration order."""
    from ..plugins import load
    pm = load()
    out: dict[str, Scheme] = {}
    for impl in pm.hook.deepseek_cpu_quant_schemes.get_hookimpls():  # in registration order
        for s in impl.function() or ():
            if not isinstance(s, Scheme):
                raise SchemeConflict(f"plugin {impl.plugin_name} returned {s!r} from "
                                     "deepseek_cpu_quant_schemes; expected deepseek_cpu.Scheme objects")
            if s.name in out:
                raise SchemeConflict(f"scheme {s.name!r} is registered by both {out[s.name].plugin} "
                                     f"and {impl.plugin_name}")
            object.__setattr__(s, "plugin", impl.plugin_name)
            out[s.name] = s
    return out


def get(name: str) -> Scheme:
    known = schemes()
    key = name.lower()
    if key not in known:
        raise UnknownScheme(f"unknown quantization scheme {name!r}; known schemes: {', '.join(known)} "
                            "(`deepseek-cpu schemes` describes them)")
    return known[key]

