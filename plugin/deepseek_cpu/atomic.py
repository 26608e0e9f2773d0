"""Outputs written atomically: a private name beside the output, renamed over it at the end.

A reader never sees half a file and a failed write leaves the old output alone (the rename is
atomic because the private name is on the same file system). The file is created the way a
plain open() creates one, so it ends with the mode the user's umask gives (0644 under the usual
022), not mkstemp's 0600: a model that one user or container makes, another can read.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path


def partial_path(out: Path, suffix: str = ".partial") -> Path:
    """A new empty file beside `out`, named so that no other writer (process or thread) picks
    the same name; the caller writes it and then `os.replace`s it over `out`, or unlinks it."""
    out = Path(out)
    parent = out.parent if str(out.parent) else Path(".")
    tmp = parent / f".{out.name}.{os.getpid()}-{secrets.token_hex(4)}{suffix}"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    return tmp


def write_text(path: Path, text: str) -> None:
    """`path` holds `text` whole, or is as it was."""
    tmp = partial_path(path, ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
