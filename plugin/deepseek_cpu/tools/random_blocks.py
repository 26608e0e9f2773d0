"""Random quantized blocks: tensor bytes of any type synth writes, generated directly (no
float quantization). The quant bytes are random; the f16 block scales are set so that every
weight decodes with a standard deviation of about SIGMA (like trained DeepSeek weights) and,
where the block's formula would not give it by itself, a mean of about zero.
"""
from __future__ import annotations

import gguf
import numpy as np

from .shapes import SynthError

Q = gguf.GGMLQuantizationType
UNQUANTIZED = (Q.F32, Q.F16, Q.BF16)

SIGMA = 0.02  # standard deviation of the synthetic weights
# (offset of an f16 field in the block, its value in units of SIGMA): chosen from the
# block's decoding formula so that weights come out with standard deviation ~SIGMA and
# about zero mean; quant bytes and 4/6/8-bit sub-block scales are random.
#   q4_0: d*(q-8), q 0..15 (std 4.61)          q4_1: d*q + m, m = -7.5 d
#   q5_0: d*(q-16), q 0..31 (std 9.23)         q5_1: d*q + m, m = -15.5 d
#   q8_0: d*q, q int8 (std 73.9)
#   q2_K: d*sc*q - dmin*m, sc,m 4-bit, q 0..3  q3_K: d*(sc-32)*(q-4), sc 6-bit, q 0..7
#   q4_K: d*sc*q - dmin*m, sc,m 6-bit, q 0..15 q5_K: same with q 0..31
#   q6_K: d*sc*(q-32), sc int8, q 0..63
SCALE_FIELDS: dict[gguf.GGMLQuantizationType, tuple[tuple[int, float], ...]] = {
    Q.Q4_0: ((0, 1 / 4.61),),
    Q.Q4_1: ((0, 1 / 4.61), (2, -7.5 / 4.61)),
    Q.Q5_0: ((0, 1 / 9.23),),
    Q.Q5_1: ((0, 1 / 9.23), (2, -15.5 / 9.23)),
    Q.Q8_0: ((0, 1 / 73.9),),
    Q.Q2_K: ((80, 1 / (8.8 * 1.118)), (82, 1.5 / (8.8 * 1.118))),
    Q.Q3_K: ((108, 1 / (18.5 * 2.35)),),
    Q.Q4_K: ((0, 1 / (36.6 * 4.61)), (2, 7.5 / (36.6 * 4.61))),
    Q.Q5_K: ((0, 1 / (36.6 * 9.23)), (2, 15.5 / (36.6 * 9.23))),
    Q.Q6_K: ((208, 1 / (73.9 * 18.5)),),
}
# byte layouts checked against gguf's sizes (== the block structs of ggml-common.h)
for _t, _f in SCALE_FIELDS.items():
    assert max(o for o, _ in _f) + 2 <= gguf.GGML_QUANT_SIZES[_t][1], _t

CHUNK = 32 << 20  # bytes generated and written at a time

# Uniform random quants decode with a mean of -0.5 steps in q4_0 (d*(q-8), q 0..15) and q5_0
# (d*(q-16), q 0..31): 11% and 5% of the weights' standard deviation, the same sign in every
# matrix, so every product adds a component common to all tokens, which compounds layer by layer
# until it decides the routing (tools/routing.py). The lowest step is swapped for the zero step:
# a low nibble of 0 becomes 8 (q4_0: both nibbles; q5_0: the four low bits of q, whose high bit
# stays uniform). The other types are already centred: offsets (q4_1, q5_1, K-quant mins), signed
# random scales (q6_K), or half a step in 255 (q8_0).
# (byte range of the quants in the block)
CENTRED: dict[gguf.GGMLQuantizationType, tuple[int, int]] = {
    Q.Q4_0: (2, 18),
    Q.Q5_0: (6, 22),
}


