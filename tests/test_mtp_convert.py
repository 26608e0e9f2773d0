"""The converter keeps DeepSeek's multi-token-prediction (MTP / "nextn") block (issue 49).

V3 / R1 / V3.1 (deepseek2) and V3.2 (deepseek32) store it as layer num_hidden_layers
(`model.layers.N.{eh_proj,enorm,hnorm,shared_head.*,embed_tokens}` + a whole decoder layer), V4
(deepseek4) as `mtp.0.*`. The GGUF holds it as block N: `blk.N.*` + `blk.N.nextn.*`, with
block_count = main layers + `{arch}.nextn_predict_layers` (llama.cpp's loaders:
src/models/deepseek2.cpp, deepseek32.cpp, deepseek4.cpp). The main model's logits must not
change by a bit; `--no-mtp` leaves the block out; a block that does not match the config is one
error naming it, nothing written.
"""
import json
import logging
import shutil
import struct

import gguf
import numpy as np
import pytest

from conftest import fixture_dir
from test_parity import engine_logits

# fixture -> (main layers, GGUF architecture); trained_v3_mtp: main model and MTP head trained on text
MTP_FIXTURES = {"v3_mtp": (3, "deepseek2"), "v4_flash": (4, "deepseek4"), "v32_mtp": (3, "deepseek32"),
                "trained_v3_mtp": (3, "deepseek2")}
# fixture -> the fixture holding its config.json and reference.npz (v32_mtp is v32_dsa + a layer)
REF_FIXTURE = {"v3_mtp": "v3_noaux", "v4_flash": "v4_flash", "v32_mtp": "v32_dsa", "trained_v3_mtp": "trained_v3_mtp"}


def _dtype_of(arr_dtype: str):
    return {"BF16": np.uint16, "F32": np.float32, "F16": np.float16, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8,
            "I8": np.int8, "I32": np.int32, "I64": np.int64, "U8": np.uint8}[arr_dtype]


