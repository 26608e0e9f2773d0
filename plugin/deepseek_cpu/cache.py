"""Where deepseek-cpu keeps what it downloads and builds: one root for every cache.

    $DEEPSEEK_CPU_CACHE, else $XDG_CACHE_HOME/deepseek-cpu, else ~/.cache/deepseek-cpu

Under it: gguf/ (`pull`'s converted models, hub.gguf_cache_dir), stock-<commit>/ (stock
llama.cpp for `bench --compare-stock`, tools/stock.py), tokenizers/ (`synth`'s downloaded
tokenizer) and sdist/ (the llama.cpp source the build fetches; vendor/prepare.py runs
before the package exists and keeps its own copy of this rule).
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "DEEPSEEK_CPU_CACHE"


def cache_root() -> Path:
    """The cache root, read from the environment at each call."""
    if os.environ.get(ENV):
        return Path(os.path.expanduser(os.environ[ENV]))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "deepseek-cpu"
