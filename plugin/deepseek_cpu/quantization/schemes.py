"""Quantization schemes: which GGML type each tensor of a model gets.

A scheme is a base file type from quantization/types.py (its `general.file_type`, its default
tensor type and llama.cpp's own per-tensor recipe for it) plus rules that override the recipe
for the tensors they match. The rules are handed to llama.cpp's quantizer as its tensor-type
overrides (`llama_model_quantize_params.tt_overrides`, what `llama-quantize --tensor-type`
fills): a rule is a regular expression searched in the GGUF tensor name, the first match wins,
and a type whose blocks do not fit a row falls back as llama.cpp does (q4_K -> q5_0, ...).

`Scheme.tensor_type` predicts that choice without running the quantizer (synth writes
models with it; `schemes` prints bits per weight with it); the recipe below imitates
llama_tensor_get_type of the pinned llama.cpp (src/llama-quant.cpp) for the deepseek2 tensor
names our converter writes. tests/test_schemes.py checks the prediction against the types
llama.cpp actually writes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import gguf

from .types import QUANT_TYPES

Q = gguf.GGMLQuantizationType
UNQUANTIZED = (Q.F32, Q.F16, Q.BF16)
# tensor_type_fallback: a row that does not fill whole blocks takes a 32-wide type
_FALLBACK = {Q.Q2_K: Q.Q4_0, Q.Q3_K: Q.Q4_0, Q.TQ1_0: Q.Q4_0, Q.TQ2_0: Q.Q4_0, Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1,
             Q.Q6_K: Q.Q8_0,
             # llama-quant.cpp's tensor_type_fallback: the i-quants of 256-weight blocks take IQ4_NL
             **{t: Q.IQ4_NL for t in (Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S,
                                      Q.IQ4_XS)}}
# base types whose per-tensor recipe tensor_type() reproduces; for the others (q2_k, q3_k_*,
# iq4_*) llama.cpp gives some tensors other types and the prediction is approximate
RECIPES = ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
           "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k")


def ggml_type(name: str) -> gguf.GGMLQuantizationType:
    """A GGML tensor type by its llama.cpp name (q4_K, Q6_K, f16, iq4_xs: any case)."""
    try:
        return Q[name.upper()]
    except KeyError:
        raise ValueError(f"unknown GGML type {name!r}") from None


def type_name(t: gguf.GGMLQuantizationType) -> str:
    """llama.cpp's own spelling (q4_K, q8_0, f16): what its logs and --tensor-type print."""
    n = t.name.lower()
    return n[:-2] + "_K" if n.endswith("_k") else n


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _layer(name: str) -> int:
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else 0


def _fits(t: gguf.GGMLQuantizationType, ne0: int) -> gguf.GGMLQuantizationType:
    """llama.cpp's tensor_type_fallback for a row of ne0 weights."""
    if ne0 % gguf.GGML_QUANT_SIZES[t][0]:
        t = _FALLBACK.get(t, t)
        if ne0 % gguf.GGML_QUANT_SIZES[t][0]:
            t = Q.F16
    return t


def _kept(name: str, shape: tuple[int, ...], converter_type: gguf.GGMLQuantizationType) -> bool:
    """Whether llama.cpp's quantizer leaves the tensor in f32 whatever the scheme (norms, the
    router, biases: what the converter writes in f32, and every 1-D tensor)."""
    return converter_type == Q.F32 or len(shape) < 2 or not name.endswith("weight")


def recipe_type(base: str, name: str, ne0: int, n_layer: int) -> gguf.GGMLQuantizationType:
    """llama.cpp's type for tensor `name` (rows of ne0) in file type `base`, no override
    (n_expert is never 8 for DeepSeek, there is no attn_v / attn_kv_b, no imatrix)."""
    default = QUANT_TYPES[base].ggml_type
    if default in UNQUANTIZED:
        return default
    t = default
    if name == "output.weight":
        t = Q.Q8_0 if ne0 % gguf.GGML_QUANT_SIZES[t][0] else (t if t == Q.Q8_0 else Q.Q6_K)
    elif "ffn_down" in name:
        i = _layer(name)
        if base in ("q4_k_m", "q5_k_m") and _use_more_bits(i, n_layer):
            t = Q.Q6_K
        elif base == "q4_k_s" and i < n_layer // 8:
            t = Q.Q5_K
    # token_embd, attn_q(_a/_b), attn_kv_a_mqa, attn_k_b, attn_v_b, attn_output, ffn_gate/up*:
    # the default type of every base handled here
    return _fits(t, ne0)