def write_checkpoint(src, dst, edit=None, config=None):
    """Copy checkpoint `src` to `dst` as one model.safetensors, its tensors as stored, with
    `edit`: name -> (safetensors dtype, array) to add or replace, or None to delete; `config`:
    keys to set in config.json."""
    from deepseek_cpu.converters.checkpoint import Checkpoint
    dst.mkdir(parents=True, exist_ok=True)
    ck = Checkpoint(src)
    tensors = {n: (ck.refs[n].dtype, np.array(ck.raw(n))) for n in ck.names()}
    ck.close()
    for n, v in (edit or {}).items():
        if v is None:
            tensors.pop(n, None)
        else:
            tensors[n] = v
    header, blobs, off = {}, [], 0
    for n, (dt, a) in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[n] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    (dst / "model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(config or {})
    (dst / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, dst / f)
    return dst


def _bf16(shape, rng, scale=0.08, offset=0.0):
    x = (offset + scale * rng.standard_normal(shape)).astype(np.float32)
    return "BF16", (x.view(np.uint32) >> 16).astype(np.uint16)


@pytest.fixture(scope="module")
def v32_mtp(tmp_path_factory):
    """v32_dsa plus an MTP layer (layer 3) in DeepSeek's names, random, built from the converter's
    own table of what layer 3 of the config needs (the V3 fixture, v3_mtp, is made independently)."""
    from deepseek_cpu.converters.deepseek import DeepseekConverter
    src = fixture_dir("v32_dsa")
    cfg = {**json.loads((src / "config.json").read_text()), "num_nextn_predict_layers": 1}
    rng = np.random.default_rng(49)
    edit = {}
    for spec in DeepseekConverter(cfg, src).tensor_table():
        for s in spec.sources:
            if s.startswith("model.layers.3.") and s not in edit:
                norm = spec.name.endswith("norm.weight")
                edit[s] = (("F32", (0.3 * rng.random(spec.source_shape)).astype(np.float32)) if s.endswith("bias")
                           else _bf16(spec.source_shape, rng, 0.15 if norm else 0.08, 1.0 if norm else 0.0))
    return write_checkpoint(src, tmp_path_factory.mktemp("v32_mtp"), edit, {"num_nextn_predict_layers": 1})


@pytest.fixture(scope="module")
def mtp_ggufs(tmp_path_factory, v32_mtp):
    """fixture -> (GGUF with the MTP block, GGUF without: convert(mtp=False)), f32."""
    from deepseek_cpu.conversion.convert import convert
    d = tmp_path_factory.mktemp("mtp_ggufs")
    out = {}
    for name in MTP_FIXTURES:
        src = v32_mtp if name == "v32_mtp" else fixture_dir(name)
        out[name] = tuple(convert(src, d / f"{name}-{keep}.gguf", outtype="f32", progress=False, mtp=keep)
                          for keep in (True, False))
    return out


def _fields(path):
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    kv = {k: f.contents() for k, f in r.fields.items()}
    return r, arch, kv


@pytest.mark.parametrize("name", MTP_FIXTURES)
def test_gguf_holds_the_mtp_block_as_the_loader_names_it(mtp_ggufs, name):
    n_layer, arch = MTP_FIXTURES[name]
    r, got_arch, kv = _fields(mtp_ggufs[name][0])
    assert got_arch == arch
    assert kv[f"{arch}.block_count"] == n_layer + 1
    assert kv[f"{arch}.nextn_predict_layers"] == 1
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}  # GGUF order: ne0 first
    cfg = json.loads((fixture_dir(REF_FIXTURE[name]) / "config.json").read_text())
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    b = f"blk.{n_layer}.nextn."
    want = {b + "eh_proj.weight": (2 * H, H), b + "enorm.weight": (H,), b + "hnorm.weight": (H,),
            b + "shared_head_norm.weight": (H,)}
    if name != "v4_flash":  # V3 (and V3.2) ship their own copies of the embedding and head
        want.update({b + "embed_tokens.weight": (H, V), b + "shared_head_head.weight": (H, V)})
    assert {k: v for k, v in shapes.items() if ".nextn." in k} == want
    # the block is also a whole decoder layer, named as the main ones
    main = {k.split(".", 2)[2] for k in shapes if k.startswith(f"blk.{n_layer - 1}.")}
    mtp = {k.split(".", 2)[2] for k in shapes if k.startswith(f"blk.{n_layer}.") and ".nextn." not in k}
    assert main <= mtp | {"ffn_gate_tid2eid.weight"}, main - mtp
    # and nothing of it in the file without it
    r0, _, kv0 = _fields(mtp_ggufs[name][1])
    assert kv0[f"{arch}.block_count"] == n_layer and f"{arch}.nextn_predict_layers" not in kv0
    assert not [t.name for t in r0.tensors if t.name.startswith(f"blk.{n_layer}.")]
    assert {t.name for t in r0.tensors} == {k for k in shapes if not k.startswith(f"blk.{n_layer}.")}


@pytest.mark.parametrize("name", ["v3_mtp", "v4_flash"])
def test_eh_proj_is_deepseeks_projection_of_enorm_then_hnorm(mtp_ggufs, name):
    from deepseek_cpu.conversion.convert import read_config
    from deepseek_cpu.converters.quantized import open_checkpoint
    n_layer, _ = MTP_FIXTURES[name]
    r, _, _ = _fields(mtp_ggufs[name][0])
    got = next(np.array(t.data) for t in r.tensors if t.name == f"blk.{n_layer}.nextn.eh_proj.weight")
    src = fixture_dir(name)
    ck = open_checkpoint(src, read_config(src))
    if name == "v3_mtp":
        want = ck.f32("model.layers.3.eh_proj.weight")
    else:  # V4 keeps the two halves apart: e_proj (embedding) first, as llama.cpp's graph concatenates
        want = np.concatenate([ck.f32("mtp.0.e_proj.weight"), ck.f32("mtp.0.h_proj.weight")], axis=1)
    ck.close()
    assert np.array_equal(got, want)


