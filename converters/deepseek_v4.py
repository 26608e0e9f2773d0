"""DeepSeek-V4 checkpoints (DeepseekV4ForCausalLM -> deepseek4 GGUF), as DeepSeek publishes them.

V4 (V4-Flash, V4-Pro) ships its own tensor names (`embed`, `layers.N.attn.wq_a`, `layers.N.ffn.experts.E.w1`,
`hc_head_fn`, ...), config.json in DeepSeek's form (`compress_ratios` per layer, `num_hash_layers`,
`qk_rope_head_dim`, `rope_scaling` for the compressed layers), FP8 projections with UE8M0 block scales
and MXFP4 routed experts (converters/fp8.py reads both). What the architecture adds to V3:

* mHC: the residual is `hc_mult` streams mixed by `hc_{attn,ffn}_{fn,base,scale}` per layer and
  collapsed by `hc_head_*` before the output norm;
* attention: one shared K=V head (`wkv`) with attention sinks, a grouped low-rank output (`wo_a`,
  `wo_b`), a sliding window, and per layer a compressor: ratio 4 (CSA, with a lightning indexer that
  keeps `index_topk` compressed entries) or 128 (HCA), 0 = sliding window only;
* MoE with sqrt(softplus) scores; the first `num_hash_layers` route by a fixed table `tid2eid`
  (token id -> its experts) instead of a learned top-k; SwiGLU clamped at `swiglu_limit`.

Storage: the converter keeps what DeepSeek stored exactly where a GGML type can hold it: MXFP4
experts as GGML MXFP4 (bit for bit), FP8 x power-of-two scales as bf16 (exact), F32 tensors as
F32, the hash table as I32; `--outtype f32` dequantizes everything (exact too). Where `outtype`
asks for less (f16, q8_0), the tensors that lose precision are listed in one warning.
The MTP block (`mtp.N.*`) is written as block num_hidden_layers + N (`blk.*` + `blk.*.nextn.*`, as
llama.cpp's deepseek4 loader reads it; upstream's converter writes it to a separate file instead);
its own mHC head `mtp.N.hc_head_*` has no tensor name there and is left out (see _check_mtp).

The one table of GGUF tensors a config implies is `tensor_table`, as in deepseek.py.
"""
from __future__ import annotations

import logging
from pathlib import Path

import gguf
import numpy as np

from deepseek_cpu.hookspecs import hookimpl

from .base import ConversionError, EncodedBlocks, MtpLayers, TensorPlan, choose_qtype, stack_f32
from .checkpoint import CheckpointError
from .deepseek import TensorSpec, rope_config

log = logging.getLogger("deepseek_cpu.conversion")
Q = gguf.GGMLQuantizationType

ARCHITECTURES = ("DeepseekV4ForCausalLM",)
ARCH = "deepseek4"
COMPRESS_RATIOS = (0, 4, 128)        # the ratios the engine's graph has paths for
SQRT_SOFTPLUS = 4                    # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS (gguf-py lacks it)
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "qk_rope_head_dim",
            "q_lora_rank", "o_groups", "o_lora_rank", "moe_intermediate_size", "n_routed_experts",
            "num_experts_per_tok", "n_shared_experts", "sliding_window", "index_n_heads", "index_head_dim",
            "index_topk", "hc_mult", "hc_sinkhorn_iters", "vocab_size")
# the keys llama.cpp's deepseek4 loader reads, beyond those gguf-py has writers for (spelled out, one place)
KEYS = {"indexer_heads": "attention.indexer.head_count", "indexer_dim": "attention.indexer.key_length",
        "indexer_topk": "attention.indexer.top_k", "o_groups": "attention.output_group_count",
        "o_lora": "attention.output_lora_rank", "ratios": "attention.compress_ratios",
        "compress_base": "attention.compress_rope_freq_base", "hc": "hyper_connection.count",
        "sinkhorn": "hyper_connection.sinkhorn_iterations", "hc_eps": "hyper_connection.epsilon",
        "hash_layers": "hash_layer_count", "embd_out": "embedding_length_out",
        "clamp_exp": "swiglu_clamp_exp", "clamp_shexp": "swiglu_clamp_shexp"}


