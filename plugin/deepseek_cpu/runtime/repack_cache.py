"""The repack cache: the engine's repacked weights written to disk at a model's first load and mapped
from there at later loads (src/dsc/repack-cache.cpp reads DEEPSEEK_CPU_REPACK_CACHE, a directory).

A load that repacks copies every 4-bit weight into freshly zeroed memory and rearranges it; a load
that maps the cache costs what a mapped load costs (the weights are page cache, read once from disk
when cold). The price is disk: one more file the size of the model's repacked weights, per model,
per engine build and CPU kind. The engine checks each file against the model (size, modification
time, header, samples of every repacked weight) and itself (build, CPU features) before using it, and
writes it again when anything differs.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "DEEPSEEK_CPU_REPACK_CACHE"


def default_dir() -> Path:
    """<cache root>/repack (cache.py)."""
    from ..cache import cache_root
    return cache_root() / "repack"


def directory(value) -> str | None:
    """What DEEPSEEK_CPU_REPACK_CACHE should be for `value`: True or "" the default directory, a path
    that directory, False "0" (off); None: leave the environment as it is."""
    if value is None:
        return None
    if value is False:
        return "0"
    if value is True or value == "":
        return str(default_dir())
    if isinstance(value, (str, os.PathLike)):
        return os.path.expanduser(os.fspath(value))
    raise ValueError(f"repack_cache must be True, False or a directory, not {value!r}")
