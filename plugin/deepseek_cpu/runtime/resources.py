"""How much CPU and memory this process may really use (affinity, cgroup quota)."""
from __future__ import annotations

import os
from pathlib import Path


def cgroup_cpu_limit() -> float | None:
    """CPUs allowed by a cgroup v2 (cpu.max) or v1 (cfs quota) limit, if any."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        q = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        p = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        if q > 0 and p > 0:
            return q / p
    except (OSError, ValueError):
        pass
    return None


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


def default_threads() -> int:
    """Physical cores this process may run on, capped by its cgroup quota. Matrix kernels
    gain nothing from SMT siblings and lose a lot to oversubscription."""
    try:
        cpus = os.sched_getaffinity(0)
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
    """Bytes left under this process's memory cgroup limit (v2, or v1's memory controller), if any."""
    try:
        groups = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        groups = []
    for line in groups:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hid == "0" and controllers == "":  # v2: the unified hierarchy
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            files = ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):  # v1
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        try:
            lim = (base / files[0]).read_text().strip()
            if lim == "max" or int(lim) >= 1 << 60:  # no limit (v1 writes a huge number)
                continue
            return int(lim) - int((base / files[1]).read_text())
        except (OSError, ValueError):
            continue
    return None
