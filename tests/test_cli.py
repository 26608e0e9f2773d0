"""The README's first command ends in `deepseek-cpu demo`; it must work on a fresh install."""
import json
import subprocess
import sys


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "deepseek_cpu", *args], capture_output=True, text=True, timeout=timeout)


def test_demo_converts_runs_and_checks_against_transformers():
    r = cli("demo")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "max relative error" in r.stdout and "(OK," in r.stdout
    assert "engine: deepseek-cpu" in r.stdout


def test_help_lists_the_commands():
    r = cli("--help")
    assert r.returncode == 0
    for name in ("convert", "info", "plugins", "demo", "run", "chat", "serve", "pull", "synth", "bench",
                 "schemes", "quantize", "imatrix", "eval"):
        assert f"  {name}" in r.stdout, name


def test_plugins_lists_builtins_with_their_hooks():
    r = cli("plugins", "--json")
    rows = {p["name"]: p for p in json.loads(r.stdout)}
    assert "deepseek_cpu_converter" in rows["deepseek_cpu.converters.deepseek"]["hooks"]
    assert "deepseek_cpu_register_commands" in rows["deepseek_cpu.commands.demo"]["hooks"]


def test_info_shows_the_series_hash_and_one_patch_per_line():
    from deepseek_cpu.runtime.engine import source_info
    src = source_info()  # deepseek-cpu-source.json next to the library
    r = cli("info", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["series_sha256"] == src["series_sha256"] and len(d["series_sha256"]) == 64
    int(d["series_sha256"], 16)
    assert d["patches"] == src["patches"]
    if d["build_info"]:  # the build marker carries the hash's first 12 digits
        assert f"series {d['series_sha256'][:12]}" in d["build_info"]
    r = cli("info")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert f"series sha256    {d['series_sha256']}" in lines
    first = lines.index(f"patches          {d['patches'][0]}")
    assert lines[first + 1:first + len(d["patches"])] == [" " * 17 + p for p in d["patches"][1:]]


def test_engine_info_without_a_source_record(monkeypatch):
    from deepseek_cpu.runtime import engine
    monkeypatch.setattr(engine, "source_info", lambda: {})
    e = engine.engine_info()
    assert (e.series_sha256, e.patches, e.llama_cpp_commit) == ("unknown", [], "unknown")
