"""Loading files that may kill the process, in child processes: shared by the malformed-file tests.

The child (CHILD code of the caller) reads one job per stdin line, prints {"start": job} before it
tries one and a JSON result carrying the job under `key` after. A child that dies (a signal or an
exit) marks the job it was on as "died" and a fresh child goes on with the rest."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest


def run_in_children(child: str, jobs: list[str], key: str) -> dict[str, dict]:
    """job -> the child's result for it, or {"outcome": "died", "signal", "stderr"}."""
    results: dict[str, dict] = {}
    todo = list(jobs)
    while todo:
        proc = subprocess.run([sys.executable, "-c", child], input="\n".join(todo) + "\n", text=True,
                              capture_output=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
        current = None
        for line in proc.stdout.splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "start" in msg:
                current = msg["start"]
            else:
                results[msg[key]] = msg
                current = None
        if proc.returncode == 0:
            break
        if current is None:  # died outside a load: report it whole
            pytest.fail(f"loader child exited {proc.returncode} between files:\n{proc.stderr[-2000:]}")
        sig = -proc.returncode if proc.returncode < 0 else None
        results[current] = {key: current, "outcome": "died",
                            "signal": signal.Signals(sig).name if sig else f"exit {proc.returncode}",
                            "stderr": proc.stderr.strip().splitlines()[-3:]}
        todo = todo[todo.index(current) + 1:]
    return results
