"""A command that needs an optional package that is not installed says which one and how to install
it, in one `Error:` line, before doing any work; never a traceback."""
import sys

from click.testing import CliRunner

from deepseek_cpu.cli import cli


def test_experts_png_without_matplotlib_is_one_line_error(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    from deepseek_cpu.commands import experts
    measured = []
    monkeypatch.setattr(experts, "measure", lambda *a, **k: measured.append(a))
    model, text = tmp_path / "m.gguf", tmp_path / "t.txt"
    model.write_bytes(b"GGUF")
    text.write_text("hello")
    r = CliRunner().invoke(cli, ["experts", str(model), "--text", str(text), "--png", str(tmp_path / "o.png")])
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exc_info
    lines = r.output.strip().splitlines()
    assert lines == ["Error: --png needs matplotlib, which is not installed: pip install 'deepseek-cpu[plots]'"], r.output
    assert not measured  # refused before the model was loaded
    assert not (tmp_path / "o.png").exists()


def test_the_plots_extra_exists():
    import tomllib

    from conftest import REPO
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("matplotlib") for d in extras["plots"])
