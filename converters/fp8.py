"""Block-scaled checkpoints as DeepSeek publishes them: FP8 projections (V3, R1, V3.1, V3.2, V4) and
MXFP4 routed experts (V4).

config.json says `quantization_config: {"quant_method": "fp8", "fmt": "e4m3",
"weight_block_size": [128, 128], ...}`. Two ways to store a block scale:

* V3 / R1 / V3.1 / V3.2: `<module>.weight` e4m3 bytes [out, in] and `<module>.weight_scale_inv`
  float32 [ceil(out / 128), ceil(in / 128)]: w[i, j] = fp8[i, j] * scale_inv[i // 128, j // 128]
  (the name is DeepSeek's; it multiplies). The product can need more bits than float32 has: it is
  rounded once, to float32.
* V4 (`"scale_fmt": "ue8m0"`): `<module>.weight` e4m3 and `<module>.scale` F8_E8M0, a power of two
  per block, so every weight is exact in bfloat16 (and float32). V4's routed experts are MXFP4:
  `<module>.weight` I8/U8 [out, in / 2] holding two e2m1 codes per byte (element 2i in the low
  nibble) and `<module>.scale` F8_E8M0 [out, in / 32], which GGML's MXFP4 holds bit for bit
  (`mxfp4_blocks`).

BlockScaledCheckpoint shows such a checkpoint as a float one: the scales are hidden, shape() is the
weight's logical shape and f32() applies the scales.
"""
from __future__ import annotations

import logging

import numpy as np

from .checkpoint import Checkpoint, CheckpointError
from .base import ConversionError

log = logging.getLogger("deepseek_cpu.conversion")

SCALE_INV = ".weight_scale_inv"   # V3's float32 block scale
SCALE = ".scale"                   # V4's UE8M0 block scale
MX_BLOCK = 32                      # MXFP4: values per scale
# e2m1 code -> value (OCP MX): the order GGML's MXFP4 kvalues use (doubled there, scale halved)
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


