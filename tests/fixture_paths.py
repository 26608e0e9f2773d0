"""Where the test fixtures live: the one place that knows.

The tiny checkpoints are tests/fixtures/<name>/, except `v2_group`: it is also the model
`deepseek-cpu demo` embeds, so it is package data, plugin/deepseek_cpu/data/tiny-deepseek-v2,
and ships in the wheel from there. conftest.py re-exports these names for the tests; the
generators in tests/fixtures/ (run in a venv with transformers but no pytest, so they cannot
import conftest) import this module directly.
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
# fixture name -> its directory, for the fixtures that are package data
PACKAGE_DATA = {"v2_group": REPO / "plugin" / "deepseek_cpu" / "data" / "tiny-deepseek-v2"}


def fixture_dir(name: str) -> Path:
    """The directory of fixture checkpoint `name` (or of another entry of tests/fixtures)."""
    return PACKAGE_DATA.get(name, FIXTURES / name)


def checkpoint_names() -> list[str]:
    """Every fixture checkpoint: the directories holding transformers' reference.npz."""
    names = {p.name for p in FIXTURES.iterdir() if p.is_dir()} if FIXTURES.is_dir() else set()
    return sorted(n for n in names | set(PACKAGE_DATA) if (fixture_dir(n) / "reference.npz").exists())


def cached_sdist() -> tuple[Path, dict] | None:
    """(the pinned llama-cpp-python sdist vendor/prepare.py cached, its [sdist] pin), or None."""
    import tomllib
    pin = tomllib.loads((REPO / "vendor" / "pin.toml").read_text())["sdist"]
    sys.path.insert(0, str(REPO / "vendor"))
    try:
        import prepare
        tarball = prepare.cache_dir() / pin["filename"]
    finally:
        sys.path.pop(0)
    return (tarball, pin) if tarball.exists() else None
