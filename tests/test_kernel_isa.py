"""Kernel coverage per instruction set: what this CPU runs, and what at least compiles.

Our kernels have AVX2, AVX-512, AVX-512 VNNI and AMX paths chosen at compile time; a native build
on an AVX2-only machine never compiles the wider ones, so their compile errors would show only on
other machines. Here every ggml-cpu source file our patches change is compiled to an object (code
generation included, the object thrown away) for each x86 level, with the exact flags of this
build but -O2. Which paths the loaded library actually ran is reported at the end of the test run
(tests/conftest.py) and recorded per CPU in docs/kernel-coverage.md.

Why objects, not -fsyntax-only: GCC reports an intrinsic used where its instruction set is not
enabled ("inlining failed in call to 'always_inline' '_mm512_add_ps': target specific option
mismatch") only when it inlines the intrinsic, a stage -fsyntax-only never reaches. Checked by
planting in a copy of f32-gemm.c, under `#if defined(__AVX2__)` only, a function that calls
_mm512_loadu_ps/_mm512_add_ps/_mm512_storeu_ps: -fsyntax-only at -march=haswell passed it, a
compile to an object fails (GCC 12). test_a_misguarded_intrinsic_fails_the_check keeps that
planted error, and an AVX-512 VNNI intrinsic under `#if defined(__AVX512F__)` only in a copy of
mla-attention.cpp (caught by the skylake-avx512 level, AVX-512F without VNNI), as positive
controls. With both plants put over the build tree's own files (by hand, in a private mount
namespace), test_kernels_compile_for failed at AVX2 and at AVX-512 and passed at AVX-512 VNNI.
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

# x86 level -> a -march that has exactly the features its paths test for; skylake-avx512 is
# AVX-512F/BW/VL without VNNI, the paths mla-attention.cpp and f32-gemm.c guard by __AVX512F__ alone
LEVELS = {"AVX2": "haswell", "AVX-512": "skylake-avx512", "AVX-512 VNNI": "icelake-server", "AMX": "sapphirerapids"}

# -O2, not the build's -O3 (a third faster here, the same headers) nor -O0: without __OPTIMIZE__
# GCC's intrinsic headers define the immediate-operand intrinsics as macros, which reject a
# constant passed through an inline helper that the optimized build accepts
OPT = "-O2"
# dependency-file options would write next to the build's own objects
_DEP_FLAGS = {"-MD", "-MMD"}
_DEP_FLAGS_WITH_VALUE = {"-MF", "-MT", "-MQ"}


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


def _entries() -> dict[str, dict]:
    """compile_commands.json's entry for each patched kernel source."""
    wanted = _patched_kernel_sources()
    entries = {}
    for e in _compile_commands():
        for rel in wanted:
            if e["file"].endswith("/llama.cpp/" + rel):
                entries[rel] = e
    assert set(entries) == set(wanted), f"not in compile_commands.json: {set(wanted) - set(entries)}"
    return entries


def _compile(e: dict, march: str, source: str | None = None) -> subprocess.CompletedProcess:
    """The build's command for entry `e`, for -march=`march` at OPT, to an object thrown away;
    `source`: compile that file instead (its quoted includes still found beside the original)."""
    args = shlex.split(e["command"]) if "command" in e else list(e["arguments"])
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o" or a in _DEP_FLAGS_WITH_VALUE:
            skip = True
            continue
        if a.startswith(("-march=", "-mtune=", "-O")) or a in _DEP_FLAGS:
            continue
        out.append(source if source and a == e["file"] else a)
    out[1:1] = [f"-march={march}", OPT, "-iquote", str(Path(e["file"]).parent)]
    out += ["-o", os.devnull]
    return subprocess.run(out, cwd=e["directory"], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_kernels_compile_for(level):
    march = LEVELS[level]
    entries = _entries()

    def check(rel: str) -> tuple[str, int, str]:
        r = _compile(entries[rel], march)
        return rel, r.returncode, r.stderr

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(check, sorted(entries)))
    bad = [(rel, err[-1500:]) for rel, rc, err in results if rc != 0]
    assert not bad, f"-march={march}: " + "\n".join(f"{rel}:\n{err}" for rel, err in bad)


# an intrinsic under a guard that does not enable its instruction set, appended to a copy of a
# kernel source; the level's -march has the guard's macro but not the intrinsic's instructions
PLANTED = {
    "AVX2": ("ggml/src/ggml-cpu/dsc/f32-gemm.c", """
#if defined(__AVX2__)
#include <immintrin.h>
void dsc_planted_misguard(float * p);
void dsc_planted_misguard(float * p) { _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), _mm512_set1_ps(1.0f))); }
#endif
"""),
    "AVX-512": ("ggml/src/ggml-cpu/dsc/mla-attention.cpp", """
#if defined(__AVX512F__)
#include <immintrin.h>
extern "C" void dsc_planted_misguard(int * p);
extern "C" void dsc_planted_misguard(int * p) {
    __m512i a = _mm512_loadu_si512(p);
    _mm512_storeu_si512(p, _mm512_dpbusd_epi32(a, a, a));
}
#endif
"""),
}


@pytest.mark.parametrize("level", sorted(PLANTED))
def test_a_misguarded_intrinsic_fails_the_check(level, tmp_path):
    """The positive control: the check above fails on a planted mis-guarded intrinsic, in the
    planted function (the copy's own code compiles in test_kernels_compile_for)."""
    rel, plant = PLANTED[level]
    e = _entries()[rel]
    planted = tmp_path / Path(rel).name
    planted.write_text(Path(e["file"]).read_text() + plant)
    r = _compile(e, LEVELS[level], str(planted))
    assert r.returncode != 0, f"-march={LEVELS[level]} compiled the planted {rel}"
    assert "dsc_planted_misguard" in r.stderr and "target specific option mismatch" in r.stderr, r.stderr[-1500:]
