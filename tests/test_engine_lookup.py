"""One rule finds deepseek-cpu's engine (_dropin.find_lib_dir), and every caller follows it:
the start-up drop-in, engine.lib_dir(), bench's --ours-lib and serve's llama-server."""
import json
import os
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import run_python
from deepseek_cpu import _dropin
from deepseek_cpu.runtime import engine, serve
from deepseek_cpu.tools import bench
from deepseek_cpu.cli import cli
from deepseek_cpu.errors import DeepseekCpuError


def fake_engine(d: Path, *names: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for n in names or ("libllama.so",):
        (d / n).write_bytes(b"")
    return d


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """No engine anywhere but where a test puts one: no $LLAMA_CPP_LIB_PATH, an empty
    package lib/, no installed deepseek_cpu/lib on sys.path."""
    monkeypatch.delenv(_dropin.ENV_LIB, raising=False)
    monkeypatch.delenv(serve.ENV_SERVER, raising=False)
    monkeypatch.setattr(_dropin, "LIB_DIR", str(tmp_path / "package" / "lib"))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not os.path.isdir(os.path.join(p, "deepseek_cpu", "lib"))])
    return tmp_path


def test_every_caller_agrees_on_llama_cpp_lib_path(nowhere, monkeypatch):
    lib = fake_engine(nowhere / "env-lib", "libllama.so", "llama-server")
    fake_engine(Path(_dropin.LIB_DIR), "libllama.so", "llama-server")  # ours exists, but the variable wins
    monkeypatch.setenv(_dropin.ENV_LIB, str(lib))
    assert _dropin.find_lib_dir() == str(lib)
    assert engine.lib_dir() == lib
    assert bench.ours_lib_dir() == lib
    assert serve.server_binary() == lib / "llama-server"


