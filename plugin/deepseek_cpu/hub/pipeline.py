"""`pull()`: a hub repo to a ready GGUF, the steps in order (see the package docstring).

Each step lives in its own module; this one only decides the order and what a cached
result skips: settings -> client.resolve -> gguf_cache (reuse?) -> client pre-flight,
conversion.check_architecture, disk_plan -> client.download -> conversion -> record.
"""
from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ..quantization import registry
from ..quantization import types as quant_types
from . import gguf_cache
from .client import HubClient, progress_bars, remove_snapshot
from .conversion import check_architecture, check_scheme, convert_snapshot
from .disk_plan import check_disk
from .errors import PullError
from .settings import hf_cache_dir, hf_endpoint, hf_offline

log = logging.getLogger("deepseek_cpu.hub")  # the pull's one logger (see gguf_cache.py)


@dataclass
class PullResult:
    path: Path
    repo: str
    sha: str
    quant: str
    cached: bool


# what a pull makes when no --quant is given, by config.json's model_type (else DEFAULT_PULL):
# DeepSeek-V4 ships its routed experts in 4 bits already, which ds-v4 keeps bit for bit
DEFAULT_PULL_BY_MODEL = {"deepseek_v4": "ds-v4"}


def default_quant(config: dict) -> str:
    return DEFAULT_PULL_BY_MODEL.get(config.get("model_type"), quant_types.DEFAULT_PULL)


def pull(repo: str, quant: str | None = None, revision: str | None = None, *,
         token: str | None = None, cache_dir: str | os.PathLike | None = None,
         output_dir: str | os.PathLike | None = None, delete_snapshot: bool = False,
         progress: bool = True, verbose: bool = False, echo=None) -> PullResult:
    """Download `repo` at `revision`, convert and quantize it to `quant` (None: the model's default,
    default_quant); returns where the GGUF is.

    `echo(str)` receives one-line status messages (default: the logger)."""
    say = echo or log.info
    if quant is not None:
        try:
            quant = registry.get(quant).name
        except registry.UnknownScheme as e:
            raise PullError(str(e)) from None
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        raise PullError(f"{repo!r} is not a hub repo id; give it as owner/name, e.g. deepseek-ai/DeepSeek-V2-Lite-Chat")
    revision = revision or "main"
    endpoint = hf_endpoint()
    hf_cache = Path(cache_dir) if cache_dir else hf_cache_dir()
    offline = hf_offline()
    client = HubClient(repo, revision, endpoint, hf_cache, token, offline, progress)

    with progress_bars(progress):
        sha = client.resolve()
        if quant is None:
            quant = default_quant(client.config(sha))
        out, record = gguf_cache.target(repo, sha, quant, output_dir)
        if gguf_cache.reusable(out, record, repo, sha, quant):
            say(f"cached: {out}")
            gguf_cache.write_ref(repo, revision, sha)
            return PullResult(out, repo, sha, quant, cached=True)

        # pre-flight: architecture, file list, disk
        config = client.config(sha)
        check_architecture(repo, config, client)
        check_scheme(repo, config, quant)
        files, sizes, weights_size = client.plan_files(sha)
        check_disk(client, sha, files, sizes, weights_size, config, quant, out)

        snapshot = client.download(sha, files)
        out.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        convert_snapshot(Path(snapshot), out, quant, progress, verbose, say, repo)
        gguf_cache.write_record(record, {"repo": repo, "revision": revision, "sha": sha, "quant": quant,
                                         "converter": gguf_cache.converter_key(), "created": time.time(),
                                         "seconds": round(time.time() - t0, 1)})
        gguf_cache.write_ref(repo, revision, sha)
        if delete_snapshot:
            remove_snapshot(hf_cache, repo, sha, say)
    return PullResult(out, repo, sha, quant, cached=False)

