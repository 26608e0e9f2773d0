"""The plugin manager: built-ins first, then every `deepseek_cpu` entry point."""
from __future__ import annotations

import importlib
import os
from importlib import metadata

import pluggy

from . import hookspecs

ENTRY_POINT_GROUP = "deepseek_cpu"
# Built-in plugins, registered exactly like external ones.
DEFAULT_PLUGINS = (
    "deepseek_cpu.converters.deepseek",
    "deepseek_cpu.converters.deepseek_v4",
    "deepseek_cpu.quantization.builtin",
    "deepseek_cpu.runtime.prefetch",
    # the commands, one module per job (commands/)
    *(f"deepseek_cpu.commands.{name}" for name in (
        "info", "convert", "run", "chat", "serve", "rpc_worker", "experts", "pull", "quantize", "eval",
        "demo", "synth", "bench")),
)

pm = pluggy.PluginManager(hookspecs.PROJECT)
pm.add_hookspecs(hookspecs)

_loaded = False
# distribution (name, version) of plugins loaded by name through DEEPSEEK_CPU_LOAD_PLUGINS
# (pluggy records it only for the ones load_setuptools_entrypoints loads)
_named_dists: dict[str, tuple[str, str]] = {}


def load() -> pluggy.PluginManager:
    global _loaded
    if _loaded:
        return pm
    _loaded = True
    for name in DEFAULT_PLUGINS:
        mod = importlib.import_module(name)
        if not pm.is_registered(mod):
            pm.register(mod, name=name)
    # DEEPSEEK_CPU_LOAD_PLUGINS="" loads no external plugin; "a,b" only those.
    only = os.environ.get("DEEPSEEK_CPU_LOAD_PLUGINS")
    if only is None:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    else:
        wanted = {n.strip() for n in only.split(",") if n.strip()}
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in wanted and pm.get_plugin(ep.name) is None:
                pm.register(ep.load(), name=ep.name)
                if ep.dist is not None:
                    _named_dists[ep.name] = (ep.dist.metadata["name"], ep.dist.version)
    return pm


def describe() -> list[dict]:
    """Each loaded plugin: its name, the distribution and version that ship it, its hooks."""
    load()
    dists = {id(p): d for p, d in pm.list_plugin_distinfo()}
    rows = []
    for name, plugin in pm.list_name_plugin():
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        dist = dists.get(id(plugin))
        if dist is not None:
            project, version = dist.project_name, dist.version
        elif name in _named_dists:
            project, version = _named_dists[name]
        elif name in DEFAULT_PLUGINS:
            from . import __version__
            project, version = "deepseek-cpu (built-in)", __version__
        else:  # registered in-process with pm.register(), no distribution to name
            project, version = "(registered at run time)", ""
        rows.append({"name": name, "package": project, "version": version, "hooks": hooks})
    return rows
