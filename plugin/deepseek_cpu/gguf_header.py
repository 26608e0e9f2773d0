"""A GGUF file's metadata scalars and tensor table, read fast.

gguf.GGUFReader builds a numpy view per array element: on DeepSeek's 102,400-token vocabulary
that is millions of objects and seconds per read, paid by every caller that only wants a few
keys or the tensor offsets (sizing a context, planning a memory budget, a benchmark's report).
This reader walks the header once with struct, keeps scalar and string values, skips arrays
(recording their length; short numeric ones, per-layer values, are kept too: GGUFHeader.array),
and returns each tensor's name, shape, type and absolute offset.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import gguf

from .errors import DeepseekCpuError

_SCALAR = {  # GGUFValueType -> struct format
    gguf.GGUFValueType.UINT8: "<B", gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H", gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I", gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f", gguf.GGUFValueType.BOOL: "<?",
    gguf.GGUFValueType.UINT64: "<Q", gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
}


class GGUFHeaderError(DeepseekCpuError, ValueError):
    """Not a GGUF file, or its header is cut short or inconsistent."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]  # ggml order (ne0 first)
    type: gguf.GGMLQuantizationType
    offset: int             # absolute, in the file
    nbytes: int


MAX_KEPT_ARRAY = 4096  # per-layer arrays are short; vocabularies (skipped) are long


@dataclass
class GGUFHeader:
    path: Path
    size: int
    fields: dict[str, object] = field(default_factory=dict)  # scalars and strings; arrays as ("array", n)
    tensors: list[TensorEntry] = field(default_factory=list)
    arrays: dict[str, list] = field(default_factory=dict)  # numeric arrays of at most MAX_KEPT_ARRAY

    def get(self, key: str, default=None):
        v = self.fields.get(key, default)
        return default if isinstance(v, tuple) else v

    def array(self, key: str) -> list | None:
        """A short numeric array's values (per-layer settings), or None."""
        return self.arrays.get(key)

    @property
    def arch(self) -> str:
        return str(self.get(gguf.Keys.General.ARCHITECTURE, "unknown"))


def read(path: str | os.PathLike) -> GGUFHeader:
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 24:
            raise GGUFHeaderError(f"{path}: not a GGUF file (too short)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _parse(path, size, m)


def _parse(path: Path, size: int, m) -> GGUFHeader:
    pos = 0

    def take(fmt: str):
        nonlocal pos
        n = struct.calcsize(fmt)
        if pos + n > size:
            raise GGUFHeaderError(f"{path}: header cut short at byte {pos}")
        v = struct.unpack_from(fmt, m, pos)[0]
        pos += n
        return v

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        if pos + n > size:
            raise GGUFHeaderError(f"{path}: a string runs past the end of the file (byte {pos})")
        s = bytes(m[pos:pos + n]).decode("utf-8", errors="replace")
        pos += n
        return s

    def skip_array(vtype: int, n: int) -> None:
        nonlocal pos
        if vtype == gguf.GGUFValueType.STRING:
            for _ in range(n):
                ln = take("<Q")
                pos += ln
        elif vtype == gguf.GGUFValueType.ARRAY:
            for _ in range(n):
                skip_array(take("<I"), take("<Q"))
        elif vtype in _SCALAR:
            pos += n * struct.calcsize(_SCALAR[vtype])
        else:
            raise GGUFHeaderError(f"{path}: unknown value type {vtype} at byte {pos}")
        if pos > size:
            raise GGUFHeaderError(f"{path}: an array runs past the end of the file")

    if bytes(m[0:4]) != b"GGUF":
        raise GGUFHeaderError(f"{path}: not a GGUF file (magic {bytes(m[0:4])!r})")
    pos = 4
    version = take("<I")
    if version not in (2, 3):
        raise GGUFHeaderError(f"{path}: GGUF version {version} is not supported")
    n_tensors, n_kv = take("<Q"), take("<Q")
    h = GGUFHeader(path, size)
    for _ in range(n_kv):
        key = string()
        vtype = take("<I")
        if vtype == gguf.GGUFValueType.STRING:
            h.fields[key] = string()
        elif vtype == gguf.GGUFValueType.ARRAY:
            atype, n = take("<I"), take("<Q")
            if atype in _SCALAR and n <= MAX_KEPT_ARRAY:
                h.arrays[key] = [take(_SCALAR[atype]) for _ in range(n)]
            else:
                skip_array(atype, n)
            h.fields[key] = ("array", n)
        elif vtype in _SCALAR:
            h.fields[key] = take(_SCALAR[vtype])
        else:
            raise GGUFHeaderError(f"{path}: unknown value type {vtype} for {key}")
    infos = []
    for _ in range(n_tensors):
        name = string()
        n_dims = take("<I")
        if n_dims > 8:
            raise GGUFHeaderError(f"{path}: tensor {name} has {n_dims} dimensions")
        shape = tuple(take("<Q") for _ in range(n_dims))
        ttype, offset = take("<I"), take("<Q")
        infos.append((name, shape, ttype, offset))
    align = int(h.get(gguf.Keys.General.ALIGNMENT, gguf.GGUF_DEFAULT_ALIGNMENT))
    data_start = (pos + align - 1) // align * align
    for name, shape, ttype, offset in infos:
        try:
            qtype = gguf.GGMLQuantizationType(ttype)
        except ValueError:
            raise GGUFHeaderError(f"{path}: tensor {name} has an unknown type {ttype}") from None
        block, bsize = gguf.GGML_QUANT_SIZES[qtype]
        n = 1
        for d in shape:
            n *= d
        nbytes = n // block * bsize
        if data_start + offset + nbytes > size:
            raise GGUFHeaderError(f"{path}: tensor {name} runs past the end of the file")
        h.tensors.append(TensorEntry(name, shape, qtype, data_start + offset, nbytes))
    return h