@dataclass(frozen=True)
class Scheme:
    """A named way to quantize a model. `rules`: (regular expression searched in the GGUF
    tensor name, GGML type name), first match wins, for the tensors llama.cpp quantizes at all
    (norms, the router and biases stay f32 whatever the rules say)."""
    name: str
    description: str
    base: str                                   # a name of quantization/types.py
    rules: tuple[tuple[str, str], ...] = ()
    wants_imatrix: bool = False                 # quality depends on an importance matrix
    plugin: str = field(default="", compare=False)  # who registered it (set by the registry)

    def __post_init__(self):
        if self.base not in QUANT_TYPES:
            raise ValueError(f"scheme {self.name!r}: unknown base type {self.base!r} "
                             f"(one of {', '.join(QUANT_TYPES)})")
        for pattern, tname in self.rules:
            re.compile(pattern)
            ggml_type(tname)

    @property
    def file_type(self) -> gguf.LlamaFileType:
        return QUANT_TYPES[self.base].file_type

    @property
    def direct(self) -> bool:
        """Written by our converter itself (no llama.cpp quantizer, no bf16 intermediate)."""
        return not self.rules and QUANT_TYPES[self.base].direct

    @property
    def exact_prediction(self) -> bool:
        """Whether tensor_type() is exactly what llama.cpp writes for every tensor (see RECIPES)."""
        return self.base in RECIPES

    def predicts(self, name: str, shape: tuple[int, ...], converter_type: gguf.GGMLQuantizationType = Q.F16) -> bool:
        """Whether tensor_type() is exactly llama.cpp's choice for this tensor: one it leaves alone,
        a base whose recipe is imitated, or a rule that names the type (llama.cpp's overrides win
        over its recipe), as every tensor of a DeepSeek-V2/V3 file has in the DeepSeek mixes."""
        return _kept(name, shape, converter_type) or self.exact_prediction or self.rule_for(name) is not None

    def rule_for(self, name: str, overrides: tuple[tuple[str, str], ...] = ()) -> str | None:
        for pattern, tname in (*overrides, *self.rules):
            if re.search(pattern, name):
                return tname
        return None

    def tensor_type(self, name: str, shape: tuple[int, ...], n_layer: int,
                    converter_type: gguf.GGMLQuantizationType = Q.F16,
                    overrides: tuple[tuple[str, str], ...] = ()) -> gguf.GGMLQuantizationType:
        """The type tensor `name` (numpy-order `shape`) gets. `converter_type` is the converter's
        own choice (f32 for norms, the router and biases: llama.cpp leaves those alone)."""
        if _kept(name, shape, converter_type):
            return Q.F32
        default = QUANT_TYPES[self.base].ggml_type
        if default in UNQUANTIZED:  # llama.cpp applies overrides only in a quantized file type
            return default
        ne0 = shape[-1]
        rule = self.rule_for(name, overrides)
        if rule is None:
            return recipe_type(self.base, name, ne0, n_layer)
        return _fits(ggml_type(rule), ne0)

    def bits_per_weight(self, tensors, n_layer: int) -> float:
        """Bits per weight over `tensors`: (name, numpy-order shape, converter type) triples."""
        bits = n = 0
        for name, shape, ctype in tensors:
            t = self.tensor_type(name, shape, n_layer, ctype)
            block, size = gguf.GGML_QUANT_SIZES[t]
            count = 1
            for d in shape:
                count *= int(d)
            bits += count // block * size * 8
            n += count
        return bits / n if n else 0.0


# ---------------------------------------------------------------------------------------
# The DeepSeek mixes. In DeepSeek's MoE the routed experts hold ~90% of the bytes but each
# token reads only a few of them; attention, the shared experts, the dense lead layers and the
# output are read for every token. So those get 6-8 bits, the experts ~4. The embeddings (one
# row a token) cost nothing at decode and 0.14% of V3's weights: 6 bits or more.
# Every type here has a fast kernel in our engine (q4_K/q4_0 repacked, q6_K, q8_0, q5_0).
# ---------------------------------------------------------------------------------------

ATTENTION = r"\.attn_(q|q_a|q_b|kv_a_mqa|k_b|v_b|output)\.weight$"
SHARED_EXPERTS = r"\.ffn_(gate|up|down)_shexp\.weight$"
DENSE_FFN = r"\.ffn_(gate|up|down)\.weight$"
ROUTED_EXPERTS = r"\.ffn_(gate|up|down)_exps\.weight$"
EMBEDDINGS = r"^token_embd\.weight$"
V4_STEERING = r"(^output_hc_fn|\.hc_(attn|ffn)_fn|_compressor_ape)\.weight$"
OUTPUT = r"^output\.weight$"


def _mix_rules(experts: str, every_token: str, embeddings: str, output: str) -> tuple:
    """A DeepSeek mix's rules: the routed experts' type, one type for what every token reads
    (attention, shared experts), and the embeddings' and output's. The dense lead layers' FFN is
    q8_0 in every mix: 1% of a V3 token's bytes, and on the trained model (an outlier-channel form
    above all) the tensors whose rounding costs most per byte (docs/quantization.md, the frontier)."""
    return ((ROUTED_EXPERTS, experts), (ATTENTION, every_token), (SHARED_EXPERTS, every_token),
            (DENSE_FFN, "q8_0"), (EMBEDDINGS, embeddings), (OUTPUT, output))