def test_every_caller_agrees_in_a_fresh_interpreter(tmp_path):
    """The same, as a user's process sees it: the .pth ran at start-up and left the variable alone."""
    lib = fake_engine(tmp_path / "env-lib", "libllama.so", "llama-server")
    code = ("import json, os\n"
            "from deepseek_cpu import _dropin\n"
            "from deepseek_cpu.runtime import engine, serve\n"
            "from deepseek_cpu.tools import bench\n"
            "print(json.dumps([os.environ['LLAMA_CPP_LIB_PATH'], _dropin.find_lib_dir(), str(engine.lib_dir()),\n"
            "                  str(bench.ours_lib_dir()), str(serve.server_binary().parent)]))\n")
    r = run_python(code, env_extra={"LLAMA_CPP_LIB_PATH": str(lib)},
                   unset=("DEEPSEEK_CPU_DISABLE", "DEEPSEEK_CPU_LLAMA_SERVER"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [str(lib)] * 5


def test_package_lib_then_installed_lib(nowhere, monkeypatch):
    """Without the variable: this package's lib/; without that (a source checkout on
    PYTHONPATH): deepseek_cpu/lib under a sys.path entry, the installed package's."""
    site = nowhere / "site-packages"
    installed = fake_engine(site / "deepseek_cpu" / "lib", "libllama.so", "llama-server")
    monkeypatch.setattr(sys, "path", sys.path + [str(site)])
    assert _dropin.find_lib_dir() == str(installed)
    assert engine.lib_dir() == bench.ours_lib_dir() == installed
    assert serve.server_binary() == installed / "llama-server"
    ours = fake_engine(Path(_dropin.LIB_DIR), "libllama.so", "llama-server")
    assert _dropin.find_lib_dir() == str(ours)
    assert engine.lib_dir() == bench.ours_lib_dir() == ours
    assert serve.server_binary() == ours / "llama-server"


def test_each_caller_asks_for_its_own_file(nowhere, monkeypatch):
    """A directory is the engine's only if it holds what the caller needs: a libllama.so
    without llama-server (a dev build) does not hide the installed server, and a variable
    pointing at a directory without libllama.so does not hide our library."""
    lib = fake_engine(nowhere / "env-lib", "libllama.so")
    ours = fake_engine(Path(_dropin.LIB_DIR), "libllama.so", "llama-server")
    monkeypatch.setenv(_dropin.ENV_LIB, str(lib))
    assert engine.lib_dir() == bench.ours_lib_dir() == lib
    assert serve.server_binary() == ours / "llama-server"
    monkeypatch.setenv(_dropin.ENV_LIB, str(nowhere / "empty"))
    assert bench.ours_lib_dir() == engine.lib_dir() == ours


def test_explicit_ours_lib_wins(nowhere, monkeypatch):
    explicit = fake_engine(nowhere / "explicit")
    env_lib = fake_engine(nowhere / "env-lib")
    fake_engine(Path(_dropin.LIB_DIR))
    monkeypatch.setenv(_dropin.ENV_LIB, str(env_lib))
    assert _dropin.find_lib_dir(str(explicit)) == str(explicit)
    assert bench.ours_lib_dir(str(explicit)) == explicit
    assert bench.ours_lib_dir() == engine.lib_dir() == env_lib  # without it, the variable


def test_explicit_ours_lib_reaches_the_runs(tmp_path, monkeypatch):
    """`deepseek-cpu bench --ours-lib DIR`: every run of ours loads DIR (not the variable's
    directory, nor the installed engine: sys.path is left as it is here)."""
    explicit = fake_engine(tmp_path / "explicit")
    monkeypatch.setenv(_dropin.ENV_LIB, str(fake_engine(tmp_path / "env-lib")))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"not a gguf")
    libs = []

    def fake_run_once(eng, lib, spec, timeout):
        libs.append((eng, lib))
        return {"ok": True, "load_s": 1.0, "pp_tok_s": 10.0, "tg_tok_s": 5.0, "peak_rss_bytes": 1,
                "library": str(lib / "libllama.so"), "build_info": "deepseek-cpu test"}

    monkeypatch.setattr(bench, "run_once", fake_run_once)
    res = CliRunner().invoke(cli, ["bench", str(model), "--ours-lib", str(explicit), "--repeat", "1",
                                   "--ctx-depth", "0", "--threads", "1", "--no-warm-cache"])
    assert res.exit_code == 0, res.output
    assert libs == [("ours", explicit), ("ours", explicit)]  # the untimed load, then the run


def test_not_found_errors(nowhere):
    with pytest.raises(FileNotFoundError, match="--ours-lib") as e:
        bench.ours_lib_dir()
    assert isinstance(e.value, DeepseekCpuError)
    with pytest.raises(FileNotFoundError):  # an explicit directory without a libllama.so is passed over
        bench.ours_lib_dir(str(nowhere))
    assert _dropin.find_lib_dir() is None
    assert engine.lib_dir() == Path(_dropin.LIB_DIR)  # nothing found: our lib/, as before
    with pytest.raises(serve.ServerNotFound, match=re.escape(f"llama-server not found in {_dropin.LIB_DIR};")) as e:
        serve.server_binary()
    assert isinstance(e.value, DeepseekCpuError)


def test_bench_reports_a_missing_engine_as_one_line(nowhere):
    model = nowhere / "m.gguf"
    model.write_bytes(b"not a gguf")
    res = CliRunner().invoke(cli, ["bench", str(model), "--no-warm-cache"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)
    assert "Error: deepseek-cpu's engine (deepseek_cpu/lib/libllama.so) was not found" in res.output


def test_tests_dir_beside_the_engine(nowhere, monkeypatch):
    lib = fake_engine(nowhere / "x" / "lib")
    (nowhere / "x" / "llama-tests").mkdir()
    monkeypatch.setenv(_dropin.ENV_LIB, str(lib))
    assert engine.tests_dir() == nowhere / "x" / "llama-tests"


def test_opt_out_leaves_llama_cpp_alone():
    """DEEPSEEK_CPU_DISABLE=1: neither start-up nor the package's own lookups point
    llama_cpp anywhere; `import llama_cpp` does not load our libllama."""
    code = ("import os\n"
            "from deepseek_cpu import _dropin\n"
            "from deepseek_cpu.runtime import engine\n"
            "from deepseek_cpu.tools import bench\n"
            "engine.lib_dir(); bench.ours_lib_dir(); _dropin.activate()\n"
            "print(os.environ.get('LLAMA_CPP_LIB_PATH', 'unset'), os.environ.get('MTMD_CPP_LIB', 'unset'))\n"
            "try:\n"
            "    import llama_cpp\n"
            "except Exception as e:\n"
            "    print('not loaded', type(e).__name__)\n"
            "else:\n"
            "    print('loaded', engine.mapped_libllama())\n")
    r = run_python(code, env_extra={"DEEPSEEK_CPU_DISABLE": "1"}, unset=("LLAMA_CPP_LIB_PATH", "MTMD_CPP_LIB"))
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.strip().splitlines()
    assert first == "unset unset"
    import deepseek_cpu
    ours = str((Path(deepseek_cpu.__file__).parent / "lib").resolve())
    assert not second.startswith("loaded " + ours), second


def test_an_explicit_ours_lib_without_the_engine_is_an_error(tmp_path):
    """bench --ours-lib DIR with no libllama.so in DIR must not quietly measure another engine."""
    from deepseek_cpu.tools import bench
    from deepseek_cpu.errors import DeepseekCpuError
    with pytest.raises(DeepseekCpuError, match="no libllama.so there"):
        bench.ours_lib_dir(str(tmp_path))
