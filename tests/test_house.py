"""The package's shape: no import circles, and every import goes down the layers.

The layers, lowest first (a module may import its own layer and the ones below it). The package's
face, deepseek_cpu/__init__.py, only re-exports lazily and is left out. Imports inside functions
count as much as those at the top: a lazy import that goes up is still a circle waiting to happen.
"""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "plugin" / "deepseek_cpu"

LAYERS = [
    # the foundations: errors, files written atomically, the cache, the GGUF header reader, the
    # plugin manager and its hook specifications, the drop-in's library lookup
    r"errors|atomic|cache|gguf_header|hookspecs|plugins|_dropin",
    # what quantization types and schemes are; the built-in converter's format
    r"quantization\.(types|schemes|registry|builtin)|converters(\..*)?",
    r"conversion(\..*)?",
    # the engine and what runs around it, below the drop-in Llama
    r"runtime\.(?!llama$).*",
    r"quantization\.(quantize|imatrix)",
    r"hub(\..*)?",
    # the drop-in Llama (its from_hub pulls), and what measures models through it
    r"runtime\.llama|quantization\.evaluate",
    r"tools(\..*)?",
    r"commands(\..*)?|cli|__main__",
]


def _modules() -> dict[str, Path]:
    mods = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    for f in (ROOT / "converters").glob("*.py"):  # shipped as deepseek_cpu.converters
        mods["converters" + ("" if f.stem == "__init__" else "." + f.stem)] = f
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        package = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("deepseek_cpu.")]
                names = [n.removeprefix("deepseek_cpu.") for n in names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                elif (node.module or "").startswith("deepseek_cpu"):
                    mod = node.module.removeprefix("deepseek_cpu").lstrip(".")
                else:
                    continue
                names = [f"{mod}.{a.name}".strip(".") for a in node.names]
            for n in names:
                t = resolve(n)
                if t and t != m and t != package:
                    edges[m].add(t)
    return edges


def _layer(m: str) -> int:
    for i, pattern in enumerate(LAYERS):
        if re.fullmatch(pattern, m):
            return i
    raise AssertionError(f"{m}: in no layer of tests/test_house.py")


def test_every_import_goes_down_the_layers():
    mods = _modules()
    up = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
          for m, ts in _imports(mods).items() if m for t in ts if t and _layer(t) > _layer(m)]
    assert up == [], "\n".join(sorted(up))


def test_no_import_circles():
    edges = _imports(_modules())
    edges.pop("", None)
    seen, circles = {}, []

    def visit(m, path):  # depth first; a module met again on the path closes a circle
        if m in path:
            circles.append(" -> ".join(path[path.index(m):] + [m]))
            return
        if seen.get(m):
            return
        for t in sorted(edges.get(m, ())):
            if t:
                visit(t, path + [m])
        seen[m] = True

    for m in sorted(edges):
        visit(m, [])
    assert circles == [], "\n".join(circles)


def test_the_library_has_no_command_line_inside():
    # click belongs to the commands (commands/, cli.py); the library reports by return values,
    # exceptions and callbacks
    users = sorted(m for m, f in _modules().items()
                   if re.search(r"^\s*(import click|from click)", f.read_text(encoding="utf-8"), re.M)
                   and not re.fullmatch(LAYERS[-1], m))
    assert users == []
