"""Read a Hugging Face checkpoint tensor by tensor, without torch.

safetensors is an 8-byte header length, a JSON header (name -> dtype, shape, byte
offsets) and raw little-endian data. We map each file once and hand out numpy views,
so reading a tensor costs only the pages it touches; bf16 is widened to f32 by a bit
shift (bf16 is the top half of an IEEE f32), FP8 (e4m3, DeepSeek-V3's and later releases'
projections; ue8m0, V4's block scales) through a table of its 256 values. Block scales of
FP8 weights and V4's MXFP4 experts: fp8.py.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:
    from deepseek_cpu.errors import DeepseekCpuError
except ImportError:  # loaded as a top-level module, without the package (it has no relative imports)
    class DeepseekCpuError(Exception):  # type: ignore[no-redef]
        """Stand-in root: without the package nothing can catch the real one anyway."""


class CheckpointError(DeepseekCpuError, ValueError):
    """The checkpoint is incomplete, corrupt or not what config.json describes."""


class MissingShard(CheckpointError, FileNotFoundError):
    pass


# stored bytes widened at a time by Checkpoint.f32 (see there)
READ_CHUNK = 32 << 20

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F8_E4M3": np.uint8,
    "F8_E8M0": np.uint8,  # a power of two 2^(byte - 127): DeepSeek-V4's block scales (fp8.py)
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


def _e4m3_values() -> np.ndarray:
    """float32 value of each FP8 e4m3 byte ("e4m3fn": sign, 4 exponent bits with bias 7, 3
    mantissa bits; exponent 0 is subnormal; 0x7f and 0xff are NaN, there is no infinity)."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 0x7
    v = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0)) * sign
    v[(b & 0x7F) == 0x7F] = np.nan
    return v.astype(np.float32)


E4M3 = _e4m3_values()
# float32 value of each UE8M0 byte: 2^(b - 127), 0xff is NaN (OCP MX spec); 2^-127 is a float32 subnormal
E8M0 = np.where(np.arange(256) == 255, np.nan, np.ldexp(1.0, np.arange(256) - 127)).astype(np.float32)


@dataclass(frozen=True)
class TensorRef:
    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def read_header(path: Path) -> dict[str, TensorRef]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path}: not a safetensors file (shorter than its header)")
            (n,) = struct.unpack("<Q", raw)
            if n > min(size - 8, 100 << 20):
                raise CheckpointError(f"{path}: not a safetensors file (header length {n} exceeds the file)")
            header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors header: {e}") from e
    base = 8 + n
    refs = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = meta["dtype"]
        if dtype not in _DTYPES:
            raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {dtype}")
        b, e = meta["data_offsets"]
        shape = tuple(int(x) for x in meta["shape"])
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[dtype]).itemsize
        if e - b != expected:
            raise CheckpointError(f"{path}: tensor {name} holds {e - b} bytes, its shape {shape} needs {expected}")
        if base + e > size:
            raise CheckpointError(f"{path}: truncated: tensor {name} ends at byte {base + e}, the file has {size}")
        refs[name] = TensorRef(name, path, dtype, shape, base + b, base + e)
    return refs


class Checkpoint:
    """All tensors of a checkpoint directory (single file or sharded with an index)."""

    def __init__(self, model_dir: Path):
        self.dir = Path(model_dir)
        self.refs: dict[str, TensorRef] = {}
        index = self.dir / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError) as e:
                raise CheckpointError(f"{index}: not a safetensors index ({e})") from e
            files = sorted(set(weight_map.values()))
            missing = [f for f in files if not (self.dir / f).is_file()]
            if missing:
                raise MissingShard(f"{self.dir}: missing shard(s) listed in {index.name}: {', '.join(missing)}")
            for f in files:
                self.refs.update(read_header(self.dir / f))
            absent = [k for k, f in weight_map.items() if k not in self.refs]
            if absent:
                raise CheckpointError(f"{index.name} lists tensors its shards do not hold: {absent[:5]}")
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"{self.dir}: no model.safetensors.index.json and no *.safetensors files")
            for f in files:
                self.refs.update(read_header(f))
        self._maps: dict[Path, mmap.mmap] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.refs

    def names(self) -> list[str]:
        return list(self.refs)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.refs[name].shape

    def _map(self, path: Path) -> mmap.mmap:
        m = self._maps.get(path)
        if m is None:
            with open(path, "rb") as f:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[path] = m
        return m

    def raw(self, name: str) -> np.ndarray:
        """The stored array as a read-only view into the mapped file (bf16 as uint16)."""
        try:
            r = self.refs[name]
        except KeyError:
            raise CheckpointError(f"{self.dir}: tensor {name} not found in the checkpoint") from None
        buf = self._map(r.file)
        return np.frombuffer(buf, dtype=_DTYPES[r.dtype], count=r.nbytes // np.dtype(_DTYPES[r.dtype]).itemsize,
                             offset=r.begin).reshape(r.shape)

    def f32(self, name: str) -> np.ndarray:
        """The tensor widened to float32 (a copy).

        Converted in pieces of about READ_CHUNK stored bytes whose mapped pages are
        dropped once copied: a big tensor then costs its float32 copy, not also its
        stored bytes resident in the mapping (nor a second float32 temporary)."""
        a = self.raw(name)
        r = self.refs[name]
        out = np.empty(a.shape, dtype=np.float32)
        src, dst = a.reshape(-1), out.reshape(-1)
        step = max(1, READ_CHUNK // a.itemsize)
        for i in range(0, src.size, step):
            piece = src[i:i + step]
            if r.dtype == "BF16":  # bf16 is the top half of an f32
                np.left_shift(piece, 16, out=dst[i:i + step].view(np.uint32), dtype=np.uint32)
            elif r.dtype == "F8_E4M3":
                np.take(E4M3, piece, out=dst[i:i + step])
            elif r.dtype == "F8_E8M0":
                np.take(E8M0, piece, out=dst[i:i + step])
            else:
                dst[i:i + step] = piece
            if i + step < src.size:
                self._drop(r.file, r.begin + i * a.itemsize, r.begin + (i + step) * a.itemsize)
        self.drop_pages(name)
        return out

    def close(self) -> None:
        for m in self._maps.values():
            try:
                m.close()
            except BufferError:  # a view is still alive; the GC closes it later
                pass
        self._maps.clear()

    def drop_pages(self, name: str) -> None:
        """Tell the kernel we are done with a tensor's pages so a big conversion does
        not keep the whole checkpoint resident."""
        r = self.refs.get(name)
        if r is not None:
            self._drop(r.file, r.begin, r.end, whole_end=True)

    def _drop(self, path: Path, begin: int, end: int, whole_end: bool = False) -> None:
        """MADV_DONTNEED the mapped pages of bytes [begin, end) (the pages stay in the page
        cache; they just stop counting in this process's RSS). Unless whole_end, the page
        holding `end` is kept, as the next piece still reads it."""
        m = self._maps.get(path)
        if m is None or not hasattr(m, "madvise"):
            return
        page = mmap.PAGESIZE
        start = (begin // page) * page
        stop = end if whole_end else (end // page) * page
        if stop <= start:
            return
        try:
            m.madvise(mmap.MADV_DONTNEED, start, stop - start)
        except (OSError, ValueError):
            pass
