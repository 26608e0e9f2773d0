"""Which routed experts work: the engine's expert-usage counters, read from Python.

The engine counts, for every MoE layer, how often the router chose each routed expert
(patches/files/ggml/src/ggml-cpu/dsc/expert-usage.c: from the ids of each MUL_MAT_ID on the
layer's gate experts, inside the compute loop, always on). The counters belong to the process:
they add up over every model and context evaluated in it until `reset_expert_usage()`. They
count what the engine computed: in a prompt evaluated without logits_all, llama.cpp runs the
last layer only for the tokens whose logits are wanted, so that layer counts only those.

    from deepseek_cpu import Llama
    llm = Llama("model.gguf")
    llm.reset_expert_usage()
    llm("some text", max_tokens=32)
    usage = llm.expert_usage()          # ExpertUsage: counts [layers, experts]
    usage.coverage(0.1)                 # share of routings the top 10% of experts take, per layer
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import numpy as np

from ..errors import DeepseekCpuError
from .engine import backend_function


class ExpertUsageUnavailable(DeepseekCpuError, RuntimeError):
    """The loaded engine has no expert-usage counters (stock llama.cpp, or not loaded yet)."""


def _functions():
    read, reset = backend_function("ggml_dsc_expert_usage"), backend_function("ggml_dsc_expert_usage_reset")
    if read is None or reset is None:
        raise ExpertUsageUnavailable("no deepseek-cpu engine with expert-usage counters is loaded in this process "
                                     "(load a model with deepseek_cpu.Llama first)")
    read.restype, read.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int, ctypes.c_int]
    reset.restype, reset.argtypes = None, []
    return read, reset


def read_counts(n_layer: int, n_expert: int) -> np.ndarray:
    """The raw counters: uint64 [n_layer, n_expert] (layer index as in the GGUF, dense layers 0)."""
    read, _ = _functions()
    out = np.zeros((n_layer, n_expert), dtype=np.uint64)
    if read(out.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), n_layer, n_expert) != 0:
        raise ExpertUsageUnavailable("the engine refused to report expert usage")
    return out


def prefetch_function(name: str):
    """One of the engine's expert read-ahead functions (dsc/expert-prefetch.c)."""
    fn = backend_function(name)
    if fn is None:
        raise ExpertUsageUnavailable("no deepseek-cpu engine with expert prefetch is loaded in this process")
    return fn


def set_expert_prefetch(level: int) -> int:
    """How far the engine reads routed experts ahead, for this process (dsc/expert-prefetch.c):
    0 not at all, 1 each layer's chosen experts as soon as its router chose, 2 also the experts
    the next layer's router is predicted to choose. Returns the previous level."""
    fn = prefetch_function("ggml_dsc_expert_prefetch_set")
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
    return int(fn(int(level)))


def forget_expert_addresses() -> None:
    """Make the engine's read-ahead forget the weight addresses it learnt: before the model they
    belong to is freed (pre-gating reads the next layer's router from them)."""
    fn = prefetch_function("ggml_dsc_expert_prefetch_forget")
    fn.restype, fn.argtypes = None, []
    fn()


