"""The converter on bad input, interrupted, out of disk, and on transformers 5 configs.

Every failure must be a clear error (its type and a message naming the problem) and
leave nothing behind: no .gguf at the output path and no `.partial` temporary next to it.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from conftest import CHECKPOINTS, FIXTURES, REPO, fixture_dir

from deepseek_cpu import plugins
from deepseek_cpu.conversion.convert import convert
from deepseek_cpu.converters.base import ConversionError, UnsupportedArchitecture
from deepseek_cpu.converters.checkpoint import CheckpointError, MissingShard
from deepseek_cpu.converters.tokenizer import MissingTokenizer
from deepseek_cpu.hookspecs import hookimpl

SMALL = "v2_greedy"  # the smallest fixture (~0.5 MB of bf16; ~1.1 MB as an f32 GGUF)
SHARD2 = "model-00002-of-00002.safetensors"


def copy_fixture(dest: Path, name: str = SMALL) -> Path:
    """A private copy of a fixture checkpoint (without the reference logits)."""
    shutil.copytree(fixture_dir(name), dest, ignore=shutil.ignore_patterns("reference.npz"))
    return dest


def edit_config(model: Path, **changes) -> None:
    p = model / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(changes)
    p.write_text(json.dumps(cfg))


def assert_nothing_written(out_dir: Path) -> None:
    left = sorted(p.name for p in out_dir.iterdir())
    assert left == [], f"conversion left files behind in {out_dir}: {left}"


@pytest.fixture
def out_dir(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    return d


def check_fails(model, out_dir, exc_type, *needles):
    """convert() raises exc_type whose message contains every needle; nothing is written."""
    with pytest.raises(exc_type) as ei:
        convert(model, out_dir / "model.gguf", outtype="f32", progress=False)
    msg = str(ei.value)
    for n in needles:
        assert n in msg, f"{exc_type.__name__} message lacks {n!r}: {msg}"
    assert "\n" not in msg, f"multi-line message: {msg!r}"
    assert_nothing_written(out_dir)
    return msg


# -- bad input ---------------------------------------------------------------------


def test_good_input_converts(tmp_path, out_dir):
    """The positive control for every case below: the same copy converts."""
    model = copy_fixture(tmp_path / SMALL)
    out = convert(model, out_dir / "model.gguf", outtype="f32", progress=False)
    assert sorted(p.name for p in out_dir.iterdir()) == ["model.gguf"]
    assert out.stat().st_size > 900_000
    # a normal file's mode (0666 less the umask), not the 0600 of a private temporary
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


V32 = dict(architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32",
           index_n_heads=8, index_head_dim=64, index_topk=16)


@pytest.mark.parametrize("change, needles", [
    ({"index_topk": None}, ("lacks index_topk",)),
    ({"index_n_heads": 0}, ("index_n_heads must be a positive integer, not 0",)),
    ({"index_head_dim": 32}, ("index_head_dim 32 is not supported", "power of two >= 64")),
    ({"index_head_dim": 96}, ("index_head_dim 96 is not supported",)),
    ({"q_lora_rank": None}, ("lacks q_lora_rank",)),
])
def test_v32_indexer_settings_the_engine_cannot_run_are_clear_errors(tmp_path, out_dir, change, needles):
    """DeepSeek-V3.2's indexer as the engine can run it, else one line naming the key: 32-wide
    heads abort llama.cpp at context creation (its Hadamard rotation has no 32x32 matrix)."""
    model = copy_fixture(tmp_path / "v3", "v3_noaux")
    edit_config(model, **{**V32, **change})
    check_fails(model, out_dir, ConversionError, "config.json", *needles)


def test_unsupported_architecture_lists_supported(tmp_path, out_dir):
    model = copy_fixture(tmp_path / SMALL)
    edit_config(model, architectures=["LlamaForCausalLM"], model_type="llama")
    msg = check_fails(model, out_dir, UnsupportedArchitecture, "LlamaForCausalLM",
                      "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
    assert "not supported" in msg
    assert issubclass(UnsupportedArchitecture, ConversionError)


def test_missing_shard(tmp_path, out_dir):
    model = copy_fixture(tmp_path / SMALL)
    (model / SHARD2).unlink()
    check_fails(model, out_dir, MissingShard, SHARD2, "missing")


@pytest.mark.parametrize("key, value, tensor", [
    ("hidden_size", 72, "model.embed_tokens.weight"),
    ("kv_lora_rank", 48, "self_attn.kv_a_proj_with_mqa.weight"),
    ("n_routed_experts", 6, "mlp.gate.weight"),
])
def test_config_weight_shape_mismatch(tmp_path, out_dir, key, value, tensor):
    model = copy_fixture(tmp_path / SMALL)
    edit_config(model, **{key: value})
    msg = check_fails(model, out_dir, CheckpointError, tensor, "config.json")
    assert "shape" in msg or "not understood" in msg


def _drop_tensor(model: Path, name: str) -> None:
    """Remove `name` from its shard's header and from the index (its bytes stay, unreferenced)."""
    index = json.loads((model / "model.safetensors.index.json").read_text())
    shard = model / index["weight_map"].pop(name)
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    del header[name]
    new = json.dumps(header, separators=(",", ":")).encode()
    assert len(new) <= n
    new = new.ljust(n)  # same length: the data offsets stay valid
    shard.write_bytes(data[:8] + new + data[8 + n:])


