"""How much CPU and memory this process may really use (affinity, cgroup quota)."""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import DeepseekCpuError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class SizeError(DeepseekCpuError, ValueError):
    """A size option that is not a positive size (4G, 512M, 4.5GiB, bytes)."""


def parse_size(text: str | int, what: str = "size", error: type[Exception] = SizeError) -> int:
    """'4G', '512M', '4.5GiB', '4096' (bytes) -> bytes; `error` names `what` was given wrong
    (a memory budget, --mem, --rpc-local), so the message says which option it was."""
    if isinstance(text, int):
        if text <= 0:
            raise error(f"{what} must be positive, not {text}")
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise error(f"{what} {text!r}: expected a size such as 4G, 512M or 4.5GiB")
    n = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if n <= 0:
        raise error(f"{what} {text!r} must be positive")
    return n


def _unescape_mount_path(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _cgroup_mounts() -> list[tuple[int, set[str], str, Path]]:
    """The cgroup file systems this process sees: (version, v1 controllers, the hierarchy path
    the mount shows, mount point), from /proc/self/mountinfo. A mount's root is not always the
    hierarchy's: a container that shares the host's cgroup namespace (Docker's default on v1
    hosts) sees its own cgroup, /docker/<id>, mounted at /sys/fs/cgroup/memory, so the path that
    /proc/self/cgroup names must be taken relative to the mount's root, not to a fixed place."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    mounts: dict[Path, tuple[int, set[str], str, Path]] = {}
    for line in lines:
        pre, sep, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        point = Path(_unescape_mount_path(fields[4]))
        controllers = set(tail[2].split(",")) if tail[0] == "cgroup" else set()
        # a later mount on the same point hides the earlier one (mountinfo lists them in order)
        mounts[point] = (2 if tail[0] == "cgroup2" else 1, controllers, _unescape_mount_path(fields[3]), point)
    return list(mounts.values())


def _own_cgroups(controller: str):
    """(version, directory) of this process's cgroups that carry `controller`, v2's unified one
    and v1's, in the order /proc/self/cgroup lists them; each followed by its ancestors up to the
    top this process can see. A limit set on an ancestor binds too (a systemd slice's MemoryMax
    over the scope a process runs in, a pod's limit over its container), so callers take the
    tightest of them all."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    mounts = _cgroup_mounts()
    for line in lines:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hid == "0" and controllers == "":
            version = 2
        elif controller in controllers.split(","):
            version = 1
        else:
            continue
        for v, mounted, root, point in mounts:
            if v != version or (version == 1 and controller not in mounted):
                continue
            # the path relative to what the mount shows; a path outside it, or a mount made
            # outside this process's cgroup namespace (its root shows as "/.."), cannot be used
            if ".." in root.split("/"):
                continue
            rel = os.path.relpath(path, root)
            if rel == ".." or rel.startswith("../"):
                continue
            here = point if rel == "." else point / rel
            if not here.is_dir():
                continue
            while True:
                yield version, here
                if here == point:
                    break
                here = here.parent
            break


def cgroup_cpu_limit() -> float | None:
    """CPUs allowed by this process's cgroup v2 (cpu.max) or v1 (cfs quota) limits, if any: the
    tightest of its own cgroup's and its ancestors'."""
    limits = []
    for version, base in _own_cgroups("cpu"):
        try:
            if version == 2:
                quota, period = (base / "cpu.max").read_text().split()[:2]
                if quota != "max":
                    limits.append(int(quota) / int(period))
            else:
                q = int((base / "cpu.cfs_quota_us").read_text())
                p = int((base / "cpu.cfs_period_us").read_text())
                if q > 0 and p > 0:
                    limits.append(q / p)
        except (OSError, ValueError):
            continue
    return min(limits, default=None)


def parse_cpu_list(text: str) -> set[int]:
    """'0-3,8,10-11' (taskset's and cpuset's notation) -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    try:
        for part in text.replace(" ", "").split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(f"CPU list {text!r}: expected a list such as 0-3,8") from None
    return cpus


def physical_cores(cpus: set[int]) -> int:
    """Distinct physical cores among `cpus` (SMT siblings count once)."""
    cores = set()
    for c in cpus:
        base = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        try:
            cores.add((base / "physical_package_id").read_text().strip() + ":" + (base / "core_id").read_text().strip())
        except OSError:
            cores.add(str(c))
    return len(cores) or len(cpus)


def default_threads(cpus: set[int] | None = None) -> int:
    """Physical cores this process may run on (or among `cpus`), capped by its cgroup quota.
    Matrix kernels gain nothing from SMT siblings and lose a lot to oversubscription."""
    try:
        cpus = cpus or os.sched_getaffinity(0)
    except (AttributeError, OSError):
        cpus = set(range(os.cpu_count() or 1))
    n = physical_cores(cpus)
    limit = cgroup_cpu_limit()
    if limit is not None:
        n = min(n, max(1, int(limit)))
    return max(1, n)


def available_memory() -> int:
    """Bytes this process can still allocate: MemAvailable, bounded by a cgroup limit."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    room = _cgroup_memory_room()
    if room is not None:
        avail = room if avail is None else min(avail, room)
    return avail if avail is not None else 8 << 30


def _cgroup_memory_room() -> int | None:
    """Bytes left under this process's memory cgroup limits (v2, or v1's memory controller), if
    any: the least room under its own cgroup's limit and its ancestors' (an ancestor's usage
    counts its children's, in v2 and in v1's hierarchy)."""
    rooms = []
    for version, base in _own_cgroups("memory"):
        files = ("memory.max", "memory.current") if version == 2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
        try:
            lim = (base / files[0]).read_text().strip()
            if lim == "max" or int(lim) >= 1 << 60:  # no limit (v1 writes a huge number)
                continue
            rooms.append(max(0, int(lim) - int((base / files[1]).read_text())))
        except (OSError, ValueError):  # the root cgroup has no memory.max; a controller not enabled
            continue
    return min(rooms, default=None)