def expert_prefetch_stats(reset: bool = False) -> dict:
    """Pre-gating so far: experts predicted, how many of them the router then chose, and how many
    it chose in the layers that had a prediction (hit rate = chosen_predicted / chosen)."""
    fn = prefetch_function("ggml_dsc_expert_prefetch_stats")
    fn.restype, fn.argtypes = None, [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
    out = (ctypes.c_uint64 * 3)()
    fn(out, int(reset))
    return {"predicted": out[0], "chosen_predicted": out[1], "chosen": out[2]}


def expert_hash_prefetch_stats(reset: bool = False) -> dict:
    """DeepSeek-V4's hash-routed layers: experts read ahead for a layer from the token ids at an
    earlier hash layer, and how many of them its table lookup then chose (all, for a sound engine)."""
    fn = prefetch_function("ggml_dsc_expert_prefetch_hash_stats")
    fn.restype, fn.argtypes = None, [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
    out = (ctypes.c_uint64 * 2)()
    fn(out, int(reset))
    return {"read_ahead": out[0], "chosen": out[1]}


def reset_expert_usage() -> None:
    """Set every counter of this process to zero."""
    _, reset = _functions()
    reset()


@dataclass
class ExpertUsage:
    """Routings per MoE layer and expert. `layers`: the GGUF layer index of each row."""
    counts: np.ndarray        # uint64 [n_moe_layers, n_expert]
    layers: list[int]
    experts_per_token: int

    @property
    def routings(self) -> int:
        return int(self.counts.sum())

    def shares(self) -> np.ndarray:
        """Each expert's share of its layer's routings (rows sum to 1; 0 for an unused layer)."""
        c = self.counts.astype(np.float64)
        tot = c.sum(axis=1, keepdims=True)
        return np.divide(c, tot, out=np.zeros_like(c), where=tot > 0)

    def coverage_curve(self) -> np.ndarray:
        """[n_moe_layers, n_expert]: share of routings the top-1, top-2, ... experts of each layer take."""
        return np.cumsum(-np.sort(-self.shares(), axis=1), axis=1)

    def coverage(self, fraction: float) -> np.ndarray:
        """Per layer, the share of routings taken by the most used `fraction` of its experts."""
        n = max(1, int(round(fraction * self.counts.shape[1])))
        return self.coverage_curve()[:, n - 1]

    def unused(self) -> np.ndarray:
        """Per layer, how many experts were never chosen."""
        return (self.counts == 0).sum(axis=1)

    def to_dict(self) -> dict:
        return {"layers": self.layers, "experts_per_token": self.experts_per_token,
                "counts": self.counts.tolist(), "routings": self.routings,
                "coverage_top10pct": self.coverage(0.1).tolist(), "unused": self.unused().tolist()}


def model_moe_shape(metadata: dict) -> tuple[list[int], int, int]:
    """(MoE layer indices, experts per layer, experts per token) from a GGUF's metadata."""
    arch = metadata.get("general.architecture", "deepseek2")

    def get(key, default=None):
        v = metadata.get(f"{arch}.{key}", default)
        if v is None:
            raise ExpertUsageUnavailable(f"the model has no {arch}.{key}: not a mixture-of-experts model")
        return int(v)
    n_layer, n_expert, k = get("block_count"), get("expert_count"), get("expert_used_count")
    dense = get("leading_dense_block_count", 0)
    return list(range(dense, n_layer)), n_expert, k


def usage_for(metadata: dict) -> ExpertUsage:
    """The counters of this process, shaped for the model whose GGUF metadata is given."""
    layers, n_expert, k = model_moe_shape(metadata)
    counts = read_counts(max(layers) + 1 if layers else 0, n_expert)[layers]
    return ExpertUsage(counts, layers, k)


def plot(usage: ExpertUsage, path: str | os.PathLike, title: str = "") -> None:
    """A PNG: the layer x expert heatmap of routing shares, and each layer's coverage curve."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shares = usage.shares()
    n_layer, n_expert = shares.shape
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, max(3.5, 0.18 * n_layer + 2)),
                               gridspec_kw={"width_ratios": [2.2, 1]})
    im = a.imshow(shares * n_expert, aspect="auto", cmap="magma", interpolation="nearest",
                  extent=(-0.5, n_expert - 0.5, usage.layers[-1] + 0.5, usage.layers[0] - 0.5))
    a.set_xlabel("expert")
    a.set_ylabel("layer")
    a.set_title("routings per expert, relative to uniform (1 = its fair share)")
    fig.colorbar(im, ax=a, fraction=0.04)
    x = np.arange(1, n_expert + 1) / n_expert * 100
    curves = usage.coverage_curve() * 100
    for i, layer in enumerate(usage.layers):
        b.plot(x, curves[i], color=plt.cm.viridis(i / max(1, n_layer - 1)), lw=1, alpha=0.8)
    b.plot(x, x, "k--", lw=1, label="uniform routing")
    b.set_xlabel("most used experts of a layer (%)")
    b.set_ylabel("share of the layer's routings (%)")
    b.set_title("coverage (one line per layer, dark = first)")
    b.legend(loc="lower right")
    b.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(usage: ExpertUsage) -> str:
    n_expert = usage.counts.shape[1]
    top = usage.coverage(0.1)
    lines = [f"{usage.routings} routings over {len(usage.layers)} MoE layers x {n_expert} experts "
             f"({usage.experts_per_token} per token)",
             f"{'layer':>5}  {'top 10%':>7}  {'top 25%':>7}  {'most used':>10}  unused"]
    cov25, shares = usage.coverage(0.25), usage.shares()
    for i, layer in enumerate(usage.layers):
        e = int(np.argmax(usage.counts[i]))
        lines.append(f"{layer:>5}  {100 * top[i]:6.1f}%  {100 * cov25[i]:6.1f}%  "
                     f"#{e:<3} {100 * shares[i, e]:4.1f}%  {int(usage.unused()[i])}")
    lines.append(f"all    {100 * top.mean():6.1f}%  {100 * cov25.mean():6.1f}%   (uniform: 10.0%, 25.0%)")
    return "\n".join(lines)
