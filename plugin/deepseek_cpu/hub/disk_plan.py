"""The disk plan: bytes a pull will write, and the check that they fit before it starts.

Three amounts (`estimate_disk`): the download still missing from the HF cache, the bf16
intermediate a llama.cpp quantization needs, and the output. Amounts that land on the
same filesystem are added up; each filesystem must hold its total plus a margin, so a
pull stops before downloading anything rather than halfway through a conversion.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from ..quantization import registry
from ..quantization import types as quant_types
from .errors import PullError


def free_bytes(path: Path) -> int:
    """Free space on the filesystem that holds (or will hold) `path`."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def _device(path: Path) -> int:
    # the nearest existing ancestor's: the output directory may not exist yet
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p.stat().st_dev


def _bytes_per_param(config: dict) -> float:
    q = config.get("quantization_config") or {}
    if "fp8" in str(q.get("quant_method", "")).lower() or "e4m3" in str(q.get("fmt", "")).lower():
        return 1.0
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return 4.0 if "32" in dtype else 2.0


def estimate_disk(weights_size: int, download: int, config: dict, quant: str) -> dict[str, int]:
    """Bytes needed for the download, the conversion intermediate and the output."""
    n_params = weights_size / _bytes_per_param(config)
    scheme = registry.get(quant)
    intermediate = 0 if scheme.direct else int(n_params * 2)  # bf16
    output = int(n_params * quant_types.QUANT_TYPES[scheme.base].bpw / 8)
    return {"download": int(download), "intermediate": intermediate, "output": output}


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def check_disk(client, sha: str, files: list[str], sizes: dict[str, int], weights_size: int,
               config: dict, quant: str, out: Path) -> None:
    """Raise PullError unless each filesystem the pull writes to has room (`client`: a HubClient)."""
    need = estimate_disk(weights_size, client.missing_bytes(sha, files, sizes), config, quant)
    margin = lambda n: int(n * 1.02) + (16 << 20) if n else 0  # noqa: E731
    groups: dict[int, tuple[Path, int, list[str]]] = {}
    for what, where in (("download", client.cache_dir), ("intermediate", out.parent), ("output", out.parent)):
        if not need[what]:
            continue
        dev = _device(where)
        path, total, parts = groups.get(dev, (where, 0, []))
        groups[dev] = (path, total + need[what], parts + [f"{what} {_gib(need[what])}"])
    for path, total, parts in groups.values():
        free = free_bytes(path)
        if free < margin(total):
            raise PullError(f"not enough disk space on {path}: need {_gib(margin(total))} "
                            f"({' + '.join(parts)} + margin), {_gib(free)} free; free some space or choose "
                            "another place (--output-dir, --cache-dir / HF_HOME)")
