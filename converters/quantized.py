"""INT4 checkpoints (GPTQ, AWQ, compressed-tensors) read exactly, as ggml q4_0 / q4_1 blocks.

A checkpoint whose config.json has `quantization_config` stores each quantized Linear as
packed integer codes q, per-group scales s and zero points z, meaning w = s * (q - z). A
ggml block is 32 consecutive input columns of one row with one scale: q4_1 stores
w = d * q + m, so d = s, m = -s * z reproduces the group exactly up to the f16 rounding of
d and m; q4_0 stores w = d * (q - 8), exact up to the f16 rounding of d when z == 8
(symmetric). That holds whenever every aligned 32-column block of a row lies inside one
quantization group: any group size that is a multiple of 32, per-channel (one group per
row), or an act-order g_idx that happens to be constant over each 32-block.

Everything else -- other bit widths, groups that split a 32-block (act-order, sizes not a
multiple of 32), a tensor the converter must transpose -- is dequantized to float32 here
and then converted like a float checkpoint; the converter logs each such tensor and why.

The formats, as their tools write them (little-endian int32 words, code k of a word in
bits k*bits .. k*bits+bits-1):

  GPTQ (AutoGPTQ / GPTQModel)  qweight [in*bits/32, out]: packed along the INPUT dim;
      qzeros [groups, out*bits/32]: packed along the output dim; scales f16 [groups, out];
      g_idx [in]: input column -> group. checkpoint_format "gptq" (v1, the default) stores
      zero - 1; we add the 1 back per code, as AutoGPTQ's dequantization does, so a v1
      code of 15 reads as zero 16 (GPTQModel adds 0x11111111 to the whole word, which
      carries there; the two differ only for a true zero of 0, which AutoGPTQ's v1 packer
      cannot store intact anyway). "gptq_v2" stores the zero itself.
  AWQ (AutoAWQ, version "gemm")  qweight [in, out/8] and qzeros [groups, out/8], packed
      along the OUTPUT dim with word k holding columns 8k + [0, 2, 4, 6, 1, 3, 5, 7];
      scales f16 [groups, out]; groups are consecutive input columns.
  compressed-tensors, format "pack-quantized"  weight_packed [out, in*bits/32] holding
      the signed codes plus 2**(bits-1); weight_scale [out, groups] (channel: [out, 1]);
      weight_zero_point (asymmetric only) signed, packed along the OUTPUT dim
      [out*bits/32, groups]; weight_shape [2]; weight_g_idx [in] when written with the
      old actorder "group". w = (q_signed - zp) * scale.

Bit widths 2, 4 and 8 are read (they tile an int32 word; 3, 5, 6 and 7 are packed
differently by different tool versions), only 4 can be kept exact.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from .base import ConversionError
from .checkpoint import Checkpoint, CheckpointError

Q = gguf.GGMLQuantizationType
log = logging.getLogger("deepseek_cpu.conversion")

BLOCK = 32            # ggml's q4_0 / q4_1 block: 32 input columns sharing d (and m)
READABLE_BITS = (2, 4, 8)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AWQ word slot k holds output column 8j + AWQ_ORDER[k]


class UnsupportedQuantization(ConversionError):
    """quantization_config names a method, format or setting this importer cannot read."""


@dataclass
class IntWeight:
    """One quantized Linear, unpacked: w[o, i] = scale[o, g] * (q[o, i] - zero[o, g]), g = group_of[i]."""
    q: np.ndarray | None  # uint8 [out, in], unsigned codes 0 .. 2**bits - 1 (None: not read)
    scale: np.ndarray     # float32 [out, groups], the stored scales widened
    zero: np.ndarray      # float32 [out, groups], in the unsigned code domain
    group_of: np.ndarray  # int [in]
    bits: int

    def dequantize(self) -> np.ndarray:
        g = self.group_of
        return self.scale[:, g] * (self.q.astype(np.float32) - self.zero[:, g])

    def exact_type(self) -> tuple[gguf.GGMLQuantizationType | None, str]:
        """(q4_0 or q4_1, "") when the ggml blocks reproduce it, else (None, why not)."""
        if self.bits != 4:
            return None, f"{self.bits}-bit codes have no ggml block of the same grid"
        n_in = len(self.group_of)
        if n_in % BLOCK:
            return None, f"{n_in} input columns do not fill 32-wide blocks"
        per_block = self.group_of.reshape(-1, BLOCK)
        if (per_block != per_block[:, :1]).any():
            return None, "its quantization groups split 32-column blocks (act-order g_idx or a group size not a multiple of 32)"
        d = self.scale.astype(np.float16)
        m = (-self.scale * self.zero).astype(np.float16)
        if not (np.isfinite(d).all() and np.isfinite(m).all()):
            return None, "a scale or scale*zero exceeds the f16 range"
        return (Q.Q4_0 if (self.zero == 8).all() else Q.Q4_1), ""

    def blocks(self, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
        """The ggml bytes of qtype, uint8 [out, in/32 * block bytes] (call exact_type first)."""
        out, n_in = self.q.shape
        g = self.group_of[::BLOCK]  # the group of each block
        d = self.scale[:, g].astype(np.float16)
        codes = self.q.reshape(out, n_in // BLOCK, BLOCK)
        # ggml nibble order: byte j holds element j (low nibble) and element j + 16 (high)
        qs = (codes[..., :16] | (codes[..., 16:] << 4)).astype(np.uint8)
        parts = [d[..., None].view(np.uint8)]
        if qtype == Q.Q4_1:
            m = (-self.scale[:, g] * self.zero[:, g]).astype(np.float16)
            parts.append(m[..., None].view(np.uint8))
        parts.append(qs)
        return np.concatenate(parts, axis=-1).reshape(out, -1)


def q4_0_as_q4_1(blocks: np.ndarray) -> np.ndarray:
    """q4_0 bytes -> the q4_1 bytes of the same values: m = -8d is exact in f16."""
    b = blocks.reshape(*blocks.shape[:-1], -1, 18)
    d = b[..., :2].copy().view(np.float16)
    m = (d.astype(np.float32) * -8).astype(np.float16)
    return np.concatenate([b[..., :2], m.view(np.uint8), b[..., 2:]], axis=-1).reshape(*blocks.shape[:-1], -1)


# -- unpacking -----------------------------------------------------------------------

def _codes(words: np.ndarray, bits: int, axis: int, order=None) -> np.ndarray:
    """int32 words -> uint8 codes, unpacked along `axis` (each word gives 32/bits codes)."""
    per = 32 // bits
    w = np.moveaxis(words.view(np.uint32), axis, -1)
    shifts = np.arange(per, dtype=np.uint32) * bits
    codes = ((w[..., None] >> shifts) & ((1 << bits) - 1)).astype(np.uint8)  # [..., words, per]
    if order is not None:  # slot k holds column order[k]: put it back in column order
        codes = codes[..., np.argsort(order)]
    codes = codes.reshape(*w.shape[:-1], -1)
    return np.moveaxis(codes, -1, axis)


def _field(qc: dict, key: str, allowed, where: str = "quantization_config"):
    value = qc.get(key)
    if value not in allowed:
        raise UnsupportedQuantization(f"config.json {where}.{key} = {value!r} is not supported "
                                      f"(supported: {', '.join(map(repr, allowed))})")
    return value


def _group_size(qc: dict, key: str, n_in: int, where: str = "quantization_config") -> int:
    g = qc.get(key, -1)
    if g is None or g == -1:
        return n_in
    if isinstance(g, bool) or not isinstance(g, int) or g <= 0:
        raise UnsupportedQuantization(f"config.json {where}.{key} = {g!r} is not a group size")
    return g


class _Format:
    """One method's tensors: which modules are quantized, their stored tensors, and reading them."""
    suffix: str  # the stored tensor that marks a quantized module

    def __init__(self, qc: dict, ckpt: Checkpoint):
        self.qc, self.ckpt = qc, ckpt

    def modules(self) -> list[str]:
        return [n[: -len(self.suffix)] for n in self.ckpt.names() if n.endswith(self.suffix)]

    def stored(self, prefix: str) -> list[str]:
        raise NotImplementedError

    def shape(self, prefix: str) -> tuple[int, int]:
        raise NotImplementedError

    def read(self, prefix: str, codes: bool = True) -> IntWeight:
        """codes=False: all but the codes (enough to decide exactness, and cheap)."""
        raise NotImplementedError

    def _check(self, name: str, shape: tuple[int, ...]) -> None:
        if self.ckpt.shape(name) != shape:
            raise CheckpointError(f"{self.ckpt.dir}: {name} has shape {self.ckpt.shape(name)}, "
                                  f"the {self.qc.get('quant_method')} layout implies {shape}")


