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
    for name in ("convert", "info", "plugins", "demo", "run", "chat", "serve", "pull", "synth", "bench"):
        assert f"  {name}" in r.stdout, name


def test_plugins_lists_builtins_with_their_hooks():
    r = cli("plugins", "--json")
    rows = {p["name"]: p for p in json.loads(r.stdout)}
    assert "deepseek_cpu_converter" in rows["deepseek_cpu.converters.deepseek"]["hooks"]
    assert "deepseek_cpu_register_commands" in rows["deepseek_cpu.demo"]["hooks"]
