"""What every converter produces: GGUF metadata and a plan of output tensors.

The plan is built from checkpoint headers alone (names, shapes, types), so the GGUF
header can be written before any weight is read; each tensor is then produced,
written and dropped in turn, which keeps peak memory at the largest single tensor.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import gguf
import numpy as np

from deepseek_cpu.errors import DeepseekCpuError
from deepseek_cpu.quantization.types import QUANT_TYPES

Q = gguf.GGMLQuantizationType

# The types a converter writes itself, name -> tensor type (deepseek_cpu/quantization/types.py).
OUTTYPES = {n: t.ggml_type for n, t in QUANT_TYPES.items() if t.direct}


class ConversionError(DeepseekCpuError, ValueError):
    """The checkpoint cannot be converted; the message says why."""


class UnsupportedArchitecture(ConversionError):
    pass


class MtpLayers:
    """The multi-token-prediction (MTP, "nextn") layers a converter writes after the main ones:
    `n_mtp_config` from config.json, `n_mtp` what is written (0 once keep_mtp is set False: --no-mtp)."""
    n_mtp_config: int = 0
    n_mtp: int = 0
    _keep_mtp: bool = True

    @property
    def keep_mtp(self) -> bool:
        return self._keep_mtp

    @keep_mtp.setter
    def keep_mtp(self, keep: bool) -> None:
        self._keep_mtp = bool(keep)
        self.n_mtp = self.n_mtp_config if keep else 0


@dataclass
class TensorPlan:
    name: str                      # GGUF tensor name
    shape: tuple[int, ...]         # numpy order (outermost first); GGUF stores it reversed
    qtype: gguf.GGMLQuantizationType
    produce: Callable[[], np.ndarray]  # float32 data, called once while writing
    sources: list[str] = field(default_factory=list)  # checkpoint tensors it is made of

    @property
    def nbytes(self) -> int:
        block, type_size = gguf.GGML_QUANT_SIZES[self.qtype]
        n = int(np.prod(self.shape, dtype=np.int64))
        return n // block * type_size


@dataclass
class EncodedBlocks:
    """What a producer returns when it already has the tensor's GGUF bytes (INT4 groups of a
    GPTQ / AWQ / compressed-tensors checkpoint kept exactly as q4_0 / q4_1 blocks): they are
    written as they are, never re-quantized."""
    data: np.ndarray  # uint8 [..., bytes of one row], the plan's qtype


def stack_f32(ckpt, sources) -> np.ndarray:
    """One expert tensor per source stacked into [n_expert, ...] float32, each source's pages
    dropped once copied (the checkpoint never stays resident)."""
    out = np.empty((len(sources), *ckpt.shape(sources[0])), dtype=np.float32)
    for e, s in enumerate(sources):
        out[e] = ckpt.f32(s)
        ckpt.drop_pages(s)
    return out


def choose_qtype(name: str, shape: tuple[int, ...], outtype: gguf.GGMLQuantizationType) -> gguf.GGMLQuantizationType:
    """Norms, biases and the router stay f32 (tiny, and precision matters there);
    a row that does not fill whole quant blocks falls back to f16."""
    if len(shape) < 2 or name.endswith((".bias", "_norm.weight", "ffn_gate_inp.weight")) or "norm" in name.split(".")[-2]:
        return Q.F32
    block, _ = gguf.GGML_QUANT_SIZES[outtype]
    if shape[-1] % block != 0:
        return Q.F16
    return outtype


def encode(data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """float32 data -> the bytes GGUF stores for `qtype`."""
    data = np.ascontiguousarray(data, dtype=np.float32)
    if qtype == Q.F32:
        return data
    if qtype == Q.F16:
        return data.astype(np.float16)
    return gguf.quants.quantize(data, qtype)


# elements encoded at a time by encode_pieces: bounds the encoder's temporaries (gguf's
# bf16 rounding makes uint64 copies of its input, the block quantizers several float32
# ones) to some tens of MB whatever the tensor's size
ENCODE_CHUNK = 1 << 21


def encode_pieces(data: np.ndarray, qtype: gguf.GGMLQuantizationType, chunk: int = ENCODE_CHUNK):
    """`encode(data, qtype)` as consecutive pieces of whole rows (their bytes concatenated
    are encode's), so a converter can write a big tensor without its encoded copy."""
    data = np.ascontiguousarray(data, dtype=np.float32)
    if qtype == Q.F32:
        yield data
        return
    rows = data.reshape(-1, data.shape[-1]) if data.ndim else data.reshape(1, 1)
    step = max(1, chunk // max(1, rows.shape[1]))
    for i in range(0, rows.shape[0], step):
        yield encode(rows[i:i + step], qtype)