class _GPTQ(_Format):
    suffix = ".qweight"

    def __init__(self, qc, ckpt):
        super().__init__(qc, ckpt)
        self.bits = _field(qc, "bits", READABLE_BITS)
        key = "checkpoint_format" if "checkpoint_format" in qc else "format"
        fmt = qc.get(key) or "gptq"
        if fmt not in ("gptq", "gptq_v2"):
            raise UnsupportedQuantization(f"config.json quantization_config.{key} = {fmt!r} is not supported "
                                          f"(supported: 'gptq' (v1: zero stored minus 1), 'gptq_v2')")
        self.zero_offset = 1 if fmt == "gptq" else 0

    def stored(self, p):
        return [p + s for s in (".qweight", ".qzeros", ".scales", ".g_idx") if p + s in self.ckpt]

    def shape(self, p):
        words, out = self.ckpt.shape(p + ".qweight")
        return out, words * 32 // self.bits

    def read(self, p, codes=True):
        out, n_in = self.shape(p)
        per = 32 // self.bits
        group = _group_size(self.qc, "group_size", n_in)
        n_groups = -(-n_in // group)
        self._check(p + ".scales", (n_groups, out))
        self._check(p + ".qzeros", (n_groups, out // per))
        if p + ".g_idx" in self.ckpt:
            self._check(p + ".g_idx", (n_in,))
            group_of = self.ckpt.raw(p + ".g_idx").astype(np.int64)
            if group_of.min() < 0 or group_of.max() >= n_groups:
                raise CheckpointError(f"{self.ckpt.dir}: {p}.g_idx names groups outside 0..{n_groups - 1}")
        else:
            group_of = np.arange(n_in) // group
        q = np.ascontiguousarray(_codes(self.ckpt.raw(p + ".qweight"), self.bits, axis=0).T) if codes else None
        zero = _codes(self.ckpt.raw(p + ".qzeros"), self.bits, axis=1).astype(np.float32) + self.zero_offset
        scale = self.ckpt.f32(p + ".scales")
        return IntWeight(q, scale.T.copy(), zero.T.copy(), group_of, self.bits)


class _AWQ(_Format):
    suffix = ".qweight"

    def __init__(self, qc, ckpt):
        super().__init__(qc, ckpt)
        self.bits = _field(qc, "bits", (4,))
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise UnsupportedQuantization(f"config.json quantization_config.version = {qc.get('version')!r} is not "
                                          f"supported (supported: 'gemm'; gemv and the kernel formats pack differently)")
        _field(qc, "zero_point", (True,))

    def stored(self, p):
        return [p + s for s in (".qweight", ".qzeros", ".scales")]

    def shape(self, p):
        n_in, words = self.ckpt.shape(p + ".qweight")
        return words * 8, n_in

    def read(self, p, codes=True):
        out, n_in = self.shape(p)
        group = _group_size(self.qc, "group_size", n_in)
        n_groups = -(-n_in // group)
        self._check(p + ".scales", (n_groups, out))
        self._check(p + ".qzeros", (n_groups, out // 8))
        q = np.ascontiguousarray(_codes(self.ckpt.raw(p + ".qweight"), 4, axis=1, order=AWQ_ORDER).T) if codes else None
        zero = _codes(self.ckpt.raw(p + ".qzeros"), 4, axis=1, order=AWQ_ORDER).astype(np.float32)
        scale = self.ckpt.f32(p + ".scales")
        return IntWeight(q, scale.T.copy(), zero.T.copy(), np.arange(n_in) // group, 4)


class _CompressedTensors(_Format):
    suffix = ".weight_packed"

    def __init__(self, qc, ckpt):
        super().__init__(qc, ckpt)
        _field(qc, "format", ("pack-quantized",))
        groups = qc.get("config_groups") or {}
        if not isinstance(groups, dict) or not groups:
            raise UnsupportedQuantization("config.json quantization_config.config_groups is missing or empty")
        self.schemes = []
        for gname, scheme in groups.items():
            where = f"quantization_config.config_groups.{gname}"
            if scheme.get("format") not in (None, "pack-quantized"):
                _field(scheme, "format", (None, "pack-quantized"), where)
            w = scheme.get("weights") or {}
            _field(w, "num_bits", READABLE_BITS, where + ".weights")
            _field(w, "type", ("int",), where + ".weights")
            _field(w, "strategy", ("group", "channel"), where + ".weights")
            self.schemes.append((scheme.get("targets") or [], w))

    def _scheme(self, p: str) -> dict:
        for targets, w in self.schemes:
            for t in targets:
                if t == "Linear" or (t.startswith("re:") and re.match(t[3:], p)) or p == t or p.endswith("." + t):
                    return w
        if len(self.schemes) == 1:
            return self.schemes[0][1]
        raise UnsupportedQuantization(f"no config_groups entry of quantization_config targets {p}")

    def stored(self, p):
        return [p + s for s in (".weight_packed", ".weight_scale", ".weight_shape", ".weight_zero_point",
                                ".weight_g_idx") if p + s in self.ckpt]

    def shape(self, p):
        out, n_in = (int(x) for x in self.ckpt.raw(p + ".weight_shape"))
        return out, n_in

    def read(self, p, codes=True):
        w = self._scheme(p)
        bits = int(w["num_bits"])
        out, n_in = self.shape(p)
        group = n_in if w["strategy"] == "channel" else _group_size(w, "group_size", n_in, "quantization_config weights")
        n_groups = -(-n_in // group)
        self._check(p + ".weight_packed", (out, n_in * bits // 32))
        self._check(p + ".weight_scale", (out, n_groups))
        q = _codes(self.ckpt.raw(p + ".weight_packed"), bits, axis=1) if codes else None
        offset = 1 << (bits - 1)  # stored codes are the signed ones plus offset
        if w.get("symmetric", True):
            zero = np.full((out, n_groups), offset, np.float32)
        else:
            self._check(p + ".weight_zero_point", (-(-out * bits // 32), n_groups))
            zp = _codes(self.ckpt.raw(p + ".weight_zero_point"), bits, axis=0)[:out]
            zero = zp.astype(np.float32)  # signed zp + offset == the stored code
        if p + ".weight_g_idx" in self.ckpt:
            group_of = self.ckpt.raw(p + ".weight_g_idx").astype(np.int64)
        else:
            group_of = np.arange(n_in) // group
        return IntWeight(q, self.ckpt.f32(p + ".weight_scale"), zero, group_of, bits)


FORMATS = {"gptq": _GPTQ, "awq": _AWQ, "compressed-tensors": _CompressedTensors}


def quantization_format(config: dict, ckpt: Checkpoint) -> _Format | None:
    """The reader of config.json's quantization_config, None for a float checkpoint."""
    qc = config.get("quantization_config")
    if not qc:
        return None
    if not isinstance(qc, dict):
        raise UnsupportedQuantization(f"config.json quantization_config must be an object, not {qc!r}")
    method = _field(qc, "quant_method", (*FORMATS, "fp8"))
    return FORMATS[method](qc, ckpt)


class QuantizedCheckpoint:
    """A Checkpoint in which each quantized Linear appears as its float `<module>.weight`
    (shape [out, in]; f32() dequantizes it), and `int_weight` gives its integer form."""

    def __init__(self, ckpt: Checkpoint, fmt: _Format, exact: bool = True):
        self.inner, self.fmt, self.dir, self.exact = ckpt, fmt, ckpt.dir, exact
        self.method = fmt.qc.get("quant_method")
        self.modules = {p + ".weight": p for p in fmt.modules()}
        self.hidden = {n for p in self.modules.values() for n in fmt.stored(p)}
        for w, p in self.modules.items():
            # AutoGPTQ keeps a bias buffer even for bias-free Linears; an all-zero one is no bias
            if w not in ckpt and p + ".bias" in ckpt and not ckpt.f32(p + ".bias").any():
                self.hidden.add(p + ".bias")

    def __contains__(self, name: str) -> bool:
        return name in self.modules or (name in self.inner and name not in self.hidden)

    def names(self) -> list[str]:
        return [n for n in self.inner.names() if n not in self.hidden] + list(self.modules)

    def is_quantized(self, name: str) -> bool:
        """Whether `name` is a quantized weight the converter should try to keep exact."""
        return self.exact and name in self.modules

    def shape(self, name: str) -> tuple[int, ...]:
        p = self.modules.get(name)
        return self.fmt.shape(p) if p else self.inner.shape(name)

    def int_weight(self, name: str, codes: bool = True) -> IntWeight:
        return self.fmt.read(self.modules[name], codes)

    def f32(self, name: str) -> np.ndarray:
        p = self.modules.get(name)
        return self.fmt.read(p).dequantize() if p else self.inner.f32(name)

    def raw(self, name: str) -> np.ndarray:
        if name in self.modules:
            raise CheckpointError(f"{name} is stored quantized; read it with f32() or int_weight()")
        return self.inner.raw(name)

    def drop_pages(self, name: str) -> None:
        p = self.modules.get(name)
        for n in (self.fmt.stored(p) if p else [name]):
            self.inner.drop_pages(n)

    def close(self) -> None:
        self.inner.close()


def open_checkpoint(model_dir: Path, config: dict, exact: bool = True):
    """The checkpoint of `model_dir`: a QuantizedCheckpoint when config.json says it is
    quantized (exact=False: its weights are only offered dequantized)."""
    ckpt = Checkpoint(model_dir)
    try:
        qc = config.get("quantization_config")
        if isinstance(qc, dict) and qc.get("quant_method") == "fp8":  # DeepSeek's own releases
            from .fp8 import BlockScaledCheckpoint
            return BlockScaledCheckpoint(ckpt, qc)
        fmt = quantization_format(config, ckpt)
    except BaseException:
        ckpt.close()
        raise
    return QuantizedCheckpoint(ckpt, fmt, exact) if fmt else ckpt
