"""DeepSeek-V2 / V3 / V3.2 checkpoints (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM ->
deepseek2 GGUF; DeepseekV32ForCausalLM -> deepseek32 GGUF).

Covers V2, V2-Lite, Coder-V2(-Lite), V2.5, V3, R1, V3.1 and V3.2 as published on the hub: bf16
safetensors shards, per-expert tensors, and config.json in DeepSeek's original form
(`rope_scaling`) or transformers 5's (`rope_parameters`). V3.2 is V3 plus, in every layer, the
DSA "lightning indexer" (its own q/k projections, a LayerNorm on its key, per-head weights)
that picks the `index_topk` keys each query attends to.

The multi-token-prediction (MTP) layers DeepSeek stores after the main ones (V3's layer 61:
a decoder layer plus `eh_proj`, `enorm`, `hnorm`, `shared_head.*`, `embed_tokens`) are written as
blocks `blk.N.*` + `blk.N.nextn.*`, block_count = main + `nextn_predict_layers`, unless keep_mtp is
False (`--no-mtp`).

The output is MLA-ready: kv_b_proj is split into attn_k_b (transposed per head) and
attn_v_b, so the engine can attend in the compressed latent space; routed experts are
stacked into one 3-D tensor per projection.

`DeepseekConverter.tensor_table` is the one table of which GGUF tensors a config implies,
their shapes and the checkpoint tensors they come from, built from config.json alone:
`plan` checks a checkpoint against it, `checkpoint_tensors` lists what a checkpoint must
hold, and synth (random-weight GGUFs) and benchmarks/convert_memory.py (a synthetic
checkpoint) take their shapes from it.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from deepseek_cpu.hookspecs import hookimpl

from .base import ConversionError, EncodedBlocks, MtpLayers, TensorPlan, choose_qtype, stack_f32
from .checkpoint import Checkpoint, CheckpointError
from .quantized import q4_0_as_q4_1

log = logging.getLogger("deepseek_cpu.conversion")

ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM")
MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32")
ARCH = "deepseek2"      # the GGUF architecture of V2 / V3
ARCH_DSA = "deepseek32"  # of V3.2 (MLA + DSA): llama.cpp's DEEPSEEK32 graph
# the indexer's config keys (all required for V3.2): heads, head size, keys kept per query, and the
# GGUF keys llama.cpp's loader reads them from (spelled out: gguf-py has names for them from 0.19 on)
INDEXER_KEYS = {"index_n_heads": "attention.indexer.head_count", "index_head_dim": "attention.indexer.key_length",
                "index_topk": "attention.indexer.top_k"}

# integer fields of config.json that may be absent or null (the required ones are listed in
# DeepseekConverter.__init__); a string or float there is a broken config, not a model
OPTIONAL_COUNTS = ("intermediate_size", "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok",
                   "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "q_lora_rank", "n_group",
                   "topk_group", "max_position_embeddings", "num_nextn_predict_layers")

# how the router ranks groups of experts (the engine's deepseek2.expert_group_score_topk):
# V2's group_limited_greedy keeps the groups holding the best single experts,
# V3's noaux_tc the groups with the best top-2 sums.
GROUP_SCORE_TOPK = {"group_limited_greedy": 1, "noaux_tc": 2}


def rope_config(cfg: dict) -> dict:
    """RoPE settings from either config form, as one flat dict."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        params = params["full_attention"]
    if isinstance(params, dict):
        rope = dict(params)
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
    else:
        rope = dict(cfg.get("rope_scaling") or {})
        rope_type = rope.get("type") or rope.get("rope_type") or "default"
        rope.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    rope["rope_type"] = rope_type
    rope.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    return rope