class DeepseekV4Converter(MtpLayers):
    arch = ARCH

    def __init__(self, config: dict, model_dir: Path):
        self.cfg, self.dir = config, Path(model_dir)
        self.hf_arch = (config.get("architectures") or ["DeepseekV4ForCausalLM"])[0]
        where = f"{self.dir}/config.json"
        missing = [k for k in REQUIRED if config.get(k) is None]
        if missing:
            raise ConversionError(f"{where} lacks {', '.join(missing)}")
        for k in REQUIRED:
            v = config[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConversionError(f"{where}: {k} must be a positive integer, not {v!r}")
        c = config
        self.n_layer = c["num_hidden_layers"]
        self.n_hash = c.get("num_hash_layers", 0)
        if isinstance(self.n_hash, bool) or not isinstance(self.n_hash, int) or not 0 <= self.n_hash <= self.n_layer:
            raise ConversionError(f"{where}: num_hash_layers must be an integer from 0 to {self.n_layer}, "
                                  f"not {self.n_hash!r}")
        self.n_mtp_config = c.get("num_nextn_predict_layers") or 0
        if isinstance(self.n_mtp_config, bool) or not isinstance(self.n_mtp_config, int) or self.n_mtp_config < 0:
            raise ConversionError(f"{where}: num_nextn_predict_layers must be a non-negative integer, "
                                  f"not {self.n_mtp_config!r}")
        ratios = c.get("compress_ratios")
        if not isinstance(ratios, list) or len(ratios) < self.n_layer:
            raise ConversionError(f"{where}: compress_ratios must list one ratio per layer ({self.n_layer}), "
                                  f"not {ratios!r}")
        bad = [r for r in ratios if r not in COMPRESS_RATIOS or isinstance(r, bool)]
        if bad:
            raise ConversionError(f"{where}: compress_ratios holds {bad[0]!r}; the engine runs "
                                  f"{', '.join(map(str, COMPRESS_RATIOS))}")
        # one ratio per main layer, then one per MTP layer (V4-Flash: 43 + 1)
        self.ratios = [int(r) for r in ratios[: self.n_layer + self.n_mtp_config]]
        scoring = c.get("scoring_func", "sqrtsoftplus")
        if scoring != "sqrtsoftplus":
            raise ConversionError(f"{where}: scoring_func {scoring!r} is not supported for DeepSeek-V4 "
                                  f"(sqrtsoftplus)")
        for k in ("head_dim", "index_head_dim"):
            d = c[k]
            if d < 64 or d & (d - 1):   # the engine rotates these heads by a Hadamard matrix
                raise ConversionError(f"{where}: {k} {d} is not supported (a power of two >= 64, as V4's "
                                      f"{512 if k == 'head_dim' else 128})")
        if c["qk_rope_head_dim"] > c["head_dim"] or c["qk_rope_head_dim"] % 2:
            raise ConversionError(f"{where}: qk_rope_head_dim {c['qk_rope_head_dim']} must be even and at most "
                                  f"head_dim {c['head_dim']}")
        if (c["num_attention_heads"] * c["head_dim"]) % c["o_groups"]:
            raise ConversionError(f"{where}: o_groups {c['o_groups']} does not divide the heads' width "
                                  f"{c['num_attention_heads'] * c['head_dim']}")
        if c["num_experts_per_tok"] > c["n_routed_experts"]:
            raise ConversionError(f"{where}: num_experts_per_tok exceeds n_routed_experts")
        self.rope = rope_config(c)
        self.ckpt = None
        self.n_mtp = self.n_mtp_config
        self._keep_mtp = True
        self.not_exact: dict[str, str] = {}   # GGUF tensor -> how outtype rounded it (filled by plan)

    def describe(self) -> str:
        c = self.cfg
        kinds = {0: "SWA", 4: "CSA", 128: "HCA"}
        return (f"{self.hf_arch}: {self.n_layer} layers ({'/'.join(kinds[r] for r in self.ratios[:self.n_layer])}), hidden "
                f"{c['hidden_size']}, mHC x{c['hc_mult']}, {c['n_routed_experts']} experts top-{c['num_experts_per_tok']} "
                f"({self.n_hash} hash-routed), window {c['sliding_window']}, indexer top-{c['index_topk']}")

    # -- metadata ------------------------------------------------------------------

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        c, a = self.cfg, self.arch
        name = c.get("_name_or_path") or self.dir.name
        w.add_name(Path(str(name)).name)
        H = int(c["hidden_size"])
        n_all = self.n_layer + self.n_mtp   # the MTP layers are blocks too (llama.cpp's deepseek4 loader)
        w.add_block_count(n_all)
        if self.n_mtp:
            w.add_nextn_predict_layers(self.n_mtp)
        w.add_context_length(int(c.get("max_position_embeddings", 1 << 20)))
        w.add_embedding_length(H)
        w.add_head_count(int(c["num_attention_heads"]))
        w.add_head_count_kv(1)   # one shared K=V head
        w.add_key_length(int(c["head_dim"]))
        w.add_value_length(int(c["head_dim"]))
        w.add_rope_dimension_count(int(c["qk_rope_head_dim"]))
        w.add_rope_freq_base(float(c.get("rope_theta", 10000.0)))   # sliding-only layers' plain RoPE
        r = self.rope
        if r["rope_type"] == "yarn":   # the compressed layers' RoPE (theta compress_rope_theta)
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(float(r["factor"]))
            w.add_rope_scaling_orig_ctx_len(int(r["original_max_position_embeddings"]))
            w.add_rope_scaling_yarn_beta_fast(float(r.get("beta_fast", 32)))
            w.add_rope_scaling_yarn_beta_slow(float(r.get("beta_slow", 1)))
        elif r["rope_type"] != "default":
            raise ConversionError(f"rope type {r['rope_type']!r} is not supported for DeepSeek-V4 (yarn or none)")
        w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
        w.add_vocab_size(int(c["vocab_size"]))
        w.add_q_lora_rank(int(c["q_lora_rank"]))
        w.add_sliding_window(int(c["sliding_window"]))
        w.add_expert_count(int(c["n_routed_experts"]))
        w.add_expert_used_count(int(c["num_experts_per_tok"]))
        w.add_uint32(f"{a}.expert_gating_func", SQRT_SOFTPLUS)
        w.add_expert_feed_forward_length(int(c["moe_intermediate_size"]))
        w.add_expert_shared_count(int(c["n_shared_experts"]))
        w.add_expert_weights_scale(float(c.get("routed_scaling_factor", 1.0)))
        w.add_expert_weights_norm(bool(c.get("norm_topk_prob", True)))
        limit = float(c.get("swiglu_limit", 0.0) or 0.0)
        w.add_array(f"{a}.{KEYS['clamp_exp']}", [limit] * n_all)
        w.add_array(f"{a}.{KEYS['clamp_shexp']}", [limit] * n_all)
        w.add_uint32(f"{a}.{KEYS['indexer_heads']}", int(c["index_n_heads"]))
        w.add_uint32(f"{a}.{KEYS['indexer_dim']}", int(c["index_head_dim"]))
        w.add_uint32(f"{a}.{KEYS['indexer_topk']}", int(c["index_topk"]))
        w.add_uint32(f"{a}.{KEYS['o_groups']}", int(c["o_groups"]))
        w.add_uint32(f"{a}.{KEYS['o_lora']}", int(c["o_lora_rank"]))
        w.add_array(f"{a}.{KEYS['ratios']}", list(self.ratios[:n_all]))
        w.add_float32(f"{a}.{KEYS['compress_base']}", float(c.get("compress_rope_theta", 160000.0)))
        w.add_uint32(f"{a}.{KEYS['hc']}", int(c["hc_mult"]))
        w.add_uint32(f"{a}.{KEYS['sinkhorn']}", int(c["hc_sinkhorn_iters"]))
        w.add_float32(f"{a}.{KEYS['hc_eps']}", float(c.get("hc_eps", 1e-6)))
        w.add_uint32(f"{a}.{KEYS['hash_layers']}", self.n_hash)
        w.add_uint32(f"{a}.{KEYS['embd_out']}", H * int(c["hc_mult"]))

    # -- tensors -------------------------------------------------------------------

    def tensor_table(self) -> list[TensorSpec]:
        """Every GGUF tensor this config implies, in writing order, with its shape (numpy order) and
        the checkpoint tensors it comes from (DeepSeek's names). A function of config.json alone."""
        c = self.cfg
        H, V, hc = int(c["hidden_size"]), int(c["vocab_size"]), int(c["hc_mult"])
        hd, nh, ql = int(c["head_dim"]), int(c["num_attention_heads"]), int(c["q_lora_rank"])
        og, olr, E = int(c["o_groups"]), int(c["o_lora_rank"]), int(c["n_routed_experts"])
        ff, ns, k = int(c["moe_intermediate_size"]), int(c["n_shared_experts"]), int(c["num_experts_per_tok"])
        ni, di, mix = int(c["index_n_heads"]), int(c["index_head_dim"]), (2 + hc) * hc
        table: list[TensorSpec] = []

        def direct(gguf_name: str, src: str, shape: tuple[int, ...], op: str = "copy") -> None:
            table.append(TensorSpec(gguf_name, shape, (src,), shape, op))

        direct("token_embd.weight", "embed.weight", (V, H))
        for i in range(self.n_layer + self.n_mtp):
            if i == self.n_layer:   # the main model's head before the MTP layers, as before
                self._head_rows(table)
            # DeepSeek's MTP block j (`mtp.j.*`) is layer n_layer + j: the same decoder layer, plus
            # the nextn tensors of llama.cpp's deepseek4 loader
            p = f"layers.{i}." if i < self.n_layer else f"mtp.{i - self.n_layer}."
            b = f"blk.{i}."
            if i >= self.n_layer:
                n = b + "nextn."
                table.append(TensorSpec(n + "eh_proj.weight", (H, 2 * H), (p + "e_proj.weight", p + "h_proj.weight"),
                                        (H, H), "concat"))
                direct(n + "enorm.weight", p + "enorm.weight", (H,))
                direct(n + "hnorm.weight", p + "hnorm.weight", (H,))
                direct(n + "shared_head_norm.weight", p + "norm.weight", (H,))
            for part in ("attn", "ffn"):
                direct(f"{b}hc_{part}_fn.weight", f"{p}hc_{part}_fn", (mix, hc * H))
                direct(f"{b}hc_{part}_base.weight", f"{p}hc_{part}_base", (mix,))
                direct(f"{b}hc_{part}_scale.weight", f"{p}hc_{part}_scale", (3,))
            direct(b + "attn_norm.weight", p + "attn_norm.weight", (H,))
            direct(b + "attn_sinks.weight", p + "attn.attn_sink", (nh,))
            direct(b + "attn_q_a.weight", p + "attn.wq_a.weight", (ql, H))
            direct(b + "attn_q_a_norm.weight", p + "attn.q_norm.weight", (ql,))
            direct(b + "attn_q_b.weight", p + "attn.wq_b.weight", (nh * hd, ql))
            direct(b + "attn_kv.weight", p + "attn.wkv.weight", (hd, H))
            direct(b + "attn_kv_a_norm.weight", p + "attn.kv_norm.weight", (hd,))
            direct(b + "attn_output_a.weight", p + "attn.wo_a.weight", (og * olr, nh * hd // og))
            direct(b + "attn_output_b.weight", p + "attn.wo_b.weight", (H, og * olr))
            if i >= len(self.ratios):
                raise ConversionError(f"{self.dir}/config.json: compress_ratios has no ratio for the MTP layer {i} "
                                      f"(num_nextn_predict_layers {self.n_mtp}); convert with --no-mtp to leave it out")
            ratio = self.ratios[i]
            if ratio:
                coff = 2 if ratio == 4 else 1   # CSA's windows overlap: two series per token
                cp = p + "attn.compressor."
                direct(b + "attn_compressor_ape.weight", cp + "ape", (ratio, coff * hd))
                direct(b + "attn_compressor_kv.weight", cp + "wkv.weight", (coff * hd, H))
                direct(b + "attn_compressor_gate.weight", cp + "wgate.weight", (coff * hd, H))
                direct(b + "attn_compressor_norm.weight", cp + "norm.weight", (hd,))
            if ratio == 4:
                ip = p + "attn.indexer."
                direct(b + "indexer.attn_q_b.weight", ip + "wq_b.weight", (ni * di, ql))
                direct(b + "indexer.proj.weight", ip + "weights_proj.weight", (ni, H))
                direct(b + "indexer_compressor_ape.weight", ip + "compressor.ape", (ratio, 2 * di))
                direct(b + "indexer_compressor_kv.weight", ip + "compressor.wkv.weight", (2 * di, H))
                direct(b + "indexer_compressor_gate.weight", ip + "compressor.wgate.weight", (2 * di, H))
                direct(b + "indexer_compressor_norm.weight", ip + "compressor.norm.weight", (di,))
            direct(b + "ffn_norm.weight", p + "ffn_norm.weight", (H,))
            direct(b + "ffn_gate_inp.weight", p + "ffn.gate.weight", (E, H))
            if i < self.n_hash:
                direct(b + "ffn_gate_tid2eid.weight", p + "ffn.gate.tid2eid", (V, k), "i32")
            else:
                direct(b + "exp_probs_b.bias", p + "ffn.gate.bias", (E,))
            for proj, gname, shape in (("w1", "ffn_gate_exps", (ff, H)), ("w2", "ffn_down_exps", (H, ff)),
                                       ("w3", "ffn_up_exps", (ff, H))):
                srcs = tuple(f"{p}ffn.experts.{e}.{proj}.weight" for e in range(E))
                table.append(TensorSpec(f"{b}{gname}.weight", (E, *shape), srcs, shape, "stack"))
            sp = p + "ffn.shared_experts."
            direct(b + "ffn_gate_shexp.weight", sp + "w1.weight", (ff * ns, H))
            direct(b + "ffn_down_shexp.weight", sp + "w2.weight", (H, ff * ns))
            direct(b + "ffn_up_shexp.weight", sp + "w3.weight", (ff * ns, H))
        if not self.n_mtp:
            self._head_rows(table)
        return table

    def _head_rows(self, table: list[TensorSpec]) -> None:
        c = self.cfg
        H, V, hc = int(c["hidden_size"]), int(c["vocab_size"]), int(c["hc_mult"])
        for name, src, shape in (("output_norm.weight", "norm.weight", (H,)), ("output.weight", "head.weight", (V, H)),
                                 ("output_hc_fn.weight", "hc_head_fn", (hc, hc * H)),
                                 ("output_hc_base.weight", "hc_head_base", (hc,)),
                                 ("output_hc_scale.weight", "hc_head_scale", (1,))):
            table.append(TensorSpec(name, shape, (src,), shape))

    def _mtp_head(self, j: int) -> list[str]:
        """MTP block j's own mHC head (`mtp.j.hc_head_*`), which a one-file deepseek4 GGUF has no
        tensor name for: llama.cpp's MTP graph collapses the streams with the main model's."""
        return [f"mtp.{j}.hc_head_{k}" for k in ("fn", "base", "scale")]

    def checkpoint_tensors(self, optional: bool = False) -> dict[str, tuple[int, ...]]:
        out = {s: spec.source_shape for spec in self.tensor_table() for s in spec.sources}
        hc, H = int(self.cfg["hc_mult"]), int(self.cfg["hidden_size"])
        for j in range(self.n_mtp):   # read (compared with the main head), not written
            out.update(zip(self._mtp_head(j), ((hc, hc * H), (hc,), (1,))))
        return out

    def plan(self, ckpt, outtype: gguf.GGMLQuantizationType) -> list[TensorPlan]:
        """`tensor_table` checked against the checkpoint: every source present with the shape
        config.json implies (logical shapes: MXFP4 bytes hold two values), nothing left unused
        but the MTP block and hash layers' unused routing bias."""
        self.ckpt = ckpt
        self._check_mtp(ckpt)
        plans, used = [], set()
        for spec in self.tensor_table():
            for src in spec.sources:
                if src not in ckpt:
                    raise CheckpointError(f"{self.dir}: tensor {src} is missing from the checkpoint")
                if ckpt.shape(src) != spec.source_shape:
                    raise CheckpointError(f"{self.dir}: tensor {src} has shape {ckpt.shape(src)}, "
                                          f"config.json implies {spec.source_shape}")
            used.update(spec.sources)
            plans.append(self._tensor_plan(spec, outtype))
        # hash-routed layers choose experts by tid2eid; DeepSeek ships a routing bias there too, unused
        spare = {f"layers.{i}.ffn.gate.bias" for i in range(self.n_hash)}
        spare.update(n for j in range(self.n_mtp) for n in self._mtp_head(j))
        left = [n for n in ckpt.names() if n not in used and n not in spare
                and not (n.startswith("mtp.") and not self._keep_mtp)]
        if left:
            raise CheckpointError(f"{self.dir}: {len(left)} checkpoint tensors are not understood by the "
                                  f"{self.hf_arch} converter, e.g. {left[:4]}")
        if self.not_exact:
            log.warning("%d tensors lose precision in %s (the checkpoint's values do not fit it): %s",
                        len(self.not_exact), outtype.name.lower(),
                        ", ".join(f"{k} ({v})" for k, v in list(self.not_exact.items())[:6]))
        return plans

    def _check_mtp(self, ckpt) -> None:
        """DeepSeek's `mtp.N.*` tensors against num_nextn_predict_layers, when kept (as deepseek.py's
        _check_mtp): blocks the config does not announce or an incomplete block are one error naming
        them; a checkpoint without any converts without, with a warning. MTP block j's own mHC head
        has no place in a one-file deepseek4 GGUF: a warning when it differs from the main model's."""
        if not self._keep_mtp:
            return
        names = [n for n in ckpt.names() if n.startswith("mtp.")]
        blocks = sorted({int(b) for n in names if (b := n.split(".")[1]).isdecimal()})
        beyond = [j for j in blocks if j >= self.n_mtp]
        if beyond or len(blocks) != len({n.split(".")[1] for n in names}):
            example = next((n for n in names if not n.split(".")[1].isdecimal() or int(n.split(".")[1]) >= self.n_mtp))
            raise CheckpointError(f"{self.dir}: the checkpoint has MTP tensors (e.g. {example}) beyond config.json's "
                                  f"num_nextn_predict_layers {self.n_mtp}; fix the config, or convert with --no-mtp "
                                  f"to leave them out")
        if not self.n_mtp:
            return
        if not names:
            log.warning("config.json has num_nextn_predict_layers %d but the checkpoint holds no MTP block (mtp.*): "
                        "converting without it", self.n_mtp)
            self.n_mtp = 0
            return
        wanted = [s for spec in self.tensor_table() for s in spec.sources if s.startswith("mtp.")]
        wanted += [n for j in range(self.n_mtp) for n in self._mtp_head(j)]
        missing = [s for s in wanted if s not in ckpt]
        if missing:
            raise CheckpointError(f"{self.dir}: the MTP block (num_nextn_predict_layers {self.n_mtp}) is incomplete: "
                                  f"{len(missing)} tensor(s) missing, e.g. {', '.join(missing[:3])}; convert with "
                                  f"--no-mtp to leave it out")
        for j in range(self.n_mtp):
            for own, main in zip(self._mtp_head(j), ("hc_head_fn", "hc_head_base", "hc_head_scale")):
                if ckpt.shape(own) != ckpt.shape(main):
                    raise CheckpointError(f"{self.dir}: tensor {own} has shape {ckpt.shape(own)}, "
                                          f"{main} {ckpt.shape(main)}")
            differ = [own for own, main in zip(self._mtp_head(j), ("hc_head_fn", "hc_head_base", "hc_head_scale"))
                      if not np.array_equal(ckpt.f32(own), ckpt.f32(main))]
            if differ:
                log.warning("%s: not written (a one-file deepseek4 GGUF has no tensor name for the MTP block's own "
                            "mHC head; llama.cpp's MTP graph uses the main model's output_hc_*)", ", ".join(differ))

    def _stored(self, src: str) -> str:
        dtype = getattr(self.ckpt, "dtype", None)
        return dtype(src) if dtype else self.ckpt.refs[src].dtype

    def _tensor_plan(self, spec: TensorSpec, outtype: gguf.GGMLQuantizationType) -> TensorPlan:
        stored = self._stored(spec.sources[0])
        if spec.op == "i32":
            if stored not in ("I32", "I64"):
                raise CheckpointError(f"{self.dir}: {spec.sources[0]} is {stored}; the hash table holds expert ids (I32/I64)")
            return TensorPlan(spec.name, spec.shape, Q.I32, lambda: self._tid2eid(spec), list(spec.sources))
        qtype = self._qtype(spec, stored, outtype)
        if qtype == Q.MXFP4:
            return TensorPlan(spec.name, spec.shape, qtype, lambda: self._mxfp4(spec), list(spec.sources))
        if spec.op == "stack":
            produce = lambda: stack_f32(self.ckpt, spec.sources)  # noqa: E731
        elif spec.op == "concat":   # the MTP block's e_proj | h_proj, along the input
            produce = lambda: np.concatenate([self.ckpt.f32(s) for s in spec.sources], axis=1)  # noqa: E731
        else:
            produce = lambda: self.ckpt.f32(spec.sources[0])  # noqa: E731
        return TensorPlan(spec.name, spec.shape, qtype, produce, list(spec.sources))

    def _qtype(self, spec: TensorSpec, stored: str, outtype: gguf.GGMLQuantizationType):
        """The type that keeps the stored values when outtype allows: MXFP4 stays MXFP4 (unless f32
        is asked for), F32 stays F32, FP8 x 2^k and BF16 are exact in bf16 and f32."""
        if outtype == Q.F32 or stored in ("F32", "F64"):
            return Q.F32
        if stored == "mxfp4":
            return Q.MXFP4
        qtype = choose_qtype(spec.name, spec.shape, outtype)
        exact = {Q.F32, Q.BF16} if stored in ("BF16", "fp8_pow2") else {Q.F32}
        if qtype not in exact:
            self.not_exact[spec.name] = f"{stored.lower()} -> {qtype.name.lower()}"
        return qtype

    @staticmethod
    def release_storage(spec: TensorSpec) -> str:
        """How DeepSeek's V4 release stores a tensor's source (the dtype() names of fp8.py): routed
        experts MXFP4, the hash table I32, mHC / sinks / position biases / routing bias F32, the
        compressors, indexer weights, embeddings, norms and router BF16, the other projections FP8
        with power-of-two scales. For synth, which imitates the release without a checkpoint."""
        src = spec.sources[0]
        if spec.op == "stack":
            return "mxfp4"
        if spec.op == "i32":
            return "I32"
        if src.startswith(("hc_head", )) or ".hc_" in src or src.endswith((".attn_sink", ".ape", "gate.bias")):
            return "F32"
        if ".compressor." in src or "weights_proj" in src or src.endswith(("norm.weight", "gate.weight")) \
                or src in ("embed.weight", "head.weight"):
            return "BF16"
        return "fp8_pow2"

    def published_type(self, spec: TensorSpec) -> gguf.GGMLQuantizationType:
        """The GGUF type `convert` (default bf16) writes for this tensor of DeepSeek's release."""
        stored = self.release_storage(spec)
        return Q.I32 if stored == "I32" else self._qtype(spec, stored, Q.BF16)

    def _tid2eid(self, spec: TensorSpec) -> EncodedBlocks:
        ids = np.asarray(self.ckpt.raw(spec.sources[0]))
        n_expert = int(self.cfg["n_routed_experts"])
        if ids.size and (ids.min() < 0 or ids.max() >= n_expert):
            raise CheckpointError(f"{self.dir}: {spec.sources[0]} holds expert ids outside 0..{n_expert - 1}")
        return EncodedBlocks(np.ascontiguousarray(ids, dtype=np.int32))

    def _mxfp4(self, spec: TensorSpec) -> EncodedBlocks:
        blocks = [self.ckpt.mxfp4_blocks(s) for s in spec.sources]
        out = np.stack(blocks) if spec.op == "stack" else blocks[0]
        for s in spec.sources:
            self.ckpt.drop_pages(s)
        return EncodedBlocks(out)


@hookimpl
def deepseek_cpu_supported_architectures() -> list[str]:
    return list(ARCHITECTURES)


@hookimpl
def deepseek_cpu_converter(config: dict, model_dir: Path):
    archs = config.get("architectures") or []
    if any(a in ARCHITECTURES for a in archs) or (not archs and config.get("model_type") == "deepseek_v4"):
        return DeepseekV4Converter(config, model_dir)
    return None
