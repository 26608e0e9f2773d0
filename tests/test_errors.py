"""One error root: every exception class of the package derives from DeepseekCpuError,
and the CLI reports one as a single `Error: ...` line."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import click
from click.testing import CliRunner

import deepseek_cpu
from deepseek_cpu.cli import cli
from deepseek_cpu.errors import DeepseekCpuError

REPO = Path(__file__).resolve().parents[1]
# __main__ runs the CLI when imported. vendor/prepare.py (PrepareError) is not a module of
# the package: CMake runs it before the package exists, so it cannot import the root.
NOT_IMPORTED = {"deepseek_cpu.__main__"}


def package_exception_classes() -> list[type]:
    """Every exception class defined at the top level of one of the package's modules,
    found by walking them, so that a new module or class is checked without listing it."""
    found = []
    for info in pkgutil.walk_packages(deepseek_cpu.__path__, "deepseek_cpu."):
        if info.name in NOT_IMPORTED:
            continue
        mod = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(mod, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == mod.__name__:
                found.append(obj)
    return found


def test_every_package_exception_derives_from_the_root():
    classes = package_exception_classes()
    names = {c.__name__ for c in classes}
    # the walk reaches the converters and the plugin modules (a broken walk must not pass)
    assert {"ConversionError", "MissingTokenizer", "CheckpointError", "PullError", "EngineNotPatched"} <= names
    orphans = [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, DeepseekCpuError)]
    assert not orphans, f"exception classes not derived from DeepseekCpuError: {orphans}"


def test_standard_library_bases_are_kept():
    """Callers that catch ValueError / FileNotFoundError / OSError / RuntimeError keep working."""
    from deepseek_cpu.converters.base import ConversionError, UnsupportedArchitecture
    from deepseek_cpu.converters.checkpoint import CheckpointError, MissingShard
    from deepseek_cpu.converters.tokenizer import MissingTokenizer, UnsupportedTokenizer
    from deepseek_cpu.hub.download import ChecksumError
    from deepseek_cpu.runtime.engine import EngineNotPatched
    from deepseek_cpu.tools.stock import StockBuildError
    for cls, base in [(ConversionError, ValueError), (UnsupportedArchitecture, ValueError),
                      (CheckpointError, ValueError), (MissingShard, FileNotFoundError),
                      (MissingTokenizer, FileNotFoundError), (UnsupportedTokenizer, ValueError),
                      (ChecksumError, OSError), (EngineNotPatched, RuntimeError),
                      (StockBuildError, RuntimeError)]:
        assert issubclass(cls, base), (cls, base)
    e = MissingTokenizer("no tokenizer.json")
    assert str(e) == "no tokenizer.json" and isinstance(e, DeepseekCpuError)


def test_no_click_exception_outside_the_cli_layer():
    """Library code raises DeepseekCpuError subclasses; none of its classes is a click one."""
    assert not [c for c in package_exception_classes() if issubclass(c, click.ClickException)]


def test_converters_import_as_top_level_modules():
    """tokenizer.py and checkpoint.py also load without the package (a stand-in root), and
    share the real root when the package is importable."""
    code = (
        "import sys; sys.path.insert(0, {conv!r}); {block}"
        "import tokenizer, checkpoint\n"
        "assert issubclass(tokenizer.MissingTokenizer, FileNotFoundError)\n"
        "assert issubclass(checkpoint.MissingShard, FileNotFoundError)\n"
        "assert issubclass(checkpoint.CheckpointError, ValueError)\n"
        "print(tokenizer.DeepseekCpuError.__module__, checkpoint.DeepseekCpuError.__module__)\n")
    conv = str(REPO / "converters")
    for block, want in [("sys.modules['deepseek_cpu'] = None\n", "tokenizer checkpoint"),  # package hidden
                        ("\n", "deepseek_cpu.errors deepseek_cpu.errors")]:
        r = subprocess.run([sys.executable, "-c", code.format(conv=conv, block=block)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == want.split()


def _stderr_lines(res) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.strip()]


def test_cli_reports_a_library_error_as_one_line():
    class Boom(DeepseekCpuError, ValueError):
        pass

    @click.command("raise-boom")
    def raise_boom():
        raise Boom("the checkpoint is on fire; put it out")

    cli.add_command(raise_boom)  # the way plugins add their commands
    try:
        res = CliRunner().invoke(cli, ["raise-boom"])
    finally:
        cli.commands.pop("raise-boom", None)
    # handled by click (SystemExit), not an exception escaping the command
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.exc_info
    assert _stderr_lines(res) == ["Error: the checkpoint is on fire; put it out"]
    assert "Traceback" not in res.output


def test_cli_real_command_error_has_no_traceback(tmp_path):
    """End to end, in a fresh interpreter: a ConversionError from `convert` is one line."""
    missing = tmp_path / "no-such-checkpoint"
    r = subprocess.run([sys.executable, "-m", "deepseek_cpu", "convert", str(missing), str(tmp_path / "m.gguf")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert [ln for ln in r.stderr.splitlines() if ln.strip()] == [f"Error: {missing}: no such directory"]
    assert r.stdout == ""
