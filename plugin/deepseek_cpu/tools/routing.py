"""Router weights for synthetic models that route as asked: uniformly, or with a planted skew.

Random weights route badly. Every quantized block type synth writes decodes with a small
negative mean (q4_0 is d*(q-8) with q uniform in 0..15), so each matrix product adds a
component along the all-ones direction to the residual stream, the same for every token. A
random router turns that shared component into a fixed bias per expert, and a handful of
experts take most routings (`deepseek-cpu experts` on a V2-Lite q4_0 synth: the most used 10%
of experts of a layer take ~80% of its routings, and a third are never used).

The router rows written here sum to zero, so the shared direction adds nothing to any expert's
score, and the score of expert e on a token is s_e times a zero-mean random variable of the
token. With equal scales every expert is equally likely ("uniform"); with unequal ones the
experts with larger s_e win top-k more often ("skewed"). The scales are calibrated by
simulating the model's own top-k rule (group-limited for V2 and V3) so that the most used 10%
of a layer's experts take a chosen share of its routings (by default DEFAULT_TOP10, 35%; for
comparison, published DeepSeek router statistics have the best 6% of experts of a layer covering
about 46% of routings). Each layer's popular experts are a different random set.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .random_blocks import SIGMA

KINDS = ("random", "uniform", "skewed")
DEFAULT_TOP10 = 0.35


@dataclass(frozen=True)
class Routing:
    kind: str = "uniform"        # uniform | skewed | random (whatever plain random weights give)
    top10: float = DEFAULT_TOP10  # skewed: share of routings the most used 10% of experts take


def top10_share(freq: np.ndarray) -> float:
    """Share of routings taken by the most used 10% of experts (at least one)."""
    n = max(1, int(round(0.1 * len(freq))))
    return float(np.sort(freq)[::-1][:n].sum() / max(freq.sum(), 1e-12))


def _select(scores: np.ndarray, k: int, n_group: int, topk_group: int) -> np.ndarray:
    """Boolean (tokens, experts): the top-k experts per token, within the topk_group best groups
    (a group scored by its best expert, as V2's group_limited_greedy; V3's sum of the best two
    behaves alike for this purpose)."""
    t, n = scores.shape
    if n_group > 1 and topk_group < n_group:
        g = scores.reshape(t, n_group, n // n_group).max(axis=2)
        keep_groups = np.argpartition(-g, topk_group - 1, axis=1)[:, :topk_group]
        mask = np.zeros((t, n_group), dtype=bool)
        np.put_along_axis(mask, keep_groups, True, axis=1)
        scores = np.where(np.repeat(mask, n // n_group, axis=1), scores, -np.inf)
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    sel = np.zeros_like(scores, dtype=bool)
    np.put_along_axis(sel, top, True, axis=1)
    return sel


def simulate(scales: np.ndarray, k: int, n_group: int = 1, topk_group: int = 1, tokens: int = 8192,
             rng: np.random.Generator | None = None) -> np.ndarray:
    """Routings per expert (summing to 1) when expert e's score is scales[e] * N(0, 1)."""
    rng = rng or np.random.default_rng(0)
    scores = rng.standard_normal((tokens, len(scales)), dtype=np.float32) * scales.astype(np.float32)
    sel = _select(scores, k, n_group, topk_group)
    return sel.sum(axis=0) / sel.sum()


def calibrate(n: int, k: int, top10: float, n_group: int = 1, topk_group: int = 1,
              rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scales, most popular first; the routings per expert they give in simulation): power-law
    scales s_i = (i+1)^-a, with `a` found by bisection so that the most used 10% take `top10`."""
    seed = int((rng or np.random.default_rng(0)).integers(1 << 31))

    def share(a):  # the same random scores for every a, so share(a) is monotone
        s = (np.arange(n) + 1.0) ** -a
        return s, simulate(s, k, n_group, topk_group, rng=np.random.default_rng(seed))
    lo, hi = 0.0, 4.0
    for _ in range(24):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if top10_share(share(mid)[1]) < top10 else (lo, mid)
    s, _ = share(hi)
    return s, simulate(s, k, n_group, topk_group, tokens=32768, rng=np.random.default_rng(seed + 1))


def router_weights(n_expert: int, n_embd: int, k: int, routing: Routing, sigma: float, n_group: int,
                   topk_group: int, rng: np.random.Generator, calibrated: tuple | None = None) -> np.ndarray:
    """(n_expert, n_embd) float32 router rows summing to zero, row norms sigma * sqrt(n_embd) * s_e.
    `calibrated`: the (scales, routings) of calibrate() to reuse across layers."""
    w = rng.standard_normal((n_expert, n_embd), dtype=np.float32)
    w -= w.mean(axis=1, keepdims=True)
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    if routing.kind == "skewed":
        scales = np.empty(n_expert)
        scales[rng.permutation(n_expert)] = calibrated[0]  # this layer's own popular experts
    else:
        scales = np.ones(n_expert)
    return (w * (sigma * np.sqrt(n_embd) * scales)[:, None]).astype(np.float32)


class RouterWriter:
    """The router tensors of a synthetic file (`blk.N.ffn_gate_inp.weight`) for a Routing; other
    tensors, and every tensor under "random", are synth's random blocks."""

    def __init__(self, cfg: dict, routing: Routing, seed: int):
        self.routing = routing
        self.k = int(cfg["num_experts_per_tok"])
        self.n_group = int(cfg.get("n_group") or 1)
        self.topk_group = int(cfg.get("topk_group") or 1)
        self.rng = np.random.default_rng([seed, 0x5eed])
        self.calibrated = None
        if routing.kind not in KINDS:
            raise ValueError(f"routing {routing.kind!r}: one of {', '.join(KINDS)}")
        if routing.kind == "skewed":
            if not 0.1 < routing.top10 < 1:
                raise ValueError(f"skew {routing.top10}: the share of the most used 10% of experts, between 0.1 and 1")
            self.calibrated = calibrate(int(cfg["n_routed_experts"]), self.k, routing.top10, self.n_group,
                                        self.topk_group, rng=np.random.default_rng(seed))
            got = top10_share(self.calibrated[1])
            if got < routing.top10 - 0.02:
                raise ValueError(f"skew {routing.top10:.2f} cannot be planted in routers of this shape (at most "
                                 f"about {got:.2f}: each expert's score is symmetric, so it wins about half the "
                                 f"tokens at most)")

    def describe(self) -> str:
        """What the file's routers were made to do, for its metadata and the synth command."""
        if self.routing.kind == "skewed":
            return (f"skewed: planted so that the most used 10% of each layer's experts take "
                    f"{top10_share(self.calibrated[1]):.0%} of its routings (simulated; each layer its own experts)")
        if self.routing.kind == "uniform":
            return "uniform: router rows of equal norm, zero-mean weights"
        return "random: plain random weights (a few experts take most routings)"

    def takes(self, t) -> bool:
        return self.routing.kind != "random" and t.name.endswith(".ffn_gate_inp.weight")

    def weights(self, t):
        n_expert, n_embd = t.shape
        yield router_weights(n_expert, n_embd, self.k, self.routing, SIGMA, self.n_group, self.topk_group,
                             self.rng, self.calibrated).reshape(-1)
