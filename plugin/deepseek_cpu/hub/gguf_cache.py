"""The GGUF cache: where a pulled GGUF goes, its .json record, and the offline refs.

Under gguf/ of the cache root (cache.py):
    <org>--<name>/<sha>/<converter key>/<name>-<quant>.gguf (+ .json record)
    <org>--<name>/refs/<revision>           last sha seen for a branch/tag (offline use)
With `output_dir` the GGUF is <output_dir>/<name>-<quant>.gguf, its record next to it.
The record, not the file's presence, decides whether a GGUF is reused.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from .. import __version__
from ..atomic import write_text
from ..cache import cache_root

# every module of the pull logs as "deepseek_cpu.hub", the one logger the pull has always
# used (not __name__): handlers and filters set on it keep seeing every record
log = logging.getLogger("deepseek_cpu.hub")

# Bump when the GGUF a given checkpoint converts to changes (tensor layout, metadata), so
# cached conversions made by an older converter are not reused.
CONVERTER_FORMAT = 2  # 2: the MTP block of V3 / R1 / V3.1 / V3.2 / V4 is kept (issue 49)


def gguf_cache_dir() -> Path:
    return cache_root() / "gguf"


def converter_key() -> str:
    return f"deepseek-cpu-{__version__}-fmt{CONVERTER_FORMAT}"


def target(repo: str, sha: str, quant: str, output_dir) -> tuple[Path, Path]:
    """The GGUF's path and its record's."""
    name = repo.split("/")[-1]
    if output_dir is not None:
        out = Path(output_dir) / f"{name}-{quant}.gguf"
    else:
        out = gguf_cache_dir() / repo.replace("/", "--") / sha / converter_key() / f"{name}-{quant}.gguf"
    return out, out.with_name(out.name + ".json")


def reusable(out: Path, record: Path, repo: str, sha: str, quant: str) -> bool:
    try:
        r = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    return (out.is_file() and r.get("repo") == repo and r.get("sha") == sha and r.get("quant") == quant
            and r.get("converter") == converter_key())


def write_record(path: Path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=2))


def ref_path(repo: str, revision: str) -> Path:
    return gguf_cache_dir() / repo.replace("/", "--") / "refs" / revision


def write_ref(repo: str, revision: str, sha: str) -> None:
    if revision == sha:
        return
    try:
        p = ref_path(repo, revision)
        if p.is_file() and p.read_text().strip() == sha:
            return  # unchanged: a cached pull writes nothing
        p.parent.mkdir(parents=True, exist_ok=True)
        write_text(p, sha)
    except OSError as e:  # the ref is a convenience for offline use only
        log.warning("could not record %s@%s -> %s: %s", repo, revision, sha, e)
