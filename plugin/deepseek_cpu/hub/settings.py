"""The Hugging Face settings a pull uses: endpoint, cache directory, offline mode.

huggingface_hub reads HF_ENDPOINT, HF_HUB_CACHE / HF_HOME and HF_HUB_OFFLINE once, when it is
imported; these read the environment again at each call, so a value set later in the
process (by a test, a notebook, a parent program) still counts. huggingface_hub's own
constants are the fallback.
"""
from __future__ import annotations

import os
from pathlib import Path


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def hf_endpoint() -> str:
    from huggingface_hub import constants
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expanduser(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expanduser(os.environ["HF_HOME"])) / "hub"
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def hf_offline() -> bool:
    from huggingface_hub import constants
    return _truthy(os.environ.get("HF_HUB_OFFLINE")) or bool(constants.HF_HUB_OFFLINE)