@pytest.mark.parametrize("change, exc, needles", [
    (("config", {"weight_block_size": [16, 16]}), CheckpointError, ("weight_scale_inv has shape", "16x16 blocks needs")),
    (("config", {"weight_block_size": "128"}), ConversionError, ("weight_block_size must be two positive integers",)),
    (("config", {"fmt": "e5m2"}), ConversionError, ("fp8 format 'e5m2' is not supported",)),
    (("drop", "model.layers.1.self_attn.o_proj.weight_scale_inv"), CheckpointError,
     ("model.layers.1.self_attn.o_proj.weight has no",)),
])
def test_fp8_checkpoint_damage_is_a_clear_error(tmp_path, out_dir, change, exc, needles):
    """DeepSeek's FP8 release format (e4m3 weights, float32 scales per block): a scale that does not
    fit its weight's blocks, a missing scale, a block size or format we cannot read -- one line
    naming the tensor or key, nothing written. The undamaged copy converts (test_parity, v3_fp8)."""
    model = copy_fixture(tmp_path / "fp8", "v3_fp8")
    kind, what = change
    if kind == "config":
        cfg = json.loads((model / "config.json").read_text())
        cfg["quantization_config"].update(what)
        (model / "config.json").write_text(json.dumps(cfg))
    else:
        _drop_tensor(model, what)
    check_fails(model, out_dir, exc, *needles)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_tensor_table_is_the_fixture_checkpoints(name):
    """The converter's tensor table, from config.json alone, lists exactly the tensors (names
    and shapes) of each fixture checkpoint; make_fixtures.py writes those from its own list,
    which transformers' save_pretrained confirmed (an FP8 checkpoint as the converter reads it:
    each weight with its block scale applied)."""
    from deepseek_cpu.converters.deepseek import checkpoint_tensors
    from deepseek_cpu.converters.quantized import open_checkpoint
    cfg = json.loads((fixture_dir(name) / "config.json").read_text())
    ck = open_checkpoint(fixture_dir(name), cfg)
    try:
        real = {n: ck.shape(n) for n in ck.names()}
    finally:
        ck.close()
    # exactly the required tensors, and of the optional ones only the MTP layer's copies of the
    # embedding and the output head (DeepSeek's V3 releases ship them; trained_v3_mtp has them)
    required = checkpoint_tensors(cfg)
    assert required.items() <= real.items()
    assert all(n.endswith((".embed_tokens.weight", ".shared_head.head.weight")) and n.startswith("model.layers.")
               for n in real.keys() - required.keys()), real.keys() - required.keys()
    assert real.items() <= checkpoint_tensors(cfg, optional=True).items()
    assert checkpoint_tensors(cfg, optional=True).keys() - real.keys() == (
        set() if cfg["topk_method"] == "noaux_tc"
        else {f"model.layers.{i}.mlp.gate.e_score_correction_bias"
         for i in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"])})


def test_tensor_table_optional_tensors(tmp_path, out_dir):
    """A tied model's lm_head is optional: without it no output.weight is planned or written."""
    import gguf

    from deepseek_cpu.converters.deepseek import checkpoint_tensors, tensor_table
    cfg = json.loads((fixture_dir(SMALL) / "config.json").read_text())
    tied = {**cfg, "tie_word_embeddings": True}
    assert "lm_head.weight" in checkpoint_tensors(cfg) and "lm_head.weight" not in checkpoint_tensors(tied)
    assert "lm_head.weight" in checkpoint_tensors(tied, optional=True)
    spec = {s.name: s for s in tensor_table(tied)}["output.weight"]
    assert spec.sources == ("lm_head.weight",) and not spec.required
    model = copy_fixture(tmp_path / SMALL)
    edit_config(model, tie_word_embeddings=True)
    with open(model / "model.safetensors.index.json") as f:
        index = json.load(f)
    shard = model / index["weight_map"].pop("lm_head.weight")
    raw = shard.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    header.pop("lm_head.weight")
    kept, off = [], 0
    for k, v in header.items():
        if k != "__metadata__":
            a, b = v["data_offsets"]
            kept.append(data[a:b])
            v["data_offsets"] = [off, off + b - a]
            off += b - a
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    shard.write_bytes(struct.pack("<Q", len(hb)) + hb + b"".join(kept))
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    out = convert(model, out_dir / "model.gguf", outtype="f32", progress=False)
    names = [t.name for t in gguf.GGUFReader(str(out)).tensors]
    assert "output.weight" not in names and names == [s.name for s in tensor_table(tied) if s.required]


def test_missing_tokenizer(tmp_path, out_dir):
    model = copy_fixture(tmp_path / SMALL)
    (model / "tokenizer.json").unlink()
    check_fails(model, out_dir, MissingTokenizer, "tokenizer.json")


def test_nonexistent_directory(tmp_path, out_dir):
    check_fails(tmp_path / "no-such-model", out_dir, ConversionError, "no-such-model", "no such directory")


def test_file_instead_of_directory(tmp_path, out_dir):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"\0" * 16)
    check_fails(f, out_dir, ConversionError, "not a directory")


def test_config_is_not_json(tmp_path, out_dir):
    model = copy_fixture(tmp_path / SMALL)
    (model / "config.json").write_text("{not json")
    check_fails(model, out_dir, ConversionError, "config.json", "not valid JSON")


def test_config_unreadable_directory_entry(tmp_path, out_dir):
    """config.json that cannot be read even by root (it is a directory)."""
    model = copy_fixture(tmp_path / SMALL)
    (model / "config.json").unlink()
    (model / "config.json").mkdir()
    check_fails(model, out_dir, ConversionError, "config.json", "cannot read")


# Drops CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH from this process's effective set, so
# that root is subject to file modes like anyone else (capset(2), via ctypes).
_DROP_DAC_CAPS = """
import ctypes, os
if os.geteuid() == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    class Hdr(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
    hdr, data = Hdr(0x20080522, 0), (Data * 2)()
    if libc.capget(ctypes.byref(hdr), data) != 0:
        raise SystemExit("capget failed")
    data[0].effective &= ~((1 << 1) | (1 << 2))  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    if libc.capset(ctypes.byref(hdr), data) != 0:
        raise SystemExit("capset failed")
"""


def test_config_chmod_000(tmp_path, out_dir):
    """chmod 000 config.json. Root ignores file modes, so as root the conversion runs in a
    child that first drops its DAC capabilities (then the mode applies to it too)."""
    model = copy_fixture(tmp_path / SMALL)
    (model / "config.json").chmod(0)
    probe = subprocess.run([sys.executable, "-c", _DROP_DAC_CAPS + f"open({str(model / 'config.json')!r}).read()"],
                           capture_output=True, text=True)
    if "PermissionError" not in probe.stderr:
        pytest.skip(f"cannot make a file unreadable for this user (dropping DAC capabilities failed: "
                    f"{probe.stderr.strip()[-200:] or 'the read succeeded'})")
    code = _DROP_DAC_CAPS + textwrap.dedent(f"""
        from deepseek_cpu.conversion.convert import convert
        try:
            convert({str(model)!r}, {str(out_dir / 'model.gguf')!r}, progress=False)
        except Exception as e:
            print(type(e).__name__ + ": " + str(e))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("ConversionError: "), r.stdout + r.stderr
    assert "config.json" in r.stdout and "cannot read" in r.stdout and "ermission" in r.stdout, r.stdout
    assert_nothing_written(out_dir)


def test_truncated_shard(tmp_path, out_dir):
    model = copy_fixture(tmp_path / SMALL)
    shard = model / SHARD2
    size = shard.stat().st_size
    os.truncate(shard, size - 1000)
    check_fails(model, out_dir, CheckpointError, SHARD2, "truncated")


def test_corrupt_safetensors_header(tmp_path, out_dir):
    model = copy_fixture(tmp_path / SMALL)
    shard = model / SHARD2
    with open(shard, "r+b") as f:
        f.seek(8)
        f.write(b"\xff\xfe garbage \x00\x01" * 4)
    check_fails(model, out_dir, CheckpointError, SHARD2, "corrupt safetensors header")


def test_safetensors_header_length_beyond_file(tmp_path, out_dir):
    model = copy_fixture(tmp_path / SMALL)
    with open(model / SHARD2, "r+b") as f:
        f.write(struct.pack("<Q", 1 << 40))
    check_fails(model, out_dir, CheckpointError, SHARD2, "not a safetensors file")


def test_output_directory_missing(tmp_path):
    model = copy_fixture(tmp_path / SMALL)
    with pytest.raises(ConversionError, match="output directory does not exist"):
        convert(model, tmp_path / "nope" / "model.gguf", progress=False)
    assert not (tmp_path / "nope").exists()


def test_output_path_is_a_directory(tmp_path, out_dir):
    model = copy_fixture(tmp_path / SMALL)
    with pytest.raises(ConversionError, match="is a directory"):
        convert(model, out_dir, progress=False)
    assert_nothing_written(out_dir)


# -- failures while writing ------------------------------------------------------------


class _Failer:
    """A plugin whose tensor transform raises `exc` at the n-th tensor."""

    def __init__(self, exc, at=10):
        self.exc, self.at, self.seen = exc, at, 0

    @hookimpl
    def deepseek_cpu_tensor_transforms(self, converter):
        def fail(name, data):
            self.seen += 1
            if self.seen == self.at:
                raise self.exc
            return data
        return [fail]


@contextmanager
def extra_plugin(obj, name="test-failer"):
    pm = plugins.load()
    pm.register(obj, name=name)
    try:
        yield obj
    finally:
        pm.unregister(obj)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), RuntimeError("boom")], ids=["KeyboardInterrupt", "RuntimeError"])
def test_interrupted_conversion_leaves_nothing(tmp_path, out_dir, exc):
    model = copy_fixture(tmp_path / SMALL)
    with extra_plugin(_Failer(exc)) as f:
        with pytest.raises(type(exc)):
            convert(model, out_dir / "model.gguf", progress=False)
    assert f.seen == f.at  # it did fail mid-way, after 9 tensors were written
    assert_nothing_written(out_dir)


def test_interrupted_conversion_keeps_previous_output(tmp_path, out_dir):
    """Atomic replace: a failed re-conversion leaves the earlier file untouched."""
    model = copy_fixture(tmp_path / SMALL)
    out = out_dir / "model.gguf"
    out.write_bytes(b"previous")
    with extra_plugin(_Failer(KeyboardInterrupt())):
        with pytest.raises(KeyboardInterrupt):
            convert(model, out, progress=False)
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in out_dir.iterdir()) == ["model.gguf"]


def test_cli_interrupted(tmp_path, out_dir):
    from click.testing import CliRunner

    from deepseek_cpu.cli import cli
    model = copy_fixture(tmp_path / SMALL)
    with extra_plugin(_Failer(KeyboardInterrupt())):
        r = CliRunner().invoke(cli, ["convert", str(model), str(out_dir / "m.gguf"), "--quiet"])
    assert r.exit_code == 130, r.output
    assert "nothing was written" in r.output
    assert_nothing_written(out_dir)


_DISK_FULL_CHILD = """
import resource, signal, sys
from deepseek_cpu.conversion.convert import convert, ConversionError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so that writing past the limit raises EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
try:
    convert(sys.argv[1], sys.argv[2], outtype="f32", progress=False)
except ConversionError as e:
    print("ConversionError: " + str(e))
"""


def test_disk_full_file_size_limit(tmp_path, out_dir):
    """A 200 kB file-size limit (RLIMIT_FSIZE) in a child: writes fail with EFBIG."""
    model = copy_fixture(tmp_path / SMALL)
    r = subprocess.run([sys.executable, "-c", _DISK_FULL_CHILD, str(model), str(out_dir / "model.gguf")],
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("ConversionError: "), r.stdout + r.stderr
    assert "no space left" in r.stdout and "nothing was written" in r.stdout, r.stdout
    assert_nothing_written(out_dir)


@pytest.fixture
def small_tmpfs(tmp_path):
    d = tmp_path / "tmpfs"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); "
                    "test_disk_full_file_size_limit covers the same path")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=True)


def test_disk_full_tmpfs(tmp_path, small_tmpfs):
    """A real ENOSPC: the output directory is a 200 kB tmpfs."""
    model = copy_fixture(tmp_path / SMALL)
    msg = check_fails(model, small_tmpfs, ConversionError, "no space left", "model.gguf", "nothing was written")
    assert "GiB needed" in msg
    st = os.statvfs(small_tmpfs)
    assert st.f_bfree == st.f_blocks, "the partial file's space was not released"


# -- the command line ------------------------------------------------------------------


def _cli(*args, preexec_fn=None):
    return subprocess.run([sys.executable, "-m", "deepseek_cpu", "convert", *map(str, args)],
                          capture_output=True, text=True, timeout=120, preexec_fn=preexec_fn, cwd=REPO)


def _limit_file_size():
    import resource
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


def _break(kind, model: Path):
    if kind == "nonexistent":
        shutil.rmtree(model)
    elif kind == "unsupported":
        edit_config(model, architectures=["LlamaForCausalLM"])
    elif kind == "missing-shard":
        (model / SHARD2).unlink()
    elif kind == "shape-mismatch":
        edit_config(model, hidden_size=72)
    elif kind == "missing-tokenizer":
        (model / "tokenizer.json").unlink()
    elif kind == "truncated":
        os.truncate(model / SHARD2, (model / SHARD2).stat().st_size - 1000)
    elif kind == "corrupt-header":
        with open(model / SHARD2, "r+b") as f:
            f.seek(8)
            f.write(b"\xff" * 32)
    elif kind == "vocab-smaller-than-tokenizer":
        edit_config(model, vocab_size=300)
    elif kind == "vocab-not-a-number":
        edit_config(model, vocab_size="102400")
    elif kind == "count-is-a-float":
        edit_config(model, n_routed_experts=8.0)
    elif kind == "config-is-dir":
        (model / "config.json").unlink()
        (model / "config.json").mkdir()


@pytest.mark.parametrize("kind, needle", [
    ("nonexistent", "no such directory"),
    ("unsupported", "DeepseekV2ForCausalLM, DeepseekV32ForCausalLM, DeepseekV3ForCausalLM"),
    ("missing-shard", SHARD2),
    ("shape-mismatch", "config.json implies"),
    ("missing-tokenizer", "tokenizer.json"),
    ("truncated", "truncated"),
    ("corrupt-header", "corrupt safetensors header"),
    ("config-is-dir", "cannot read"),
    ("vocab-smaller-than-tokenizer", "vocab_size is 300"),
    ("vocab-not-a-number", "vocab_size must be a positive integer, not '102400'"),
    ("count-is-a-float", "n_routed_experts must be a non-negative integer, not 8.0"),
    ("disk-full", "no space left"),
])
def test_cli_bad_input_one_line_error(tmp_path, out_dir, kind, needle):
    model = copy_fixture(tmp_path / SMALL)
    preexec = None
    if kind == "disk-full":
        preexec = _limit_file_size  # Python ignores SIGXFSZ, so writes fail with EFBIG
    else:
        _break(kind, model)
    r = _cli(model, out_dir / "model.gguf", "--outtype", "f32", "--quiet", preexec_fn=preexec)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    assert needle in lines[0], lines[0]
    assert r.stdout == ""
    assert_nothing_written(out_dir)


# -- transformers 5 config form ----------------------------------------------------------

T5 = FIXTURES / "transformers5"
T5_NAMES = sorted(p.name.removesuffix(".config.json") for p in T5.glob("*.config.json"))


def _t5_copy(tmp_path, name, drop_legacy_type=False) -> Path:
    # same directory name as the original (v2_group's is tiny-deepseek-v2), so general.name is the same too
    model = copy_fixture(tmp_path / "t5" / fixture_dir(name).name, name)
    cfg = json.loads((T5 / f"{name}.config.json").read_text())
    assert "rope_parameters" in cfg and "rope_scaling" not in cfg and "rope_theta" not in cfg
    if drop_legacy_type:
        # transformers 5 also keeps the legacy "type"; a config written from scratch has only rope_type
        cfg["rope_parameters"].pop("type", None)
    (model / "config.json").write_text(json.dumps(cfg))
    return model


def test_transformers5_configs_present():
    assert {"v2_group", "v3_noaux"} <= set(T5_NAMES)
    yarn = [n for n in T5_NAMES if json.loads((T5 / f"{n}.config.json").read_text())["rope_parameters"]["rope_type"] == "yarn"]
    assert yarn


@pytest.mark.parametrize("drop_legacy_type", [False, True], ids=["as-saved", "rope_type-only"])
@pytest.mark.parametrize("name", T5_NAMES)
def test_transformers5_config_same_gguf(tmp_path, converted, name, drop_legacy_type):
    import gguf_summary
    model = _t5_copy(tmp_path, name, drop_legacy_type)
    out = convert(model, tmp_path / f"{name}-t5.gguf", outtype="f32", progress=False)
    ours = gguf_summary.summarize(out, skip_prefixes=("GGUF.",))
    ref = gguf_summary.summarize(converted(name, "f32"), skip_prefixes=("GGUF.",))
    diff = {k: (ref["metadata"].get(k), ours["metadata"].get(k))
            for k in set(ref["metadata"]) | set(ours["metadata"]) if ref["metadata"].get(k) != ours["metadata"].get(k)}
    assert not diff, f"{name}: metadata from the transformers 5 config differs (original, t5): {diff}"
    assert ours["tensors"] == ref["tensors"]
    if name != "v2_greedy":
        assert ours["metadata"]["deepseek2.rope.scaling.type"] == ["STRING", "yarn"]


@pytest.mark.parametrize("name", [n for n in T5_NAMES if n != "v2_greedy"])
def test_transformers5_config_logits(tmp_path, name):
    from test_parity import TOL, engine_logits, rel_errors
    model = _t5_copy(tmp_path, name)
    out = convert(model, tmp_path / f"{name}-t5.gguf", outtype="f32", progress=False)
    ref = np.load(fixture_dir(name) / "reference.npz")
    err = rel_errors(engine_logits(out, ref["tokens"]), ref["logits"])
    assert err.max() <= TOL, f"{name}: max relative error {err.max():.3g}"


# -- streamed encoding -------------------------------------------------------------------


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0"])
def test_encode_pieces_equal_whole_tensor_encode(qtype):
    import gguf

    from deepseek_cpu.converters.base import encode, encode_pieces
    q = gguf.GGMLQuantizationType[qtype]
    rng = np.random.default_rng(0)
    data = rng.standard_normal((3, 37, 64), dtype=np.float32)
    if q != gguf.GGMLQuantizationType.Q8_0:  # (q8_0 of NaN/inf is undefined)
        data[0, 0, :4] = [np.nan, np.inf, -np.inf, 1e-40]
    whole = encode(data, q).tobytes()
    for chunk in (64, 100, 64 * 37, 1 << 20):  # one row, rows not dividing the total, ..., all
        pieces = list(encode_pieces(data, q, chunk=chunk))
        assert b"".join(p.tobytes() for p in pieces) == whole, (qtype, chunk)
    assert len(list(encode_pieces(data, q, chunk=64))) == 3 * 37


@pytest.mark.parametrize("outtype", ["f16", "bf16", "q8_0"])
def test_converted_tensors_are_gguf_encodings_of_f32(converted, outtype):
    """End to end through the streaming writer: every tensor of a bf16/f16/q8_0 conversion
    holds exactly gguf's own encoding of the f32 conversion's tensor."""
    import gguf
    f32 = {t.name: t for t in gguf.GGUFReader(str(converted(SMALL, "f32"))).tensors}
    got = gguf.GGUFReader(str(converted(SMALL, outtype))).tensors
    assert sorted(t.name for t in got) == sorted(f32)
    types = set()
    for t in got:
        ref = gguf.quants.quantize(np.asarray(f32[t.name].data), t.tensor_type)
        assert np.asarray(t.data).tobytes() == ref.tobytes(), t.name
        types.add(t.tensor_type.name)
    assert outtype.upper() in types


def test_checkpoint_f32_in_pieces_is_exact(monkeypatch):
    """Checkpoint.f32 widens big tensors piece by piece (dropping mapped pages as it goes);
    the result must be the plain widening, for bf16 and f32 tensors, whatever the piece size."""
    from deepseek_cpu.converters import checkpoint as ck_mod
    ck = ck_mod.Checkpoint(fixture_dir("v3_noaux"))
    dtypes = set()
    for chunk in (64, 1000, 1 << 30):
        monkeypatch.setattr(ck_mod, "READ_CHUNK", chunk)
        for n in ck.names():
            a, dtype = ck.raw(n), ck.refs[n].dtype
            ref = (a.astype(np.uint32) << 16).view(np.float32) if dtype == "BF16" else a.astype(np.float32)
            got = ck.f32(n)
            assert got.dtype == np.float32 and got.shape == ref.shape and got.tobytes() == ref.tobytes(), (n, chunk)
            dtypes.add(dtype)
    assert dtypes == {"BF16", "F32"}
    ck.close()


def test_name_option_sets_general_name(tmp_path):
    import gguf
    from click.testing import CliRunner
    from deepseek_cpu.cli import cli
    out = tmp_path / "named.gguf"
    res = CliRunner().invoke(cli, ["convert", str(fixture_dir("v2_greedy")), str(out), "--outtype", "f32",
                                   "--quiet", "--name", "deepseek-ai/DeepSeek-V2-Lite-Chat"])
    assert res.exit_code == 0, res.output
    assert gguf.GGUFReader(out).get_field("general.name").contents() == "DeepSeek-V2-Lite-Chat"


def test_package_level_convert_is_callable_in_any_import_order(tmp_path):
    """`from deepseek_cpu import convert; convert(...)` as the docs say, also after the
    conversion module was imported first."""
    code = ("import deepseek_cpu.conversion.convert, sys\n"
            "from deepseek_cpu import convert\n"
            "p = convert(sys.argv[1], sys.argv[2], outtype='f32', progress=False)\n"
            "print(p)\n")
    out = tmp_path / "m.gguf"
    r = subprocess.run([sys.executable, "-c", code, str(fixture_dir("v2_greedy")), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert out.is_file() and r.stdout.strip() == str(out)
