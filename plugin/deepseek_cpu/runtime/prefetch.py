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

import ctypes
import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .memory_budget import EXPERT_TENSORS, BudgetPlan

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MADV_WILLNEED = 3
SIDECAR_VERSION = 1
DEFAULT_POLICY = "popular"


@dataclass(frozen=True)
class Range:
    offset: int  # in the file
    length: int
    what: str    # tensor name, or "blk.N.ffn_gate_exps.weight[e]" for an expert's slice


@dataclass
class TensorInfo:
    name: str
    offset: int
    nbytes: int
    layer: int | None
    n_expert: int  # 0 unless a stacked routed-expert tensor

    def expert_slice(self, e: int) -> Range:
        per = self.nbytes // self.n_expert
        return Range(self.offset + e * per, per, f"{self.name}[{e}]")


@dataclass
class ModelLayout:
    path: Path
    size: int
    tensors: list[TensorInfo]
    model_id: str

    @property
    def expert_tensors(self) -> list[TensorInfo]:
        return [t for t in self.tensors if t.n_expert]


@dataclass
class Placement:
    hot: list[Range] = field(default_factory=list)
    warm: list[Range] = field(default_factory=list)

    def bytes(self, which: str) -> int:
        """Bytes of the `hot` or the `warm` ranges."""
        return sum(r.length for r in getattr(self, which))


def layout(path: str | os.PathLike) -> ModelLayout:
    from ..gguf_header import read
    header = read(path)
    tensors, h = [], hashlib.sha256()
    h.update(str(header.size).encode())
    for t in header.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        n_expert = int(t.shape[-1]) if EXPERT_TENSORS.search(t.name) and len(t.shape) == 3 else 0
        tensors.append(TensorInfo(t.name, t.offset, t.nbytes, int(m.group(1)) if m else None, n_expert))
        h.update(f"{t.name}:{t.offset}:{t.nbytes}:{list(t.shape)};".encode())
    return ModelLayout(Path(path), header.size, tensors, h.hexdigest()[:24])


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
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"version": SIDECAR_VERSION, "model_id": model.model_id, "file": model.path.name,
                               "counts": {str(k): [int(x) for x in v] for k, v in merged.items()}}))
    os.replace(tmp, path)
    return path


# -- the mechanism -----------------------------------------------------------------------------

def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def file_mapping(path: Path) -> tuple[int, int, int] | None:
    """(start address, end address, file offset) of this process's mapping of `path`."""
    st = os.stat(path)
    best = None
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6:
                continue
            dev_major, dev_minor = (int(x, 16) for x in parts[3].split(":"))
            if int(parts[4]) != st.st_ino or os.makedev(dev_major, dev_minor) != st.st_dev:
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if best is None or hi - lo > best[1] - best[0]:
                best = (lo, hi, int(parts[2], 16))
    return best


def _page_span(mapping, r: Range) -> tuple[int, int] | None:
    lo, hi, off = mapping
    a = lo + (r.offset - off)
    b = a + r.length
    a0, b0 = max(lo, a - a % PAGE), min(hi, b)
    return (a0, b0 - a0) if b0 > a0 else None


@dataclass
class Applied:
    locked: int = 0
    warmed: int = 0
    lock_refused: str | None = None


def _within_experts(model: ModelLayout, ranges: list[Range]) -> list[Range]:
    """The ranges inside the routed-expert tensors (the only ones used from the mapping)."""
    import bisect
    spans = sorted((t.offset, t.offset + t.nbytes) for t in model.expert_tensors)  # disjoint, as in the file
    starts = [a for a, _ in spans]
    out = []
    for r in ranges:  # the span starting at or before the range must hold all of it
        i = bisect.bisect_right(starts, r.offset) - 1
        if i >= 0 and r.offset + r.length <= spans[i][1]:
            out.append(r)
    return out


def apply(model: ModelLayout, placement: Placement) -> Applied:
    """mlock the hot ranges (falling back to WILLNEED if refused), WILLNEED the warm ones."""
    mapping = file_mapping(model.path)
    done = Applied()
    if mapping is None:
        warnings.warn(f"{model.path} is not mapped in this process (use_mmap off?); no prefetch", stacklevel=2)
        return done
    libc = _libc()
    for r in _within_experts(model, placement.hot):
        span = _page_span(mapping, r)
        if span is None:
            continue
        if done.lock_refused is None and libc.mlock(span[0], span[1]) == 0:
            done.locked += span[1]
            continue
        if done.lock_refused is None:
            done.lock_refused = os.strerror(ctypes.get_errno())
            warnings.warn(f"mlock refused ({done.lock_refused}; see RLIMIT_MEMLOCK, `ulimit -l`): the experts to pin "
                          f"are read ahead instead", stacklevel=2)
        libc.madvise(span[0], span[1], MADV_WILLNEED)
        done.warmed += span[1]
    for r in _within_experts(model, placement.warm):
        span = _page_span(mapping, r)
        if span is not None and libc.madvise(span[0], span[1], MADV_WILLNEED) == 0:
            done.warmed += span[1]
    return done


EXPERT_SLOTS = {"gate": 0, "up": 1, "down": 2}  # dsc/expert-prefetch.c's order


def register_experts(model: ModelLayout, experts_per_token: int) -> int:
    """Tell the engine where each routed-expert tensor lies in this process's mapping of the file,
    so that its read-ahead works from the first graph (it would otherwise learn each layer's
    addresses only after that layer's router had chosen). Returns the tensors registered."""
    from .experts import _prefetch_function
    mapping = file_mapping(model.path)
    if mapping is None:
        return 0
    fn = _prefetch_function("ggml_dsc_expert_prefetch_weights")
    fn.restype = None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int64]
    lo, hi, file_off = mapping
    n = 0
    for t in model.expert_tensors:
        m = EXPERT_TENSORS.search(t.name)
        addr = lo + (t.offset - file_off)
        if t.layer is None or addr < lo or addr + t.nbytes > hi:
            continue
        fn(t.layer, EXPERT_SLOTS[m.group(1)], addr, t.nbytes // t.n_expert, t.n_expert, experts_per_token)
        n += 1
    return n


def advise_file(model: ModelLayout, placement: Placement) -> int:
    """For another process (llama-server): read the hot and warm ranges into the page cache with
    posix_fadvise(WILLNEED) on the file. Nothing can be locked from outside; returns bytes advised."""
    n = 0
    fd = os.open(model.path, os.O_RDONLY)
    try:
        for r in _within_experts(model, placement.hot + placement.warm):
            os.posix_fadvise(fd, r.offset, r.length, os.POSIX_FADV_WILLNEED)
            n += r.length
    finally:
        os.close(fd)
    return n


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