def _low_bit_rules(experts: str, every_token: str, down: str | None = None) -> tuple:
    """A mix below 4 bits: the routed experts' type (`down` for their ffn_down, if another), one type
    for what every token reads and for the embeddings; the output q8_0."""
    rules = _mix_rules(experts, every_token, embeddings=every_token, output="q8_0")
    return ((r"\.ffn_down_exps\.weight$", down), *rules) if down else rules


DEEPSEEK_MIXES = (
    Scheme("ds-q4", "DeepSeek mix below q4_k_m's size, as fast: routed experts q4_0; attention, "
           "shared experts and embeddings q6_K (q8_0 where rows are not 256-wide); dense "
           "layers and output q8_0",
           "q4_0", _mix_rules("q4_0", "q6_K", embeddings="q6_K", output="q8_0")),
    Scheme("ds-q4-q8", "ds-q4 with everything but the routed experts at q8_0: closer to the "
           "original, a little larger, decode a little slower",
           "q4_0", _mix_rules("q4_0", "q8_0", embeddings="q8_0", output="q8_0")),
    Scheme("ds-q4-k", "ds-q4-q8 with k-quant routed experts (q4_K; q5_0 where rows are not "
           "256-wide): for models whose experts lose more to q4_0; slower decode",
           "q4_k_m", _mix_rules("q4_K", "q8_0", embeddings="q8_0", output="q8_0")),
    Scheme("ds-q4-lean", "DeepSeek mix near q4_0's size: routed experts and embeddings q4_0; "
           "attention and shared experts q6_K; dense layers q8_0; output q6_K",
           "q4_0", _mix_rules("q4_0", "q6_K", embeddings="q4_0", output="q6_K")),
    # Below 4 bits: what CPU users of the 671B models run (R1/V3 at 2-3.5 bits per weight). Only the
    # routed experts go below 4 bits; what every token reads stays at 6. ffn_down of the experts is
    # the most sensitive of the three (it writes the residual stream): one step up in ds-q2.
    # Embeddings q6_K and output q8_0 add 0.006 bits per weight on V3 and ~1% to a token's reads,
    # and halve the KL divergence of the trained model (docs/quantization.md, the frontier).
    # V2-Lite's expert rows (1408 wide) do not fill 256-wide blocks: its ffn_down_exps falls back to
    # q4_0 there (llama.cpp's rule); V3's 2048-wide ones take the k-quant.
    Scheme("ds-q3", "DeepSeek mix at 3.5 bits per weight on V3 (4.0 on V2-Lite): routed experts "
           "q3_K; attention, shared experts and embeddings q6_K; dense layers and output q8_0",
           "q3_k_m", _low_bit_rules("q3_K", "q6_K"), wants_imatrix=True),
    Scheme("ds-q2", "DeepSeek mix at 3.0 bits per weight on V3 (3.5 on V2-Lite): routed experts "
           "q2_K (ffn_down q3_K); attention, shared experts and embeddings q6_K; dense layers and "
           "output q8_0",
           "q2_k", _low_bit_rules("q2_K", "q6_K", down="q3_K"), wants_imatrix=True),
    # The same experts with everything else at q8_0: a file as small, 0.6x the KL divergence where
    # inputs have outlier channels, ~15% more bytes read per decoded token on V3 (what every token
    # reads is ~60% of a V3 token's bytes at q6_K).
    Scheme("ds-q3-q8", "ds-q3 with everything but the routed experts at q8_0: the file barely larger, "
           "closer to the original; a decoded V3 token reads ~14% more",
           "q3_k_m", _low_bit_rules("q3_K", "q8_0"), wants_imatrix=True),
    Scheme("ds-q2-q8", "ds-q2 with everything but the routed experts at q8_0: the file barely larger, "
           "closer to the original; a decoded V3 token reads ~15% more",
           "q2_k", _low_bit_rules("q2_K", "q8_0", down="q3_K"), wants_imatrix=True),
    # DeepSeek-V4: its release already stores the routed experts in 4 bits (MXFP4); they are copied
    # bit for bit. The mHC mixing matrices and the compressors' position biases steer every token
    # and are tiny: they stay f32 (llama.cpp's own MXFP4_MOE type would round them to q8_0).
    Scheme("ds-v4", "DeepSeek-V4 mix: routed experts kept exactly as released (MXFP4); attention, "
           "shared experts, embeddings and output q8_0; mHC and compressor position biases f32",
           "mxfp4_moe", ((V4_STEERING, "f32"), (ROUTED_EXPERTS, "mxfp4"))),
)


def llama_cpp_schemes() -> tuple[Scheme, ...]:
    """llama.cpp's own file types, one scheme each, no rules."""
    out = []
    for name, qt in QUANT_TYPES.items():
        how = "written by our converter" if qt.direct else "llama.cpp's own mix"
        out.append(Scheme(name, f"{qt.ftype.replace('MOSTLY_', '').replace('ALL_', '')}: {how}",
                          name, wants_imatrix=name.startswith("iq")))
    return tuple(out)