class BlockScaledCheckpoint:
    """`ckpt` with every weight + block-scale pair read as one float weight."""

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
        # weight name -> (scale name, "fp8" | "mxfp4")
        self.scales: dict[str, tuple[str, str]] = {}
        for n in ckpt.names():
            if n.endswith(SCALE_INV):
                self.scales[n[: -len("_scale_inv")]] = (n, "fp8")
            elif n.endswith(SCALE):
                w = n[: -len(SCALE)] + ".weight"
                kind = "mxfp4" if w in ckpt and ckpt.refs[w].dtype in ("I8", "U8") else "fp8"
                self.scales[w] = (n, kind)
        for w, (s, kind) in self.scales.items():
            self._check(w, s, kind)
        stray = [n for n in ckpt.names() if ckpt.refs[n].dtype == "F8_E4M3" and n not in self.scales]
        if stray:
            raise CheckpointError(f"{self.dir}: FP8 tensor {stray[0]} has no block scale "
                                  f"({stray[0]}_scale_inv or {stray[0][: -len('.weight')]}{SCALE})")
        self._hidden = {s for s, _ in self.scales.values()}
        n_mx = sum(1 for _, k in self.scales.values() if k == "mxfp4")
        if self.scales:
            log.info("block-scaled checkpoint: %d FP8 weights (%dx%d blocks), %d MXFP4 weights",
                     len(self.scales) - n_mx, *self.block, n_mx)

    def _check(self, weight: str, scale: str, kind: str) -> None:
        if weight not in self.inner:
            raise CheckpointError(f"{self.dir}: {scale} has no weight {weight}")
        shape, ref = self.inner.shape(weight), self.inner.refs[weight]
        if len(shape) != 2:
            raise CheckpointError(f"{self.dir}: block-scaled weight {weight} has shape {shape}; expected a matrix")
        got = self.inner.shape(scale)
        if kind == "mxfp4":
            want = (shape[0], shape[1] * 2 // MX_BLOCK)
            if shape[1] * 2 % MX_BLOCK or got != want:
                raise CheckpointError(f"{self.dir}: {scale} has shape {got}; MXFP4 weight {weight} {shape} "
                                      f"(two values per byte, {MX_BLOCK} per scale) needs {want}")
            if self.inner.refs[scale].dtype != "F8_E8M0":
                raise CheckpointError(f"{self.dir}: {scale} is {self.inner.refs[scale].dtype}; MXFP4 scales are F8_E8M0")
            return
        want = tuple(-(-n // b) for n, b in zip(shape, self.block))
        if got != want:
            raise CheckpointError(f"{self.dir}: {scale} has shape {got}; weight {weight} {shape} in "
                                  f"{self.block[0]}x{self.block[1]} blocks needs {want}")
        if ref.dtype != "F8_E4M3":
            raise CheckpointError(f"{self.dir}: {weight} has a block scale but is stored as {ref.dtype}, not F8_E4M3")

    # -- what converters ask -----------------------------------------------------

    def __contains__(self, name: str) -> bool:
        return name in self.inner and name not in self._hidden

    def names(self) -> list[str]:
        return [n for n in self.inner.names() if n not in self._hidden]

    def dtype(self, name: str) -> str:
        """The stored type: "fp8_pow2" (FP8 with power-of-two scales: exact in bf16), "fp8",
        "mxfp4", else the safetensors dtype."""
        s = self.scales.get(name)
        if s is None:
            return self.inner.refs[name].dtype
        if s[1] == "mxfp4":
            return "mxfp4"
        return "fp8_pow2" if self.inner.refs[s[0]].dtype == "F8_E8M0" else "fp8"

    def shape(self, name: str) -> tuple[int, ...]:
        shape = self.inner.shape(name)
        s = self.scales.get(name)
        if s is not None and s[1] == "mxfp4":
            return (shape[0], shape[1] * 2)
        return shape

    def f32(self, name: str) -> np.ndarray:
        s = self.scales.get(name)
        if s is None:
            return self.inner.f32(name)
        if s[1] == "mxfp4":
            packed = self.inner.raw(name).view(np.uint8)
            codes = np.stack([packed & 0x0F, packed >> 4], -1).reshape(packed.shape[0], -1, MX_BLOCK)
            out = E2M1[codes] * self.inner.f32(s[0])[..., None]
            return out.reshape(packed.shape[0], -1)
        w = self.inner.f32(name)
        scale = self.inner.f32(s[0])
        bo, bi = self.block
        cols = w.shape[1]
        # in place, one block row at a time: no second full-size temporary
        for r in range(scale.shape[0]):
            band = w[r * bo:(r + 1) * bo]
            band *= np.repeat(scale[r], bi)[:cols]
        return w

    def mxfp4_blocks(self, name: str) -> np.ndarray:
        """GGML MXFP4 bytes [out, in / 32 * 17] of an MXFP4 weight: per 32 values its UE8M0 byte and
        16 bytes of codes, byte j holding value j (low nibble) and value j + 16 (high). Only bits move:
        GGML's MXFP4 doubles the e2m1 values and halves the scale, the same numbers."""
        packed = self.inner.raw(name).view(np.uint8)
        rows = packed.shape[0]
        scale = self.inner.raw(self.scales[name][0]).view(np.uint8)
        src = packed.reshape(rows, -1, MX_BLOCK // 2)
        vals = np.stack([src & 0x0F, src >> 4], -1).reshape(rows, -1, MX_BLOCK)   # value order
        qs = vals[..., :16] | (vals[..., 16:] << 4)
        return np.concatenate([scale[..., None], qs.astype(np.uint8)], -1).reshape(rows, -1)

    def raw(self, name: str) -> np.ndarray:
        if name in self.scales:
            raise CheckpointError(f"{name} is stored with block scales; read it with f32()")
        return self.inner.raw(name)

    @property
    def refs(self):
        return self.inner.refs

    def drop_pages(self, name: str) -> None:
        self.inner.drop_pages(name)
        if name in self.scales:
            self.inner.drop_pages(self.scales[name][0])

    def close(self) -> None:
        self.inner.close()


FP8Checkpoint = BlockScaledCheckpoint  # the name V3's import knew it by