@dataclass(frozen=True)
class TensorSpec:
    """One row of the tensor table (DeepseekConverter.tensor_table): a GGUF tensor the
    config implies and the checkpoint tensors it is made from."""
    name: str                        # GGUF tensor name
    shape: tuple[int, ...]           # its shape, numpy order (outermost first)
    sources: tuple[str, ...]         # the checkpoint tensors it is made from, in reading order
    source_shape: tuple[int, ...]    # the shape config.json implies for each source
    op: str = "copy"                 # copy | k_b, v_b (split of kv_b_proj) | stack (experts)
    required: bool = True            # False: written only when the checkpoint has its source
    missing: str | None = None       # the error when a required source is absent (None: the generic one)

    def qtype(self, outtype: gguf.GGMLQuantizationType) -> gguf.GGMLQuantizationType:
        """The type the converter writes it in for `outtype`."""
        return choose_qtype(self.name, self.shape, outtype)


# A decoder layer's modules in the order DeepSeek's modeling code registers them: the
# state_dict order, in which the published checkpoints are sharded.
_LAYER_MODULES = ("embed_tokens", "enorm", "hnorm", "eh_proj", "self_attn.q_proj", "self_attn.q_a_proj", "self_attn.q_a_layernorm", "self_attn.q_b_proj",
                  "self_attn.kv_a_proj_with_mqa", "self_attn.kv_a_layernorm", "self_attn.kv_b_proj",
                  "self_attn.o_proj", "self_attn.indexer.wq_b", "self_attn.indexer.wk", "self_attn.indexer.k_norm",
                  "self_attn.indexer.weights_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "mlp.experts", "mlp.gate",
                  "mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj",
                  "input_layernorm", "post_attention_layernorm", "shared_head.norm", "shared_head.head")
_MLP_PROJ = ("gate_proj", "up_proj", "down_proj")
_PARAMS = ("weight", "bias", "e_score_correction_bias")
_OUTSIDE_LAYERS = {"model.embed_tokens.weight": 0, "model.norm.weight": 2, "lm_head.weight": 3}  # layers: 1
_LAYER = re.compile(r"model\.layers\.(\d+)\.(?:mlp\.experts\.(\d+)\.(\w+)|(.+))\.(\w+)$")


def _state_dict_position(name: str) -> tuple:
    m = _LAYER.match(name)
    if not m:
        return (_OUTSIDE_LAYERS[name],)
    layer, expert, proj, module, param = m.groups()
    if expert is not None:
        return (1, int(layer), _LAYER_MODULES.index("mlp.experts"), int(expert), _MLP_PROJ.index(proj))
    return (1, int(layer), _LAYER_MODULES.index(module), _PARAMS.index(param))


def _layer_index(name: str) -> int | None:
    """The layer a checkpoint tensor belongs to (`model.layers.N.`), None outside the layers."""
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def tensor_table(config: dict, model_dir: str | Path = ".") -> list[TensorSpec]:
    """The GGUF tensors `config` implies, their shapes and sources (no checkpoint needed)."""
    return DeepseekConverter(config, Path(model_dir)).tensor_table()


def checkpoint_tensors(config: dict, optional: bool = False, model_dir: str | Path = ".") -> dict[str, tuple[int, ...]]:
    """The checkpoint tensors (name -> shape) `config` implies, in state_dict order."""
    return DeepseekConverter(config, Path(model_dir)).checkpoint_tensors(optional)


