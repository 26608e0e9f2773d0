"""Child processes our commands supervise (llama-server, ggml-rpc-server)."""
from __future__ import annotations

import ctypes
import signal


def die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the parent dies (no orphan servers)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
