"""The mechanism under a prefetch policy: the pages of the mapped model file that hold routed
experts, locked (mlock) or read ahead (madvise WILLNEED); and the engine told where each
expert tensor lies in this process's mapping, so that its own read-ahead works from the first
graph. What to lock or read ahead is the policy's (prefetch.py)."""
from __future__ import annotations

import ctypes
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from .experts import prefetch_function
from .memory_budget import EXPERT_TENSORS
from .model_layout import ModelLayout, Placement, Range
from .process_maps import mappings

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MADV_WILLNEED = 3


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def file_mapping(path: Path) -> tuple[int, int, int] | None:
    """(start address, end address, file offset) of this process's mapping of `path`."""
    st = os.stat(path)
    best = None
    for m in mappings():
        if m.inode == st.st_ino and m.dev == st.st_dev and (best is None or m.end - m.start > best[1] - best[0]):
            best = (m.start, m.end, m.offset)
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
    mapping = file_mapping(model.path)
    if mapping is None:
        return 0
    fn = prefetch_function("ggml_dsc_expert_prefetch_weights")
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