class DeepseekConverter(MtpLayers):
    arch = ARCH

    def __init__(self, config: dict, model_dir: Path):
        self.cfg = config
        self.dir = Path(model_dir)
        self.hf_arch = (config.get("architectures") or [None])[0]
        self.is_v32 = self.hf_arch == "DeepseekV32ForCausalLM" or config.get("model_type") == "deepseek_v32"
        # V3.2 routes and scales as V3 does
        self.is_v3 = self.is_v32 or self.hf_arch == "DeepseekV3ForCausalLM" or config.get("model_type") == "deepseek_v3"
        self.arch = ARCH_DSA if self.is_v32 else ARCH
        need = ["hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "vocab_size"]
        missing = [k for k in need if config.get(k) is None]
        if missing:
            raise ConversionError(f"{self.dir}/config.json lacks {', '.join(missing)}")
        for k in (*need, *OPTIONAL_COUNTS):
            v = config.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (k in need)):
                raise ConversionError(f"{self.dir}/config.json: {k} must be a {'positive' if k in need else 'non-negative'} "
                                      f"integer, not {v!r}")
        if self.is_v32:
            self._check_indexer(config)
        self.n_layer = int(config["num_hidden_layers"])
        self.n_head = int(config["num_attention_heads"])
        self.q_lora = config.get("q_lora_rank")
        self.n_expert = int(config.get("n_routed_experts") or 0)
        self.first_dense = int(config.get("first_k_dense_replace") or (0 if self.n_expert else self.n_layer))
        self.moe_freq = int(config.get("moe_layer_freq") or 1)
        self.topk_method = config.get("topk_method") or ("noaux_tc" if self.is_v3 else "greedy")
        self.scoring = config.get("scoring_func") or ("sigmoid" if self.is_v3 else "softmax")
        self.rope = rope_config(config)
        # multi-token-prediction (MTP, "nextn") layers: DeepSeek stores them after the main ones
        # (V3's layer 61); written as blk.N.* + blk.N.nextn.* unless keep_mtp is set False
        self.n_mtp_config = int(config.get("num_nextn_predict_layers") or 0)
        self.n_mtp = self.n_mtp_config
        self._keep_mtp = True
        self.ckpt: Checkpoint | None = None
        # GGUF tensor -> how an INT4 checkpoint's quantized weights went into it ("exact q4_1",
        # "dequantized to bf16: why"); filled by plan()
        self.int4_import: dict[str, str] = {}

    def _check_indexer(self, c: dict) -> None:
        """V3.2's indexer settings, as the engine can run them (else one clear error, before
        anything is written)."""
        missing = [k for k in (*INDEXER_KEYS, "q_lora_rank") if c.get(k) is None]
        if missing:
            raise ConversionError(f"{self.dir}/config.json lacks {', '.join(missing)} "
                                  f"(DeepseekV32ForCausalLM needs the indexer's settings and q_lora_rank)")
        for k in INDEXER_KEYS:
            v = c[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConversionError(f"{self.dir}/config.json: {k} must be a positive integer, not {v!r}")
        d, rope_dim = c["index_head_dim"], c.get("qk_rope_head_dim")
        if d < 64 or d & (d - 1):
            # the engine rotates the indexer's keys by a Hadamard matrix of a power-of-two size >= 64
            raise ConversionError(f"{self.dir}/config.json: index_head_dim {d} is not supported "
                                  f"(a power of two >= 64, as DeepSeek-V3.2's 128)")
        if isinstance(rope_dim, int) and rope_dim > d:
            raise ConversionError(f"{self.dir}/config.json: qk_rope_head_dim {rope_dim} exceeds index_head_dim {d} "
                                  f"(the indexer's head holds the rotary part)")

    # -- description -------------------------------------------------------------

    def describe(self) -> str:
        dsa = (f", DSA indexer {self.cfg['index_n_heads']}x{self.cfg['index_head_dim']} top-{self.cfg['index_topk']}"
               if self.is_v32 else "")
        return (f"{self.hf_arch}: {self.n_layer} layers, hidden {self.cfg['hidden_size']}, "
                f"{self.n_expert} experts ({self.topk_method}, {self.scoring}), "
                f"q-LoRA {self.q_lora or 'none'}, rope {self.rope['rope_type']}{dsa}")

    def is_moe_layer(self, i: int) -> bool:
        return self.n_expert > 0 and i >= self.first_dense and i % self.moe_freq == 0

    # -- metadata ------------------------------------------------------------------

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        c = self.cfg
        kv_lora, nope, rope_dim, v_dim = (int(c[k]) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
        name = c.get("_name_or_path") or self.dir.name
        w.add_name(Path(str(name)).name)
        # the MTP layers count as blocks (llama.cpp: block_count = main layers + nextn_predict_layers)
        w.add_block_count(self.n_layer + self.n_mtp)
        if self.n_mtp:
            w.add_nextn_predict_layers(self.n_mtp)
        w.add_context_length(int(c.get("max_position_embeddings", 4096)))
        w.add_embedding_length(int(c["hidden_size"]))
        w.add_feed_forward_length(int(c.get("intermediate_size") or c.get("moe_intermediate_size")))
        w.add_head_count(self.n_head)
        # MLA is run as MQA over the latent: one KV "head" of kv_lora + rope width
        w.add_head_count_kv(1)
        w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
        w.add_vocab_size(int(c["vocab_size"]))
        # (a model without experts: every block dense, the MTP ones too)
        w.add_leading_dense_block_count(self.first_dense if self.n_expert else self.n_layer + self.n_mtp)
        if self.q_lora:
            w.add_q_lora_rank(int(self.q_lora))
        w.add_kv_lora_rank(kv_lora)
        w.add_key_length(kv_lora + rope_dim)
        w.add_value_length(kv_lora)
        w.add_key_length_mla(nope + rope_dim)
        w.add_value_length_mla(v_dim)
        w.add_rope_dimension_count(rope_dim)
        w.add_rope_freq_base(float(self.rope["rope_theta"]))
        self._write_rope_scaling(w)
        self._write_routing(w)
        if self.is_v32:
            for key, gguf_key in INDEXER_KEYS.items():
                w.add_uint32(f"{self.arch}.{gguf_key}", int(c[key]))

    def _write_rope_scaling(self, w: gguf.GGUFWriter) -> None:
        r = self.rope
        t = r["rope_type"]
        if t in ("default", None):
            return
        if t != "yarn":
            raise ConversionError(f"rope type {t!r} is not supported for DeepSeek checkpoints (expected yarn or none)")
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(r["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(r["original_max_position_embeddings"]))
        if r.get("beta_fast") is not None:
            w.add_rope_scaling_yarn_beta_fast(float(r["beta_fast"]))
        if r.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(float(r["beta_slow"]))
        if r.get("mscale_all_dim") is not None:
            # the engine divides this key by 0.1 (llama.cpp's legacy encoding for deepseek2)
            w.add_rope_scaling_yarn_log_mul(0.1 * float(r["mscale_all_dim"]))

    def _write_routing(self, w: gguf.GGUFWriter) -> None:
        c = self.cfg
        w.add_expert_feed_forward_length(int(c.get("moe_intermediate_size") or c.get("intermediate_size")))
        w.add_expert_shared_count(int(c.get("n_shared_experts") or 0))
        if not self.n_expert:
            return
        w.add_expert_count(self.n_expert)
        w.add_expert_used_count(int(c["num_experts_per_tok"]))
        if self.scoring == "sigmoid":
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        elif self.scoring == "softmax":
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
        else:
            raise ConversionError(f"scoring_func {self.scoring!r} is not supported (softmax or sigmoid)")
        norm = bool(c.get("norm_topk_prob", False))
        scale = float(c.get("routed_scaling_factor") or 1.0)
        if norm and not self.is_v3:
            # DeepSeek-V2 applies routed_scaling_factor only when it does not renormalise
            scale = 1.0
        w.add_expert_weights_norm(norm)
        w.add_expert_weights_scale(scale)
        n_group, topk_group = int(c.get("n_group") or 1), int(c.get("topk_group") or 1)
        if self.topk_method in GROUP_SCORE_TOPK:
            if n_group > 1:
                if self.n_expert % n_group:
                    raise ConversionError(f"n_routed_experts {self.n_expert} is not a multiple of n_group {n_group}")
                w.add_expert_group_count(n_group)
                w.add_expert_group_used_count(topk_group)
            if self.arch == ARCH:  # our engine's key for deepseek2; DEEPSEEK32 ranks groups as V3 does
                w.add_uint32(f"{ARCH}.expert_group_score_topk", GROUP_SCORE_TOPK[self.topk_method])
        elif self.topk_method != "greedy":
            raise ConversionError(f"topk_method {self.topk_method!r} is not supported "
                                  f"(greedy, group_limited_greedy or noaux_tc)")

    # -- tensors -------------------------------------------------------------------

    def tensor_table(self) -> list[TensorSpec]:
        """THE DeepSeek tensor plan: every GGUF tensor this config implies, in the order
        they are written, with its shape and the checkpoint tensors (and their shapes) it
        is made from. A function of config.json alone; `plan` checks a checkpoint against
        it, synth writes it without one, and `checkpoint_tensors` lists its sources."""
        c = self.cfg
        table: list[TensorSpec] = []

        def direct(gguf_name: str, src: str, shape: tuple[int, ...], **kw) -> None:
            table.append(TensorSpec(gguf_name, shape, (src,), shape, **kw))

        H, V = int(c["hidden_size"]), int(c["vocab_size"])
        direct("token_embd.weight", "model.embed_tokens.weight", (V, H))
        for i in range(self.n_layer):
            self._layer_rows(table, i)
        direct("output_norm.weight", "model.norm.weight", (H,))
        # written whenever the checkpoint has it; a tied model may leave it out
        direct("output.weight", "lm_head.weight", (V, H), required=not c.get("tie_word_embeddings"),
               missing="lm_head.weight is missing and tie_word_embeddings is not set")
        # the MTP layers, last: a whole decoder layer each plus the nextn tensors llama.cpp's
        # loader reads (src/models/deepseek2.cpp, deepseek32.cpp); DeepSeek's own copies of the
        # embedding and output head (shared with the main model) are written when present
        for i in range(self.n_layer, self.n_layer + self.n_mtp):
            p, b = f"model.layers.{i}.", f"blk.{i}.nextn."
            self._layer_rows(table, i)
            direct(b + "eh_proj.weight", p + "eh_proj.weight", (H, 2 * H))
            direct(b + "enorm.weight", p + "enorm.weight", (H,))
            direct(b + "hnorm.weight", p + "hnorm.weight", (H,))
            direct(b + "shared_head_norm.weight", p + "shared_head.norm.weight", (H,))
            direct(b + "embed_tokens.weight", p + "embed_tokens.weight", (V, H), required=False)
            direct(b + "shared_head_head.weight", p + "shared_head.head.weight", (V, H), required=False)
        return table

    def _layer_rows(self, table: list[TensorSpec], i: int) -> None:
        """The rows of decoder layer i (a main or an MTP layer)."""
        c = self.cfg

        def direct(gguf_name: str, src: str, shape: tuple[int, ...], **kw) -> None:
            table.append(TensorSpec(gguf_name, shape, (src,), shape, **kw))

        H = int(c["hidden_size"])
        nope, rope_dim, v_dim, kv_lora = (int(c[k]) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank"))
        qk = nope + rope_dim
        n_ff = int(c.get("intermediate_size") or 0)
        n_ff_exp = int(c.get("moe_intermediate_size") or 0)
        p, b = f"model.layers.{i}.", f"blk.{i}."
        direct(b + "attn_norm.weight", p + "input_layernorm.weight", (H,))
        if self.q_lora:
            r = int(self.q_lora)
            direct(b + "attn_q_a.weight", p + "self_attn.q_a_proj.weight", (r, H))
            direct(b + "attn_q_a_norm.weight", p + "self_attn.q_a_layernorm.weight", (r,))
            direct(b + "attn_q_b.weight", p + "self_attn.q_b_proj.weight", (self.n_head * qk, r))
        else:
            direct(b + "attn_q.weight", p + "self_attn.q_proj.weight", (self.n_head * qk, H))
        direct(b + "attn_kv_a_mqa.weight", p + "self_attn.kv_a_proj_with_mqa.weight", (kv_lora + rope_dim, H))
        direct(b + "attn_kv_a_norm.weight", p + "self_attn.kv_a_layernorm.weight", (kv_lora,))
        # kv_b_proj is split per head into the key part (transposed) and the value part
        kvb, kvb_shape = (p + "self_attn.kv_b_proj.weight",), (self.n_head * (nope + v_dim), kv_lora)
        table.append(TensorSpec(b + "attn_k_b.weight", (self.n_head, kv_lora, nope), kvb, kvb_shape, "k_b"))
        table.append(TensorSpec(b + "attn_v_b.weight", (self.n_head, v_dim, kv_lora), kvb, kvb_shape, "v_b"))
        direct(b + "attn_output.weight", p + "self_attn.o_proj.weight", (H, self.n_head * v_dim))
        if self.is_v32:
            n_idx, d_idx = int(c["index_n_heads"]), int(c["index_head_dim"])
            ix = p + "self_attn.indexer."
            direct(b + "indexer.attn_q_b.weight", ix + "wq_b.weight", (n_idx * d_idx, int(self.q_lora)))
            direct(b + "indexer.attn_k.weight", ix + "wk.weight", (d_idx, H))
            direct(b + "indexer.k_norm.weight", ix + "k_norm.weight", (d_idx,))
            direct(b + "indexer.k_norm.bias", ix + "k_norm.bias", (d_idx,))
            direct(b + "indexer.proj.weight", ix + "weights_proj.weight", (n_idx, H))
        direct(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", (H,))
        if not self.is_moe_layer(i):
            direct(b + "ffn_gate.weight", p + "mlp.gate_proj.weight", (n_ff, H))
            direct(b + "ffn_up.weight", p + "mlp.up_proj.weight", (n_ff, H))
            direct(b + "ffn_down.weight", p + "mlp.down_proj.weight", (H, n_ff))
            return
        direct(b + "ffn_gate_inp.weight", p + "mlp.gate.weight", (self.n_expert, H))
        # V3's routing bias: written whenever the checkpoint has it, needed by noaux_tc
        bias = p + "mlp.gate.e_score_correction_bias"
        direct(b + "exp_probs_b.bias", bias, (self.n_expert,), required=self.topk_method == "noaux_tc",
               missing=f"noaux_tc routing needs {bias}, which is missing")
        for proj, gname, shape in (("gate_proj", "ffn_gate_exps", (n_ff_exp, H)),
                                   ("up_proj", "ffn_up_exps", (n_ff_exp, H)),
                                   ("down_proj", "ffn_down_exps", (H, n_ff_exp))):
            srcs = tuple(f"{p}mlp.experts.{e}.{proj}.weight" for e in range(self.n_expert))
            table.append(TensorSpec(b + gname + ".weight", (self.n_expert, *shape), srcs, shape, "stack"))
        n_sh = int(c.get("n_shared_experts") or 0)
        if n_sh:
            f = n_ff_exp * n_sh
            direct(b + "ffn_gate_shexp.weight", p + "mlp.shared_experts.gate_proj.weight", (f, H))
            direct(b + "ffn_up_shexp.weight", p + "mlp.shared_experts.up_proj.weight", (f, H))
            direct(b + "ffn_down_shexp.weight", p + "mlp.shared_experts.down_proj.weight", (H, f))

    def checkpoint_tensors(self, optional: bool = False) -> dict[str, tuple[int, ...]]:
        """The checkpoint tensors (name -> shape) this config implies, in the order DeepSeek's
        modeling code registers them (= state_dict order, that of the published shards).
        optional: also those the converter takes when present but does without (a routing
        bias outside noaux_tc, a tied model's lm_head)."""
        out: dict[str, tuple[int, ...]] = {}
        for spec in self.tensor_table():
            if spec.required or optional:
                out.update(dict.fromkeys(spec.sources, spec.source_shape))
        return dict(sorted(out.items(), key=lambda kv: _state_dict_position(kv[0])))

    def plan(self, ckpt: Checkpoint, outtype: gguf.GGMLQuantizationType) -> list[TensorPlan]:
        """`tensor_table` checked against the checkpoint's headers: every source present with
        the shape config.json implies, and no checkpoint tensor left unused."""
        self.ckpt = ckpt
        self._check_mtp(ckpt)
        plans: list[TensorPlan] = []
        used: set[str] = set()
        for spec in self.tensor_table():
            if not spec.required and not all(s in ckpt for s in spec.sources):
                continue
            for src in spec.sources:
                if src not in ckpt:
                    raise CheckpointError(f"{self.dir}: {spec.missing or f'tensor {src} is missing from the checkpoint'}")
                if ckpt.shape(src) != spec.source_shape:
                    raise CheckpointError(f"{self.dir}: tensor {src} has shape {ckpt.shape(src)}, "
                                          f"config.json implies {spec.source_shape}")
            used.update(spec.sources)
            plans.append(self._tensor_plan(spec, outtype))

        # the MTP layers, when left out (keep_mtp False, or none in the checkpoint), are not needed
        left = [n for n in ckpt.names() if n not in used
                and not (not self._keep_mtp and (_layer_index(n) or 0) >= self.n_layer)
                and not n.endswith("rotary_emb.inv_freq")]
        if left:
            raise CheckpointError(f"{self.dir}: {len(left)} checkpoint tensors are not understood "
                                  f"by the {self.hf_arch} converter, e.g. {left[:4]}")
        return plans

    def _check_mtp(self, ckpt) -> None:
        """The checkpoint's MTP layers against config.json's num_nextn_predict_layers, when they
        are kept: layers the config does not announce, or an incomplete MTP layer, are one error
        naming them, before anything is written; a checkpoint without any MTP tensor (a
        re-upload that dropped them) converts without the block, with a warning."""
        if not self._keep_mtp:   # --no-mtp: whatever lies beyond the main layers is left out
            return
        last = self.n_layer + self.n_mtp
        beyond = sorted({i for n in ckpt.names() if (i := _layer_index(n)) is not None and i >= last})
        if beyond:
            example = next(n for n in ckpt.names() if _layer_index(n) == beyond[0])
            raise CheckpointError(
                f"{self.dir}: the checkpoint has tensors of layer {', '.join(map(str, beyond))} (e.g. {example}), "
                f"beyond num_hidden_layers {self.n_layer} + num_nextn_predict_layers {self.n_mtp} in config.json; "
                f"fix the config, or convert with --no-mtp to leave them out")
        if not self.n_mtp:
            return
        mtp_sources = [s for spec in self.tensor_table() if spec.required
                       for s in spec.sources if (_layer_index(s) or 0) >= self.n_layer]
        if not any((_layer_index(n) or 0) >= self.n_layer for n in ckpt.names()):
            log.warning("config.json has num_nextn_predict_layers %d but the checkpoint holds no MTP layer "
                        "(layer %d): converting without it", self.n_mtp, self.n_layer)
            self.n_mtp = 0
            return
        missing = [s for s in mtp_sources if s not in ckpt]
        if missing:
            raise CheckpointError(
                f"{self.dir}: the MTP layer (num_nextn_predict_layers {self.n_mtp}) is incomplete: {len(missing)} "
                f"tensor(s) missing, e.g. {', '.join(missing[:3])}; convert with --no-mtp to leave it out")

    def _tensor_plan(self, spec: TensorSpec, outtype: gguf.GGMLQuantizationType) -> TensorPlan:
        """The plan of one table row. From an INT4 checkpoint (converters/quantized.py), a
        tensor made of quantized Linears keeps their exact q4_0 / q4_1 blocks whatever
        `outtype` asks for; one that cannot (see _int4_type) is dequantized and follows
        outtype, with a warning naming it and why."""
        is_quantized = getattr(self.ckpt, "is_quantized", None)
        quantized = [s for s in spec.sources if is_quantized and is_quantized(s)]
        if quantized:
            qtype, why = self._int4_type(spec, len(quantized))
            if qtype is not None:
                self.int4_import[spec.name] = f"exact {qtype.name.lower()}"
                return TensorPlan(spec.name, spec.shape, qtype, lambda: self._int4_blocks(spec, qtype), list(spec.sources))
            fallback = spec.qtype(outtype)
            self.int4_import[spec.name] = f"dequantized to {fallback.name.lower()}: {why}"
            log.warning("%s: %s INT weights dequantized and converted to %s, not kept exact: %s",
                        spec.name, self.ckpt.method, fallback.name.lower(), why)
        return TensorPlan(spec.name, spec.shape, spec.qtype(outtype), self._producer(spec), list(spec.sources))

    def _int4_type(self, spec: TensorSpec, n_quantized: int):
        """(q4_0 | q4_1, "") when this GGUF tensor can hold its sources' INT4 groups
        exactly, else (None, why not)."""
        if n_quantized != len(spec.sources):
            return None, "only some of its checkpoint tensors are quantized"
        if spec.op == "k_b":
            # the key half of kv_b_proj is transposed for MLA: its groups run along kv_lora_rank,
            # which becomes the GGUF tensor's outer dim, so no 32-block holds one group
            return None, "transposed for MLA (attn_k_b), so its quantization groups do not run along GGUF rows"
        types = set()
        for src in spec.sources:
            qtype, why = self.ckpt.int_weight(src, codes=False).exact_type()
            if qtype is None:
                return None, f"{src}: {why}"
            types.add(qtype)
        # stacked experts mixing both kinds: q4_0 blocks convert to q4_1 exactly
        return (gguf.GGMLQuantizationType.Q4_1 if len(types) > 1 else types.pop()), ""

    def _int4_blocks(self, spec: TensorSpec, qtype: gguf.GGMLQuantizationType) -> EncodedBlocks:
        def blocks(src: str) -> np.ndarray:
            w = self.ckpt.int_weight(src)
            own, _ = w.exact_type()
            b = w.blocks(own)
            return q4_0_as_q4_1(b) if own != qtype else b
        if spec.op == "copy":
            return EncodedBlocks(blocks(spec.sources[0]))
        if spec.op == "stack":
            out = np.stack([blocks(s) for s in spec.sources])
            for s in spec.sources:
                self.ckpt.drop_pages(s)
            return EncodedBlocks(out)
        if spec.op == "v_b":  # rows nope.. of each head: whole rows, so whole blocks
            nope, v_dim = int(self.cfg["qk_nope_head_dim"]), int(self.cfg["v_head_dim"])
            b = blocks(spec.sources[0]).reshape(self.n_head, nope + v_dim, -1)
            return EncodedBlocks(np.ascontiguousarray(b[:, nope:]))
        raise AssertionError(spec.op)

    def _producer(self, spec: TensorSpec):
        if spec.op == "copy":
            src = spec.sources[0]
            return lambda: self.ckpt.f32(src)
        if spec.op == "k_b":
            return lambda: self._k_b(spec.sources[0])
        if spec.op == "v_b":
            return lambda: self._v_b(spec.sources[0])
        if spec.op == "stack":
            return lambda: stack_f32(self.ckpt, spec.sources)
        raise AssertionError(spec.op)

    def _kv_b(self, src: str) -> np.ndarray:
        c = self.cfg
        nope, v_dim = int(c["qk_nope_head_dim"]), int(c["v_head_dim"])
        kv_b = self.ckpt.f32(src)
        return kv_b.reshape(self.n_head, nope + v_dim, kv_b.shape[-1])

    def _k_b(self, src: str) -> np.ndarray:
        nope = int(self.cfg["qk_nope_head_dim"])
        # per head: latent -> key rows, transposed so the engine can absorb it into q
        return np.ascontiguousarray(self._kv_b(src)[:, :nope, :].transpose(0, 2, 1))

    def _v_b(self, src: str) -> np.ndarray:
        nope = int(self.cfg["qk_nope_head_dim"])
        return np.ascontiguousarray(self._kv_b(src)[:, nope:, :])


# -- plugin hooks ------------------------------------------------------------------

@hookimpl
def deepseek_cpu_supported_architectures() -> list[str]:
    return list(ARCHITECTURES)


@hookimpl
def deepseek_cpu_converter(config: dict, model_dir: Path):
    archs = config.get("architectures") or []
    if any(a in ARCHITECTURES for a in archs) or (not archs and config.get("model_type") in MODEL_TYPES):
        return DeepseekConverter(config, model_dir)
    return None
