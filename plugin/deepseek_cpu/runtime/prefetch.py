"""Cold/hot weights under a memory budget: which pages of the model file to lock, warm or leave.

Under `mem_budget` the routed experts (~90% of a DeepSeek MoE's bytes) are used from the file
mapping, and everything else, what every token reads, is copied into memory as usual
(runtime/memory_budget.py). A prefetch policy (a plugin: `deepseek_cpu_prefetch_policies`) looks
at the model's layout (each tensor's bytes in the file, and each routed expert's slice of a
stacked expert tensor) and at the expert-usage statistics, and returns a Placement:

    hot   expert ranges locked in memory (mlock)
    warm  expert ranges read ahead now, most wanted first (madvise WILLNEED)
    cold  everything else: left to the page cache, read when the router asks for it

Ranges outside the mapped expert tensors are ignored: the engine holds those in memory already.

Built in: `popular` (the default) reads ahead the experts in order of measured popularity (this
model's sidecar, written at the end of each budgeted run), as many as the budget leaves room
for; with no statistics yet, nothing. `pinned` locks the most popular half of those instead of
reading them ahead. `none` does nothing, and turns off the engine's read-ahead too (the page cache
alone). Otherwise the engine reads each layer's chosen experts ahead as soon as its router has
chosen them (DEEPSEEK_CPU_EXPERT_PREFETCH, dsc/expert-prefetch.c).

Statistics persist per model in a small JSON sidecar under the cache root (experts/<model id>.json,
the id from the file's size and tensor table), so the next start warms the right experts first. A
sidecar of another model or a corrupt one is ignored with a warning; a policy that raises is
reported and the built-in one is used; mlock refused (RLIMIT_MEMLOCK) falls back to reading ahead,
with a warning.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from ..atomic import write_text
from .expert_pages import Applied, advise_file, apply, file_mapping, register_experts  # noqa: F401
from .memory_budget import BudgetPlan
from .model_layout import ModelLayout, Placement, Range, TensorInfo, layout  # noqa: F401

SIDECAR_VERSION = 1
DEFAULT_POLICY = "popular"


# -- policies ----------------------------------------------------------------------------------

class PopularExperts:
    """The built-in policy (see the module docstring). pin: the share of the expert cache to lock
    (most popular first) instead of reading it ahead."""

    description = "read ahead the experts earlier runs used most, as many as the budget holds"

    def __init__(self, pin: float = 0.0):
        self.pin = pin

    def plan(self, model: ModelLayout, counts: dict[int, np.ndarray] | None, budget: BudgetPlan) -> Placement:
        p = Placement()
        if not counts:
            return p
        room = budget.expert_cache
        pin_room = int(room * self.pin)
        ranked = []  # (routings, layer, expert)
        for layer, row in counts.items():
            ranked += [(int(c), layer, e) for e, c in enumerate(row) if c > 0]
        ranked.sort(reverse=True)
        by_layer: dict[int, list[TensorInfo]] = {}
        for t in model.expert_tensors:
            by_layer.setdefault(t.layer, []).append(t)
        for _, layer, e in ranked:
            slices = [t.expert_slice(e) for t in by_layer.get(layer, []) if e < t.n_expert]
            need = sum(s.length for s in slices)
            if need > room:
                break
            if need <= pin_room:
                p.hot += slices
                pin_room -= need
            else:
                p.warm += slices
                pin_room = 0
            room -= need
        return p


def policies() -> dict:
    """Every registered policy by name (the built-in ones come through the hook too)."""
    from .. import plugins
    out: dict = {}
    for answer in plugins.load().hook.deepseek_cpu_prefetch_policies():
        out.update(answer or {})
    return out


def choose(name: str | None) -> tuple[str, object]:
    found = policies()
    name = name or DEFAULT_POLICY
    if name not in found:
        raise ValueError(f"unknown prefetch policy {name!r}; known: {', '.join(sorted(found))}")
    return name, found[name]


# -- statistics sidecar ------------------------------------------------------------------------

def sidecar_path(model: ModelLayout) -> Path:
    from ..cache import cache_root
    return cache_root() / "experts" / f"{model.model_id}.json"


def load_counts(model: ModelLayout) -> dict[int, np.ndarray] | None:
    path = sidecar_path(model)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("model_id") != model.model_id or data.get("version") != SIDECAR_VERSION:
            warnings.warn(f"{path}: expert statistics of another model or version; ignored", stacklevel=2)
            return None
        return {int(k): np.asarray(v, dtype=np.uint64) for k, v in data["counts"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        warnings.warn(f"{path}: unreadable expert statistics ({e}); ignored", stacklevel=2)
        return None


def save_counts(model: ModelLayout, counts: dict[int, np.ndarray]) -> Path:
    """Add `counts` to the sidecar's (atomically: a temporary file renamed over it)."""
    old = load_counts(model) or {}
    merged = {k: (old[k] + v if k in old and old[k].shape == v.shape else v) for k, v in counts.items()}
    path = sidecar_path(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps({"version": SIDECAR_VERSION, "model_id": model.model_id, "file": model.path.name,
                                 "counts": {str(k): [int(x) for x in v] for k, v in merged.items()}}))
    return path


def plan_policy(name: str | None, model: ModelLayout, budget: BudgetPlan) -> tuple[Placement, str]:
    """The named policy's placement (the built-in one's if it raises)."""
    counts = load_counts(model)
    chosen, policy = choose(name)
    try:
        return policy.plan(model, counts, budget), chosen
    except Exception as e:  # a plugin's bug must not stop the model from running
        warnings.warn(f"prefetch policy {chosen!r} failed ({type(e).__name__}: {e}); using {DEFAULT_POLICY!r}",
                      stacklevel=3)
        return PopularExperts().plan(model, counts, budget), DEFAULT_POLICY


def run_policy(name: str | None, model: ModelLayout, budget: BudgetPlan) -> tuple[Placement, Applied, str]:
    """Plan with the named policy (the built-in one if it raises) and apply the placement."""
    placement, chosen = plan_policy(name, model, budget)
    return placement, apply(model, placement), chosen


class NoPrefetch:
    """Nothing locked, nothing warmed: the page cache alone (for comparison)."""

    description = "nothing locked or warmed: the page cache alone"

    def plan(self, model, counts, budget) -> Placement:
        return Placement()


from ..hookspecs import hookimpl  # noqa: E402


@hookimpl
def deepseek_cpu_prefetch_policies():
    return {"popular": PopularExperts(), "pinned": PopularExperts(pin=0.5), "none": NoPrefetch()}
