"""FP8 checkpoints with block scales, as DeepSeek publishes V3, R1, V3.1 and V3.2.

config.json says `quantization_config: {"quant_method": "fp8", "fmt": "e4m3",
"weight_block_size": [128, 128], "activation_scheme": "dynamic"}`. Each quantized Linear stores
`<module>.weight` as e4m3 bytes [out, in] and `<module>.weight_scale_inv` as float32
[ceil(out / 128), ceil(in / 128)]: the weight is w[i, j] = fp8[i, j] * scale_inv[i // 128, j // 128]
(the name is DeepSeek's; it multiplies). Embeddings, norms, the router and lm_head stay bf16.

FP8Checkpoint shows such a checkpoint as a float one: the scales are hidden and f32() of a
quantized weight applies them. The product of an e4m3 value (4 significant bits) and a float32
scale can need more bits than float32 has: it is rounded once, to float32, and from there
converted like any float checkpoint (bf16 by default).
"""
from __future__ import annotations

import logging

import numpy as np

from .checkpoint import Checkpoint, CheckpointError
from .base import ConversionError

log = logging.getLogger("deepseek_cpu.conversion")

SCALE_SUFFIX = "_scale_inv"


class FP8Checkpoint:
    """`ckpt` with every `<x>.weight` + `<x>.weight_scale_inv` pair read as one float weight."""

    def __init__(self, ckpt: Checkpoint, qc: dict):
        self.inner, self.dir = ckpt, ckpt.dir
        self.method = "fp8"
        fmt = qc.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ConversionError(f"config.json quantization_config: fp8 format {fmt!r} is not supported (e4m3)")
        block = qc.get("weight_block_size")
        if (not isinstance(block, list) or len(block) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise ConversionError(f"config.json quantization_config: weight_block_size must be two positive "
                                  f"integers, not {block!r}")
        self.block = (block[0], block[1])
        self.scales = {n[: -len(SCALE_SUFFIX)]: n for n in ckpt.names() if n.endswith(".weight" + SCALE_SUFFIX)}
        for w, s in self.scales.items():
            self._check(w, s)
        stray = [n for n in ckpt.names() if ckpt.refs[n].dtype == "F8_E4M3" and n not in self.scales]
        if stray:
            raise CheckpointError(f"{self.dir}: FP8 tensor {stray[0]} has no {stray[0]}{SCALE_SUFFIX}")
        if self.scales:
            log.info("FP8 checkpoint: %d weights dequantized with their %dx%d block scales (rounded once, to "
                     "float32)", len(self.scales), *self.block)

    def _check(self, weight: str, scale: str) -> None:
        if weight not in self.inner:
            raise CheckpointError(f"{self.dir}: {scale} has no weight {weight}")
        shape = self.inner.shape(weight)
        if len(shape) != 2:
            raise CheckpointError(f"{self.dir}: FP8 weight {weight} has shape {shape}; expected a matrix")
        want = tuple(-(-n // b) for n, b in zip(shape, self.block))
        got = self.inner.shape(scale)
        if got != want:
            raise CheckpointError(f"{self.dir}: {scale} has shape {got}; weight {weight} {shape} in "
                                  f"{self.block[0]}x{self.block[1]} blocks needs {want}")
        if self.inner.refs[weight].dtype != "F8_E4M3":
            raise CheckpointError(f"{self.dir}: {weight} has a block scale but is stored as "
                                  f"{self.inner.refs[weight].dtype}, not F8_E4M3")

    def __contains__(self, name: str) -> bool:
        return name in self.inner and not name.endswith(".weight" + SCALE_SUFFIX)

    def names(self) -> list[str]:
        return [n for n in self.inner.names() if not n.endswith(".weight" + SCALE_SUFFIX)]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.inner.shape(name)

    def f32(self, name: str) -> np.ndarray:
        w = self.inner.f32(name)
        scale = self.scales.get(name)
        if scale is None:
            return w
        s = self.inner.f32(scale)
        bo, bi = self.block
        cols = w.shape[1]
        # in place, one block row at a time: no second full-size temporary
        for r in range(s.shape[0]):
            band = w[r * bo:(r + 1) * bo]
            band *= np.repeat(s[r], bi)[:cols]
        return w

    def raw(self, name: str) -> np.ndarray:
        if name in self.scales:
            raise CheckpointError(f"{name} is stored as FP8 with block scales; read it with f32()")
        return self.inner.raw(name)

    def drop_pages(self, name: str) -> None:
        self.inner.drop_pages(name)
        if name in self.scales:
            self.inner.drop_pages(self.scales[name])

    def close(self) -> None:
        self.inner.close()
