"""Kernel coverage per instruction set: what this CPU runs, and what at least compiles.

Our kernels have AVX2, AVX-512 (VNNI) and AMX paths chosen at compile time; a native build
on an AVX2-only machine never compiles the wider ones, so their compile errors would show
only on other machines. Here every ggml-cpu source file our patches change is compiled
(syntax and semantics, no code generation) for each x86 level, with the exact flags of this
build. Which paths the loaded library actually ran is reported at the end of the test run
(tests/conftest.py) and recorded per CPU in docs/kernel-coverage.md.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO

# x86 level -> a -march that has exactly the features its paths test for
LEVELS = {"AVX2": "haswell", "AVX-512 VNNI": "icelake-server", "AMX": "sapphirerapids"}


def _patched_kernel_sources() -> list[str]:
    """ggml-cpu C/C++ files that some patch in the series changes (paths in the llama.cpp tree)."""
    series = [l.strip() for l in (REPO / "patches" / "series").read_text().splitlines()
              if l.strip() and not l.startswith("#")]
    files = set()
    for name in series:
        for m in re.finditer(r"^\+\+\+ b/(\S+)", (REPO / "patches" / name).read_text(), re.M):
            path = m.group(1)
            if path.startswith("ggml/src/ggml-cpu/") and path.endswith((".c", ".cpp")):
                files.add(path)
    own = REPO / "patches" / "files"
    for f in (own / "ggml" / "src" / "ggml-cpu").rglob("*"):
        if f.suffix in (".c", ".cpp"):
            files.add(f.relative_to(own).as_posix())
    return sorted(files)


def _compile_commands() -> list[dict]:
    found = sorted(REPO.glob("build/*/compile_commands.json"))
    if not found:
        if os.environ.get("CI"):
            pytest.fail("no build/*/compile_commands.json: the package build did not run in this checkout")
        pytest.skip("no build/*/compile_commands.json in this checkout (the package was built elsewhere)")
    return json.loads(found[0].read_text())


def test_kernel_sources_are_found():
    files = _patched_kernel_sources()
    assert "ggml/src/ggml-cpu/arch/x86/repack.cpp" in files and len(files) >= 5, files


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_kernels_compile_for(level):
    march = LEVELS[level]
    wanted = _patched_kernel_sources()
    entries = {}
    for e in _compile_commands():
        for rel in wanted:
            if e["file"].endswith("/llama.cpp/" + rel):
                entries[rel] = e
    assert set(entries) == set(wanted), f"not in compile_commands.json: {set(wanted) - set(entries)}"

    def check(rel: str) -> tuple[str, int, str]:
        e = entries[rel]
        args = shlex.split(e["command"]) if "command" in e else list(e["arguments"])
        out = []
        skip = False
        for a in args:
            if skip:
                skip = False
                continue
            if a == "-o":
                skip = True
                continue
            if a.startswith("-march=") or a.startswith("-mtune="):
                continue
            out.append(a)
        out[1:1] = [f"-march={march}", "-fsyntax-only"]
        r = subprocess.run(out, cwd=e["directory"], capture_output=True, text=True, timeout=600)
        return rel, r.returncode, r.stderr

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(check, sorted(entries)))
    bad = [(rel, err[-1500:]) for rel, rc, err in results if rc != 0]
    assert not bad, f"-march={march}: " + "\n".join(f"{rel}:\n{err}" for rel, err in bad)
