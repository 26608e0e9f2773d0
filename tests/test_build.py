"""The build's source step: pin verification, unpacking and the patch series."""
import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "vendor"))
import prepare  # noqa: E402


def fake_sdist(tmp_path: Path, files: dict[str, bytes], name="fake.tar.gz") -> Path:
    p = tmp_path / name
    with tarfile.open(p, "w:gz") as tf:
        for n, data in files.items():
            ti = tarfile.TarInfo(n)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return p


def pin_for(path: Path, **kw) -> dict:
    d = {"name": "x", "version": "0", "filename": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
         "llama_cpp_dir": "pkg/vendor/llama.cpp", "llama_cpp_commit": "0" * 40}
    d.update(kw)
    return d


def run_prepare(env_extra: dict, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, str(REPO / "vendor" / "prepare.py"), *args],
                          capture_output=True, text=True, env=env)


def test_sha_mismatch_stops_the_build_with_a_clear_message(tmp_path):
    bad = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    bad.write_bytes(b"not the release")
    r = run_prepare({"DEEPSEEK_CPU_SDIST": str(bad)}, "--dest", str(tmp_path / "out"))
    assert r.returncode == 1
    assert "sha256 mismatch" in r.stderr and str(bad) in r.stderr
    assert not (tmp_path / "out").exists()


def test_cmake_configure_fails_on_a_bad_tarball(tmp_path):
    """The same failure through the real build entry point (CMake configure)."""
    bad = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    bad.write_bytes(b"\x1f\x8b truncated")
    env = {**os.environ, "DEEPSEEK_CPU_SDIST": str(bad)}
    r = subprocess.run(["cmake", "-S", str(REPO), "-B", str(tmp_path / "b"), "-G", "Ninja"],
                       capture_output=True, text=True, env=env)
    assert r.returncode != 0
    assert "sha256 mismatch" in r.stderr + r.stdout
    assert "preparing the pinned llama.cpp source failed" in r.stderr + r.stdout


def test_corrupt_tarball_with_matching_hash_is_reported(tmp_path):
    good = fake_sdist(tmp_path, {"pkg/vendor/llama.cpp/a.txt": b"hello\n" * 1000})
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(good.read_bytes()[:60])
    with pytest.raises(prepare.PrepareError, match="cannot unpack"):
        os.environ["DEEPSEEK_CPU_SDIST"] = str(cut)
        try:
            prepare.prepare(tmp_path / "out", patches=None, pin=pin_for(cut))
        finally:
            del os.environ["DEEPSEEK_CPU_SDIST"]
    assert not (tmp_path / "out").exists()


def test_patch_that_does_not_apply_is_named(tmp_path, monkeypatch):
    sd = fake_sdist(tmp_path, {"pkg/vendor/llama.cpp/a.txt": b"one\ntwo\nthree\n"})
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "0001-good.patch").write_text(
        "Description: ok\n---\n--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n")
    (pdir / "0002-bad.patch").write_text(
        "Description: stale\n---\n--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-zwei\n+ZWEI\n three\n")
    (pdir / "series").write_text("0001-good.patch\n0002-bad.patch\n")
    monkeypatch.setenv("DEEPSEEK_CPU_SDIST", str(sd))
    with pytest.raises(prepare.PrepareError, match="0002-bad.patch does not apply"):
        prepare.prepare(tmp_path / "out", patches=pdir, pin=pin_for(sd))
    assert not (tmp_path / "out").exists()
    (pdir / "series").write_text("0001-good.patch\n")
    prepare.prepare(tmp_path / "out", patches=pdir, pin=pin_for(sd))
    assert (tmp_path / "out" / "a.txt").read_text() == "one\nTWO\nthree\n"


DEP3_FIELDS = ("Description", "Author", "Origin", "Forwarded", "Last-Update", "Tested")
DEP3_OPTIONAL = ("Bug",)  # the upstream report, where one exists


