"""This process's memory mappings, from /proc/self/maps: the one reader of that file.

The engine's libraries are found by what the dynamic loader mapped (engine.py), and a model's
weights by where its file is mapped (prefetch.py)."""
from __future__ import annotations

import os
from typing import NamedTuple


class Mapping(NamedTuple):
    start: int      # first address
    end: int        # one past the last
    offset: int     # file offset of `start`
    dev: int        # the file's device (os.makedev) and inode; 0 for anonymous memory
    inode: int
    path: str       # "" for anonymous memory


def mappings() -> list[Mapping]:
    """Every mapping of this process, in address order ([] where /proc is not readable)."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.rstrip("\n").split(maxsplit=5)
                if len(parts) < 5:
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                out.append(Mapping(lo, hi, int(parts[2], 16), os.makedev(major, minor), int(parts[4]),
                                   parts[5] if len(parts) > 5 else ""))
    except OSError:
        pass
    return out
