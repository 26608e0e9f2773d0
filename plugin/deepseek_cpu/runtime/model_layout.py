"""Where a model's tensors lie in its GGUF file, and each routed expert's slice of a stacked
expert tensor: what prefetch policies place (prefetch.py) and the page mechanism acts on
(expert_pages.py)."""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .memory_budget import EXPERT_TENSORS


@dataclass(frozen=True)
class Range:
    offset: int  # in the file
    length: int
    what: str    # tensor name, or "blk.N.ffn_gate_exps.weight[e]" for an expert's slice


@dataclass
class TensorInfo:
    name: str
    offset: int
    nbytes: int
    layer: int | None
    n_expert: int  # 0 unless a stacked routed-expert tensor

    def expert_slice(self, e: int) -> Range:
        per = self.nbytes // self.n_expert
        return Range(self.offset + e * per, per, f"{self.name}[{e}]")


@dataclass
class ModelLayout:
    path: Path
    size: int
    tensors: list[TensorInfo]
    model_id: str

    @property
    def expert_tensors(self) -> list[TensorInfo]:
        return [t for t in self.tensors if t.n_expert]


@dataclass
class Placement:
    hot: list[Range] = field(default_factory=list)
    warm: list[Range] = field(default_factory=list)

    def bytes(self, which: str) -> int:
        """Bytes of the `hot` or the `warm` ranges."""
        return sum(r.length for r in getattr(self, which))


def layout(path: str | os.PathLike, header=None) -> ModelLayout:
    """Where each tensor lies in the file (from `header` where the caller has read it)."""
    from ..gguf_header import read
    header = header or read(path)
    tensors, h = [], hashlib.sha256()
    h.update(str(header.size).encode())
    for t in header.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        n_expert = int(t.shape[-1]) if EXPERT_TENSORS.search(t.name) and len(t.shape) == 3 else 0
        tensors.append(TensorInfo(t.name, t.offset, t.nbytes, int(m.group(1)) if m else None, n_expert))
        h.update(f"{t.name}:{t.offset}:{t.nbytes}:{list(t.shape)};".encode())
    return ModelLayout(Path(path), header.size, tensors, h.hexdigest()[:24])