def test_every_patch_has_a_dep3_header():
    """A short DEP-3 header (what, why, who, where from, the upstream report if any, forwarded,
    when, which tests) ends at the first '---' line. Only Description continues, with at most 3
    lines of why: 10 lines in all. How it works and what was measured go to docs/patch-notes.md,
    one section per patch."""
    series = [l.strip() for l in (REPO / "patches" / "series").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert series
    notes = (REPO / "docs" / "patch-notes.md").read_text()
    for name in series:
        head = (REPO / "patches" / name).read_text().split("\n---\n", 1)[0].split("\n")
        assert len(head) <= len(DEP3_FIELDS) + len(DEP3_OPTIONAL) + 3, f"{name}: header of {len(head)} lines; details go to docs/patch-notes.md"
        assert all(len(l) <= 100 for l in head), f"{name}: header line over 100 characters"
        fields, current = {}, None
        for line in head:
            if line.startswith(" "):
                assert current == "Description", f"{name}: only Description continues, not {current}: {line!r}"
                fields[current].append(line)
                continue
            key, sep, value = line.partition(": ")
            assert sep and key in DEP3_FIELDS + DEP3_OPTIONAL and key not in fields, f"{name}: unexpected header line {line!r}"
            assert value.strip(), f"{name}: empty {key}"
            fields[key], current = [value], key
        for key in DEP3_FIELDS:
            assert key in fields, f"{name} lacks {key}"
        assert len(fields["Description"]) <= 4, f"{name}: Description takes more than 3 continuation lines"
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", fields["Last-Update"][0]), f"{name}: Last-Update is not YYYY-MM-DD"
        assert f"\n## {name}\n" in notes, f"{name} has no section in docs/patch-notes.md"


def test_pinned_series_applies_to_the_pinned_source(tmp_path):
    """The real pin and series, from the cached (verified) tarball: what the build does."""
    pin = prepare.load_pin()
    if not (prepare.cache_dir() / pin["filename"]).exists() and "DEEPSEEK_CPU_SDIST" not in os.environ:
        pytest.skip("pinned sdist not cached (the package build caches it)")
    info = prepare.prepare(tmp_path / "llama.cpp")
    assert info["commit"] == pin["llama_cpp_commit"]
    src = (tmp_path / "llama.cpp" / "src" / "models" / "deepseek2.cpp").read_text()
    assert "n_layer() == 27" not in src  # the layer-count guess is gone


SERIES_GROUPS = ("fixes", "build", "memory", "rpc", "graph", "chat", "hooks")
# Lines our series may add inside llama.cpp's own files. Our code lives in patches/files/; the
# series holds fixes and the call sites that hook our files in, and moving to a newer llama.cpp
# means re-resolving exactly these lines. Raise it only for a new hook or fix, never for a kernel.
UPSTREAM_LINES_BUDGET = 1000


def _series_diffs() -> list[tuple[str, dict[str, tuple[list[str], list[str]]]]]:
    """Each patch of the series with, per file it touches, its added and removed lines."""
    out = []
    for name in prepare.read_series(REPO / "patches"):
        files, cur = {}, None
        for line in (REPO / "patches" / name).read_text().split("\n---\n", 1)[1].splitlines():
            if line.startswith("+++ "):
                cur = files.setdefault(line[6:] if line.startswith("+++ b/") else line[4:], ([], []))
            elif line.startswith("--- ") or line.startswith("diff ") or line.startswith("index "):
                continue
            elif cur is not None and line.startswith("+"):
                cur[0].append(line[1:])
            elif cur is not None and line.startswith("-"):
                cur[1].append(line[1:])
        out.append((name, files))
    return out


def test_series_is_fixes_and_hooks_none_rewriting_another():
    """The series is a set, not a history: each patch sits in its group's folder, touches only
    llama.cpp's own files (ours are plain files under patches/files/, never patched), and no patch
    removes a line an earlier patch added. The lines added inside upstream files stay in budget."""
    own = {f.relative_to(REPO / "patches" / "files").as_posix() for f in prepare.own_files(REPO / "patches")}
    added: dict[str, list[str]] = {}
    total = 0
    for name, files in _series_diffs():
        assert name.split("/")[0] in SERIES_GROUPS and name.count("/") == 1, f"{name}: not in one of {SERIES_GROUPS}"
        for path, (plus, minus) in files.items():
            assert path not in own, f"{name} patches our own file {path}: edit patches/files/{path} instead"
            earlier = added.get(path, [])
            rewritten = [l for l in minus if l.strip() and l in earlier]
            assert not rewritten, f"{name} removes lines an earlier patch added to {path}: {rewritten[:3]}"
            added.setdefault(path, []).extend(plus)
            total += len(plus)
    assert total <= UPSTREAM_LINES_BUDGET, f"the series adds {total} lines inside upstream files (budget {UPSTREAM_LINES_BUDGET})"