@pytest.mark.parametrize("name", MTP_FIXTURES)
def test_main_logits_are_exactly_those_without_the_block(mtp_ggufs, name):
    tokens = np.load(fixture_dir(REF_FIXTURE[name]) / "reference.npz")["tokens"]
    with_mtp, without = (engine_logits(p, tokens, n_ctx=256) for p in mtp_ggufs[name])
    assert np.array_equal(with_mtp, without)
    if name == "v3_mtp":  # v3_noaux's main model, which transformers' logits are of
        ref = np.load(fixture_dir("v3_noaux") / "reference.npz")["logits"]
        assert float(np.abs(with_mtp - ref).max() / np.abs(ref).max()) < 1e-4


@pytest.mark.parametrize("name", MTP_FIXTURES)
def test_the_engine_loads_the_block_when_asked(mtp_ggufs, name):
    """llama_model_params.load_mtp: every nextn tensor found with the shape the loader expects."""
    from conftest import run_python
    p = run_python(f"""
import llama_cpp
llama_cpp.llama_backend_init()
params = llama_cpp.llama_model_default_params()
params.load_mtp = True
m = llama_cpp.llama_model_load_from_file({str(mtp_ggufs[name][0])!r}.encode(), params)
assert m, "load failed"
llama_cpp.llama_model_free(m)
print("LOADED")
""")
    assert "LOADED" in p.stdout, p.stderr[-2000:]


def test_no_mtp_on_the_command_line(tmp_path):
    from click.testing import CliRunner
    from deepseek_cpu.cli import cli
    out = tmp_path / "m.gguf"
    res = CliRunner().invoke(cli, ["convert", str(fixture_dir("v3_mtp")), str(out), "--outtype", "f32",
                                   "--no-mtp", "--quiet"])
    assert res.exit_code == 0, res.output
    r, arch, kv = _fields(out)
    assert kv["deepseek2.block_count"] == 3 and "deepseek2.nextn_predict_layers" not in kv
    assert not [t.name for t in r.tensors if t.name.startswith("blk.3.")]
    res = CliRunner().invoke(cli, ["convert", str(fixture_dir("v3_mtp")), str(tmp_path / "k.gguf"),
                                   "--outtype", "f32", "--quiet"])
    assert res.exit_code == 0, res.output
    assert _fields(tmp_path / "k.gguf")[2]["deepseek2.nextn_predict_layers"] == 1


def test_synth_plans_the_mtp_block_for_real_shapes():
    from deepseek_cpu.tools.shapes import converter_plan, real_config
    for shape, arch_layers in (("v3", 61), ("v3.2", 61), ("v4-flash", 43)):
        conv, specs = converter_plan(real_config(shape))
        names = {s.name: s.shape for s in specs}
        H = real_config(shape)["hidden_size"]
        assert names[f"blk.{arch_layers}.nextn.eh_proj.weight"] == (H, 2 * H), shape
        assert f"blk.{arch_layers}.ffn_gate_exps.weight" in names and conv.n_mtp == 1


def _convert_fails(src, tmp_path, match, **kw):
    from deepseek_cpu.conversion.convert import convert
    from deepseek_cpu.errors import DeepseekCpuError
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out.gguf"
    with pytest.raises(DeepseekCpuError, match=match) as e:
        convert(src, out, outtype="f32", progress=False, **kw)
    assert "\n" not in str(e.value)
    assert not out.exists() and not list(tmp_path.glob("*.gguf*"))
    return str(e.value)