def _centre(raw: np.ndarray, lo: int, hi: int) -> None:
    q = raw[:, lo:hi]
    q[(q & 0x0F) == 0] |= 0x08
    q[(q & 0xF0) == 0] |= 0x80


class RandomBlocks:
    """Random tensor bytes, fast: slices of pre-generated pools at random offsets."""

    POOL = 64 << 20
    FPOOL = 8 << 20    # float32 normals
    JPOOL = 1 << 22    # scale jitter factors (>= CHUNK / smallest block)

    def __init__(self, seed: int = 0, zero_mean: bool = True):
        self.zero_mean = zero_mean
        self.rng = np.random.default_rng(seed)
        self.pool = np.frombuffer(self.rng.bytes(self.POOL), dtype=np.uint8)
        self.fpool = self.rng.standard_normal(self.FPOOL, dtype=np.float32)
        self.jitter = self.rng.uniform(0.5, 1.5, self.JPOOL).astype(np.float32)

    def _slice(self, pool: np.ndarray, n: int) -> np.ndarray:
        off = int(self.rng.integers(0, len(pool) - n + 1))
        return pool[off:off + n]

    def chunks(self, qtype: gguf.GGMLQuantizationType, n_elem: int, kind: str = "weight"):
        """Yield the bytes of a tensor of `n_elem` elements, at most CHUNK at a time.
        kind: 'weight' (random, std SIGMA), 'ones' (norms), 'bias' (small random)."""
        if qtype in UNQUANTIZED:
            per = min(CHUNK // 4, self.FPOOL // 2)
            for start in range(0, n_elem, per):
                k = min(per, n_elem - start)
                if kind == "ones":
                    x = np.ones(k, dtype=np.float32)
                else:
                    x = self._slice(self.fpool, k) * np.float32(SIGMA if kind == "weight" else 0.01)
                if qtype == Q.F32:
                    yield x
                elif qtype == Q.F16:
                    yield x.astype(np.float16)
                else:  # bf16: the top half of the f32
                    yield (x.view(np.uint32) >> 16).astype(np.uint16)
            return
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        if qtype == Q.MXFP4:
            yield from self._mxfp4(n_elem // block, size)
            return
        fields = SCALE_FIELDS.get(qtype)
        if fields is None:
            raise SynthError(f"synth cannot generate {qtype.name} blocks")
        n_blocks = n_elem // block
        per = CHUNK // size
        for start in range(0, n_blocks, per):
            nb = min(per, n_blocks - start)
            raw = self._slice(self.pool, nb * size).copy().reshape(nb, size)
            jit = self._slice(self.jitter, nb)
            for off, unit in fields:
                raw[:, off:off + 2] = (jit * np.float32(SIGMA * unit)).astype(np.float16).view(np.uint8).reshape(nb, 2)
            if self.zero_mean and qtype in CENTRED:
                _centre(raw, *CENTRED[qtype])
            yield raw.reshape(-1)

    def _mxfp4(self, n_blocks: int, size: int):
        """MXFP4 blocks: a UE8M0 scale byte then 16 bytes of random e2m1 codes (symmetric, so zero
        mean; their values have std 2.93), the scale 2^-7 (std ~0.023 ~ SIGMA) jittered by 2^{-1,0,1}."""
        per = CHUNK // size
        for start in range(0, n_blocks, per):
            nb = min(per, n_blocks - start)
            raw = self._slice(self.pool, nb * size).copy().reshape(nb, size)
            raw[:, 0] = 119 + raw[:, 0] % 3
            yield raw.reshape(-1)

    def expert_ids(self, shape: tuple[int, int], n_expert: int) -> np.ndarray:
        """int32 [rows, k]: k distinct expert ids per row (a hash routing table)."""
        rows, k = shape
        start = self.rng.integers(0, n_expert, rows, dtype=np.int64)[:, None]
        return ((start + np.arange(k)[None, :] * max(1, n_expert // k)) % n_expert).astype(np.int32)
