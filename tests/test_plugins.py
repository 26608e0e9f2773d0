"""The plugin layer: an external package adds an architecture without touching this repo.

The external plugin is a fake *installed distribution* written into tmp_path: a
`myplugin-0.1.dist-info/` (METADATA + entry_points.txt declaring the `deepseek_cpu` group)
next to its module, put on sys.path of a fresh interpreter, so that it is discovered
through entry points exactly as a pip-installed plugin would be.

Its `deepseek_cpu_converter` hook claims `TinyToyForCausalLM` (checkpoints laid out like
DeepSeek-V2; its converter subclasses ours and adds one metadata key), and its
`deepseek_cpu_tensor_transforms` hook doubles `output_norm.weight` for its own
conversions only.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, fixture_dir

SMALL = "v2_greedy"
TOY = "TinyToyForCausalLM"

PLUGIN_MODULE = f'''
"""A third-party deepseek-cpu plugin: the {TOY} architecture."""
from deepseek_cpu.hookspecs import hookimpl
from deepseek_cpu.converters.deepseek import DeepseekConverter

ARCH = "{TOY}"


class TinyToyConverter(DeepseekConverter):
    """{TOY} checkpoints use DeepSeek-V2's tensor layout."""

    def __init__(self, config, model_dir):
        super().__init__(config, model_dir)
        self.hf_arch = ARCH

    def write_metadata(self, w):
        super().write_metadata(w)
        w.add_string("tinytoy.converted_by", "myplugin")


@hookimpl
def deepseek_cpu_supported_architectures():
    return [ARCH]


@hookimpl
def deepseek_cpu_converter(config, model_dir):
    if ARCH in (config.get("architectures") or []):
        return TinyToyConverter(config, model_dir)
    return None


@hookimpl
def deepseek_cpu_tensor_transforms(converter):
    if not isinstance(converter, TinyToyConverter):
        return []

    def double_output_norm(name, data):
        return data * 2.0 if name == "output_norm.weight" else data
    return [double_output_norm]