def test_bad_v3_mtp_blocks_are_one_error_naming_them(tmp_path):
    src, rng = fixture_dir("v3_mtp"), np.random.default_rng(0)
    # eh_proj of the wrong shape
    bad = write_checkpoint(src, tmp_path / "shape", {"model.layers.3.eh_proj.weight": _bf16((64, 64), rng)})
    _convert_fails(bad, tmp_path / "o1", r"model\.layers\.3\.eh_proj\.weight has shape \(64, 64\).*\(64, 128\)")
    # a tensor of the block missing
    bad = write_checkpoint(src, tmp_path / "missing", {"model.layers.3.hnorm.weight": None})
    _convert_fails(bad, tmp_path / "o2", r"MTP layer .*incomplete.*model\.layers\.3\.hnorm\.weight")
    # the config announces no MTP layer, the checkpoint has one
    bad = write_checkpoint(src, tmp_path / "zero", config={"num_nextn_predict_layers": 0})
    _convert_fails(bad, tmp_path / "o3", r"layer 3 .*num_nextn_predict_layers 0.*--no-mtp")
    # ... or two, where it has one
    bad = write_checkpoint(src, tmp_path / "two", config={"num_nextn_predict_layers": 2})
    _convert_fails(bad, tmp_path / "o4", r"incomplete.*model\.layers\.4\.")
    # a config value that is not a count
    bad = write_checkpoint(src, tmp_path / "str", config={"num_nextn_predict_layers": "1"})
    _convert_fails(bad, tmp_path / "o5", r"num_nextn_predict_layers must be")
    # --no-mtp converts whatever the block looks like
    from deepseek_cpu.conversion.convert import convert
    convert(tmp_path / "shape", tmp_path / "o1" / "ok.gguf", outtype="f32", progress=False, mtp=False)


def test_checkpoint_without_its_announced_block_converts_without_it(tmp_path, caplog):
    """A re-upload that dropped layer 61 (config still says 1): the main model, and a warning."""
    from deepseek_cpu.conversion.convert import convert
    src = fixture_dir("v3_mtp")
    stripped = write_checkpoint(src, tmp_path / "ck", {n: None for n in _names(src) if n.startswith("model.layers.3.")})
    with caplog.at_level(logging.WARNING, logger="deepseek_cpu.conversion"):
        out = convert(stripped, tmp_path / "m.gguf", outtype="f32", progress=False)
    assert "holds no MTP layer" in caplog.text
    _, _, kv = _fields(out)
    assert kv["deepseek2.block_count"] == 3 and "deepseek2.nextn_predict_layers" not in kv


def test_bad_v4_mtp_blocks_are_one_error_naming_them(tmp_path):
    src = fixture_dir("v4_flash")
    ck = {n: None for n in ("mtp.0.h_proj.weight", "mtp.0.h_proj.scale")}
    bad = write_checkpoint(src, tmp_path / "missing", ck)
    _convert_fails(bad, tmp_path / "o1", r"MTP block .*incomplete.*mtp\.0\.h_proj\.weight")
    bad = write_checkpoint(src, tmp_path / "zero", config={"num_nextn_predict_layers": 0})
    _convert_fails(bad, tmp_path / "o2", r"mtp\.0\..*beyond config\.json's num_nextn_predict_layers 0")
    cfg = json.loads((src / "config.json").read_text())
    bad = write_checkpoint(src, tmp_path / "ratios", config={"compress_ratios": cfg["compress_ratios"][:4]})
    _convert_fails(bad, tmp_path / "o3", r"compress_ratios has no ratio for the MTP layer 4")
    rng = np.random.default_rng(1)
    bad = write_checkpoint(src, tmp_path / "shape", {"mtp.0.enorm.weight": _bf16((32,), rng)})
    _convert_fails(bad, tmp_path / "o4", r"mtp\.0\.enorm\.weight has shape \(32,\)")


def _names(src):
    from deepseek_cpu.converters.checkpoint import Checkpoint
    ck = Checkpoint(src)
    try:
        return ck.names()
    finally:
        ck.close()
