"""Facts that live in one place, checked against the code that uses them. Pure file reading: no
build, no model, no subprocess.

- Every DEEPSEEK_CPU_* environment variable the package, the converters, the engine (our files
  and the lines the series adds), the build or the test suite reads is in docs/engine.md's list,
  and the list names no variable nothing reads any more.
- Every compile-time tuning constant is a GGML_DSC_* macro in dsc-tuning.h, and docs/engine.md's
  table lists exactly those.
- The docs do not cite the numbers of the retired 65-patch series (0001-0064).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENGINE_MD = REPO / "docs" / "engine.md"
TUNING_H = REPO / "patches" / "files" / "ggml" / "src" / "ggml-cpu" / "dsc" / "dsc-tuning.h"

VAR = re.compile(r"DEEPSEEK_CPU_[A-Z0-9_]+")
C_SOURCES = (".c", ".cpp", ".h", ".hpp", ".inc")


def _section(text: str, heading: str) -> str:
    """The body of a '## heading' section of a markdown page, up to the next '## ' heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def _python_mentions(path: Path) -> set[str]:
    """String literals that are exactly a variable's name: what a module reads from os.environ (or
    getenv), names as a constant it reads through, or sets for a process it starts."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and VAR.fullmatch(node.value):
            names.add(node.value)
    return names


def _python_reads(path: Path) -> set[str]:
    """Variables a test module reads itself: os.environ.get / os.getenv / os.environ[...] / `in
    os.environ` (the suite also sets many engine variables for the processes it starts; those are
    checked where the engine reads them)."""
    def is_environ(n: ast.AST) -> bool:
        return isinstance(n, ast.Attribute) and n.attr == "environ"

    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        arg = None
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if isinstance(f, ast.Attribute) and (f.attr == "getenv" or (f.attr == "get" and is_environ(f.value))):
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            arg = node.slice
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            arg = node.left
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and VAR.fullmatch(arg.value):
            names.add(arg.value)
    return names


def _c_mentions(text: str) -> set[str]:
    """C/C++ string literals that are exactly a variable's name (getenv("X"), env_long("X", ...))."""
    return {m.group(1) for m in re.finditer(r'"(DEEPSEEK_CPU_[A-Z0-9_]+)"', text)}


def variables_read() -> dict[str, list[str]]:
    """Every DEEPSEEK_CPU_* variable read anywhere, with where (relative paths)."""
    found: dict[str, list[str]] = {}

    def add(names: set[str], where: Path) -> None:
        for n in names:
            found.setdefault(n, []).append(where.relative_to(REPO).as_posix())

    for folder in ("plugin", "converters", "vendor"):
        for f in sorted((REPO / folder).rglob("*.py")):
            add(_python_mentions(f), f)
    for f in sorted((REPO / "tests").glob("*.py")):
        if f.name != Path(__file__).name:
            add(_python_reads(f), f)
    for f in sorted((REPO / "patches" / "files").rglob("*")):
        if f.suffix in C_SOURCES:
            add(_c_mentions(f.read_text(encoding="utf-8", errors="replace")), f)
    for f in sorted((REPO / "patches").rglob("*.patch")):
        added = "\n".join(l[1:] for l in f.read_text(encoding="utf-8", errors="replace").splitlines()
                          if l.startswith("+") and not l.startswith("+++"))
        add(_c_mentions(added), f)
    # the build: pip install's environment, passed to CMake by scikit-build-core
    defines = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["scikit-build"]["cmake"]["define"]
    add({d["env"] for d in defines.values() if isinstance(d, dict) and VAR.fullmatch(d.get("env", ""))},
        REPO / "pyproject.toml")
    return found


def variables_documented() -> set[str]:
    """The names in the first column of docs/engine.md's environment-variable tables."""
    body = _section(ENGINE_MD.read_text(encoding="utf-8"), "Environment variables")
    return set(re.findall(r"^\| `(DEEPSEEK_CPU_[A-Z0-9_]+)` \|", body, re.M))


def test_every_environment_variable_read_is_documented_and_no_other():
    read = variables_read()
    documented = variables_documented()
    assert len(read) >= 20, f"found only {sorted(read)}: has the code moved?"
    missing = {n: read[n] for n in sorted(set(read) - documented)}
    assert not missing, ("read by the code but missing from docs/engine.md's 'Environment variables' tables: "
                         + "; ".join(f"{n} ({', '.join(w)})" for n, w in missing.items()))
    stale = sorted(documented - set(read))
    assert not stale, f"docs/engine.md lists variables nothing reads any more: {stale}"


def tuning_constants() -> list[str]:
    """The #ifndef-overridable macros of dsc-tuning.h, in order."""
    return re.findall(r"^#ifndef (\w+)\n#define \1\b", TUNING_H.read_text(encoding="utf-8"), re.M)


def test_tuning_constants_are_one_prefix_in_one_header_and_documented():
    consts = tuning_constants()
    assert len(consts) >= 15, consts
    assert len(consts) == len(set(consts))
    odd = [c for c in consts if not c.startswith("GGML_DSC_")]
    assert not odd, f"tuning constants not named GGML_DSC_*: {odd}"
    # no overridable tuning macro of ours outside the header
    elsewhere = []
    for f in sorted((REPO / "patches" / "files").rglob("*")):
        if f.suffix in C_SOURCES and f != TUNING_H:
            for m in re.finditer(r"^\s*#\s*ifndef (\w*DSC_\w+)\s*\n\s*#\s*define \1\b", f.read_text(encoding="utf-8"), re.M):
                elsewhere.append(f"{f.relative_to(REPO)}: {m.group(1)}")
    assert not elsewhere, f"overridable tuning constants outside dsc-tuning.h: {elsewhere}"
    body = _section(ENGINE_MD.read_text(encoding="utf-8"), "Tuning constants (compile time)")
    table = re.findall(r"^\| [^|]+ \| `(\w+)` \|", body, re.M)
    assert sorted(table) == sorted(consts), (
        f"docs/engine.md's tuning table and dsc-tuning.h differ: only in the table {sorted(set(table) - set(consts))}, "
        f"only in the header {sorted(set(consts) - set(table))}")


def test_docs_cite_no_retired_patch_numbers():
    """The 65-patch series (0001-0064) was folded into patches/files/ and named patches; its numbers
    name nothing in the tree any more. (Results files such as m10-0064-*.json keep their names.)"""
    hits = []
    for f in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "patches").rglob("*"))]:
        if f.is_file():
            for i, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if re.search(r"(?<![\w.-])00\d\d\b", line):
                    hits.append(f"{f.relative_to(REPO)}:{i}: {line.strip()[:80]}")
    assert not hits, "retired patch numbers cited:\n" + "\n".join(hits)