'''


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    """A directory that looks like site-packages holding the installed `myplugin` 0.1."""
    site = tmp_path_factory.mktemp("site")
    (site / "myplugin_mod.py").write_text(PLUGIN_MODULE)
    info = site / "myplugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myplugin\nVersion: 0.1\nSummary: test plugin\n")
    (info / "entry_points.txt").write_text("[deepseek_cpu]\nmyplugin = myplugin_mod\n")
    (info / "RECORD").write_text("")
    return site


@pytest.fixture(scope="module")
def toy_checkpoint(tmp_path_factory):
    """v2_greedy renamed to the new architecture (same directory name, so same general.name)."""
    model = tmp_path_factory.mktemp("toy") / SMALL
    shutil.copytree(fixture_dir(SMALL), model, ignore=shutil.ignore_patterns("reference.npz"))
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(architectures=[TOY], model_type="tinytoy")
    (model / "config.json").write_text(json.dumps(cfg))
    return model


def cli(args, site=None, load_plugins=None, timeout=120):
    """`python -m deepseek_cpu ARGS` in a fresh interpreter, with `site` on its path."""
    env = dict(os.environ)
    paths = [str(site)] if site else []
    paths += [str((REPO / p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("DEEPSEEK_CPU_LOAD_PLUGINS", None)
    if load_plugins is not None:
        env["DEEPSEEK_CPU_LOAD_PLUGINS"] = load_plugins
    return subprocess.run([sys.executable, "-m", "deepseek_cpu", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=str(site or REPO))


def plugin_rows(**kw):
    r = cli(["plugins", "--json"], **kw)
    assert r.returncode == 0, r.stderr
    return {row["name"]: row for row in json.loads(r.stdout)}


BUILTIN = "deepseek_cpu.converters.deepseek"


def test_builtin_plugin_listed():
    rows = plugin_rows(load_plugins="")
    assert BUILTIN in rows, rows
    b = rows[BUILTIN]
    assert {"deepseek_cpu_converter", "deepseek_cpu_supported_architectures"} <= set(b["hooks"]), b
    assert "built-in" in b["package"]


def test_external_plugin_listed_with_version_and_hooks(plugin_site):
    rows = plugin_rows(site=plugin_site)
    assert "myplugin" in rows, rows
    p = rows["myplugin"]
    assert (p["package"], p["version"]) == ("myplugin", "0.1"), p
    assert p["hooks"] == ["deepseek_cpu_converter", "deepseek_cpu_supported_architectures",
                          "deepseek_cpu_tensor_transforms"], p
    assert BUILTIN in rows  # built-ins stay


def test_plain_listing_names_the_plugin(plugin_site):
    r = cli(["plugins"], site=plugin_site)
    assert r.returncode == 0, r.stderr
    assert "myplugin  (myplugin 0.1)" in r.stdout, r.stdout


def test_load_plugins_env_var(plugin_site):
    none = plugin_rows(site=plugin_site, load_plugins="")
    assert "myplugin" not in none and BUILTIN in none
    only = plugin_rows(site=plugin_site, load_plugins="myplugin")
    assert "myplugin" in only and BUILTIN in only
    # loaded by name it is still reported as the distribution that ships it
    assert (only["myplugin"]["package"], only["myplugin"]["version"]) == ("myplugin", "0.1"), only["myplugin"]
    other = plugin_rows(site=plugin_site, load_plugins="someotherplugin")
    assert "myplugin" not in other


def _read(path):
    import gguf
    r = gguf.GGUFReader(str(path))
    tensors = {t.name: np.array(t.data) for t in r.tensors}
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return meta, tensors


def test_external_plugin_converts_new_architecture(plugin_site, toy_checkpoint, tmp_path, converted):
    out = tmp_path / "toy.gguf"
    r = cli(["convert", toy_checkpoint, out, "--outtype", "f32", "--quiet"], site=plugin_site)
    assert r.returncode == 0, r.stderr
    assert out.exists() and "wrote" in r.stdout

    meta, tensors = _read(out)
    ref_meta, ref_tensors = _read(converted(SMALL, "f32"))  # the built-in converter, in-process
    # the plugin's converter ran (its own metadata key) ...
    assert meta.pop("tinytoy.converted_by") == "myplugin"
    assert meta == ref_meta
    # ... and its transform too: exactly one tensor changed, doubled
    assert sorted(tensors) == sorted(ref_tensors)
    changed = [n for n in tensors if not np.array_equal(tensors[n], ref_tensors[n])]
    assert changed == ["output_norm.weight"], changed
    np.testing.assert_array_equal(tensors["output_norm.weight"], 2.0 * ref_tensors["output_norm.weight"])


def test_plugin_transform_not_applied_to_other_converters(plugin_site, tmp_path, converted):
    out = tmp_path / "v2.gguf"
    r = cli(["convert", fixture_dir(SMALL), out, "--outtype", "f32", "--quiet"], site=plugin_site)
    assert r.returncode == 0, r.stderr
    _, tensors = _read(out)
    _, ref = _read(converted(SMALL, "f32"))
    assert all(np.array_equal(tensors[n], ref[n]) for n in ref)


def test_new_architecture_unsupported_without_plugin(plugin_site, toy_checkpoint, tmp_path):
    out = tmp_path / "toy.gguf"
    r = cli(["convert", toy_checkpoint, out, "--quiet"], site=plugin_site, load_plugins="")
    assert r.returncode != 0
    assert f"architecture {TOY} is not supported" in r.stderr, r.stderr
    assert "supported: DeepseekV2ForCausalLM, DeepseekV32ForCausalLM, DeepseekV3ForCausalLM" in r.stderr
    assert TOY not in r.stderr.split("supported:")[-1]
    assert not out.exists()


def test_unsupported_message_lists_plugin_architectures(plugin_site, tmp_path):
    model = tmp_path / "llama"
    shutil.copytree(fixture_dir(SMALL), model, ignore=shutil.ignore_patterns("reference.npz"))
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (model / "config.json").write_text(json.dumps(cfg))
    r = cli(["convert", model, tmp_path / "x.gguf", "--quiet"], site=plugin_site)
    assert r.returncode != 0
    supported = r.stderr.split("supported:")[-1]
    for arch in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", TOY):
        assert arch in supported, r.stderr


def test_python_api_sees_registered_plugin(tmp_path, toy_checkpoint):
    """In-process registration (pm.register) works the same as an entry point."""
    code = textwrap.dedent(f"""
        import sys, types
        sys.path.insert(0, {str(tmp_path)!r})
        from deepseek_cpu import plugins
        from deepseek_cpu.conversion.convert import convert, supported_architectures
        mod = types.ModuleType("inline_toy")
        exec({PLUGIN_MODULE!r}, mod.__dict__)
        plugins.load().register(mod, name="inline_toy")
        assert "{TOY}" in supported_architectures(), supported_architectures()
        convert({str(toy_checkpoint)!r}, {str(tmp_path / 'api.gguf')!r}, outtype="f32", progress=False)
        print("ok")
    """)
    env = dict(os.environ, DEEPSEEK_CPU_LOAD_PLUGINS="")
    env["PYTHONPATH"] = os.pathsep.join(str((REPO / p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.stdout.strip() == "ok", r.stderr
    assert (tmp_path / "api.gguf").exists()
