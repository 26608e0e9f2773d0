// deepseek-cpu: MLA attention graphs for DeepSeek's latent KV cache (llm_graph_context members
// declared in llama-graph.h; deepseek2.cpp calls build_attn_mla, build_attn_mha calls
// dsc_build_attn_mqa): prefill through K/V decompressed from the cache into f32 flash attention,
// decode in the absorbed form, its one-token attention read in one pass over the cache.

#include "llama-graph.h"
#include "llama-impl.h"
#include "llama-model.h"
#include "llama-cparams.h"
#include "llama-kv-cache.h"

#include <cstdint>
#include <cstdlib>

// deepseek-cpu: flash attention reads an f16 mask; one cast per graph serves every layer (build_attn_mla's
// prefill, dsc_build_attn_mqa), whichever attention asks first
ggml_tensor * llm_graph_context::dsc_kq_mask_as_f16(ggml_tensor * kq_mask) const {
    if (dsc_kq_mask_f16_src != kq_mask) {
        dsc_kq_mask_f16     = kq_mask->type == GGML_TYPE_F16 ? kq_mask : ggml_cast(ctx0, kq_mask, GGML_TYPE_F16);
        dsc_kq_mask_f16_src = kq_mask;
        cb(dsc_kq_mask_f16, "kq_mask_f16", -1);
    }
    return dsc_kq_mask_f16;
}

// deepseek-cpu: build_attn_mha's hook, called after its permutes (q [d, n_tokens, n_head, n_stream],
// k and v [d, n_kv, n_head_kv, n_stream]). One query token over one shared K/V head in one stream
// (MLA's absorbed decode) attends through flash attention with flash_attn off too: ggml-cpu's
// one-query kernel for shared heads (dsc/mla-attention.cpp) reads the cache once for all heads, skips
// the masked padding of the cache and keeps q in f32, where KQ, softmax, a transposed copy of V and
// KQV run over all of it. With flash_attn on the same kernel runs, and an f32 cache is not cast to f16
// for it. Where that kernel does not apply (or DEEPSEEK_CPU_MQA_FA=0) and flash_attn is off, KQ and KQV
// are 2D products with the heads as columns: the cache read once for all heads, not once per head.
// Returns nullptr where the stock code runs: other shapes, a KQ bias, Grok's scaling or a soft cap,
// and flash_attn on outside the kernel's cases.
// the most query tokens the one-token kernel runs once per token for: a speculative verify's batch
// (the next token and up to 3 MTP drafts, runtime/mtp.py)
static constexpr int64_t DSC_MQA_FEW_TOKENS = 4;
// DeepSeek-V4 batches of at least this many tokens attend through ggml-cpu's tiled flash-attention kernel
// (dsc/flash-attn-f32.cpp): not fewer than that kernel's GGML_DSC_FA_MIN_Q (dsc/dsc-tuning.h)
static constexpr int64_t DSC_FA_TILED_MIN_TOKENS = 16;

// DeepSeek-V4's prompts: one shared K/V head of 512 (the same tensor as K and V; f16, or f32 where the
// cache is asked for in f32), attention sinks,
// a sliding window over a cache that holds every token (and, in its compressed layers, the compressed
// entries the indexer chose). With flash_attn off, stock code multiplies every query with every cached key,
// runs a softmax over all of them and copies V transposed: 24% of a 932-token prompt on Zen 4, most of it
// on keys the mask hides. Flash attention's tiled kernel (dsc/flash-attn-f32.cpp) skips key tiles the mask
// hides and reads the cache in place, in f32 (q, scores and sums: stock casts q to f16 for KQ). With
// flash_attn on, stock code builds the same node. nullptr where this does not apply.
ggml_tensor * llm_graph_context::dsc_build_attn_v4_prompt(
        ggml_tensor * q,
        ggml_tensor * k,
        ggml_tensor * v,
        ggml_tensor * kq_b,
        ggml_tensor * kq_mask,
        ggml_tensor * sinks,
        ggml_tensor * v_mla,
            int64_t   n_kv_max,
               bool   v_trans,
              float   kq_scale,
                int   il) const {
    static const bool on = [] {
        const char * e = getenv("DEEPSEEK_CPU_V4_PROMPT_FA");
        return !(e && *e && atoi(e) == 0);
    }();
    if (!on || arch != LLM_ARCH_DEEPSEEK4 || cparams.flash_attn || q->ne[1] < DSC_FA_TILED_MIN_TOKENS ||
        kq_b != nullptr || v_mla != nullptr || v_trans || kq_mask == nullptr ||
        (k->type != GGML_TYPE_F16 && k->type != GGML_TYPE_F32) || v->type != k->type || q->ne[3] != 1 || k->ne[3] != 1 ||
        hparams.f_max_alibi_bias != 0.0f || hparams.attn_soft_cap || (sinks && sinks->type != GGML_TYPE_F32)) {
        return nullptr;
    }
    GGML_ASSERT(n_kv_max >= 0 && n_kv_max <= INT32_MAX);
    ggml_tensor * cur = ggml_flash_attn_ext(ctx0, q, k, v, dsc_kq_mask_as_f16(kq_mask), kq_scale, 0.0f, 0.0f);
    res->add_fused_node({LLM_FUSED_OP_FLASH_ATTN, cur, il});
    ggml_flash_attn_ext_add_sinks(cur, sinks);
    ggml_flash_attn_ext_set_n_kv_max(cur, static_cast<int32_t>(n_kv_max));
    ggml_prec_set_acc(cur, GGML_PREC_F32);
    cur = ggml_reshape_2d(ctx0, cur, cur->ne[0]*cur->ne[1], cur->ne[2]*cur->ne[3]);
    ggml_build_forward_expand(gf, cur);
    return cur;
}

ggml_tensor * llm_graph_context::dsc_build_attn_mqa(
        ggml_tensor * q,
        ggml_tensor * k,
        ggml_tensor * v,
        ggml_tensor * kq_b,
        ggml_tensor * kq_mask,
        ggml_tensor * sinks,
        ggml_tensor * v_mla,
            int64_t   n_kv_max,
               bool   v_trans,
              float   kq_scale,
                int   il) const {
    // a few tokens (a speculative verify's batch: the next token and 1-3 drafts) run the one-token
    // kernel once per token (below): it reads the cache once per token, where KQ, softmax and KQV over
    // the f16 cache cost ~3x one kernel pass per token (V3 shapes, Zen 3)
    const int64_t n_q = q->ne[1];
    if (ggml_tensor * cur = dsc_build_attn_v4_prompt(q, k, v, kq_b, kq_mask, sinks, v_mla, n_kv_max, v_trans, kq_scale, il)) {
        return cur;
    }
    const bool mqa = n_q >= 1 && n_q <= DSC_MQA_FEW_TOKENS && q->ne[3] == 1 && k->ne[2] == 1 && k->ne[3] == 1 &&
                     v->ne[2] == 1 && v->ne[3] == 1;
    if (!mqa || kq_b != nullptr || arch == LLM_ARCH_GROK || hparams.attn_soft_cap) {
        return nullptr;
    }

    static const bool kernel_on = [] {
        const char * e = getenv("DEEPSEEK_CPU_MQA_FA");
        return !(e && *e && atoi(e) == 0);
    }();
    const bool kernel = kernel_on && (sinks == nullptr || sinks->type == GGML_TYPE_F32) && !v_trans &&
                        hparams.f_max_alibi_bias == 0.0f &&
                        q->ne[2] >= 2 && (k->type == GGML_TYPE_F16 || k->type == GGML_TYPE_F32) &&
                        v->type == k->type && k->ne[0] % 8 == 0 && v->ne[0] % 16 == 0;

    // the per-token pass is for the CPU backend's kernel: a cache held elsewhere (an RPC worker, whose
    // checks refuse the graph of per-token views) keeps the stock path for a few tokens
    const ggml_tensor * cache = k->view_src ? k->view_src : k;
    const bool host_cache = cache->buffer != nullptr && ggml_backend_buffer_is_host(cache->buffer);
    if (n_q > 1 && (!kernel || !host_cache)) {
        return nullptr;
    }

    ggml_tensor * cur = nullptr;
    if (kernel) {
        if (!cparams.flash_attn) {
            kq_mask = dsc_kq_mask_as_f16(kq_mask);
        }
        GGML_ASSERT(n_kv_max >= 0 && n_kv_max <= INT32_MAX);
        // token t: its query and its mask row, through the same kernel as a one-token decode, so each
        // token's attention is the one decoding it alone gives; outputs [DV, n_head, 1] joined on dim 2
        for (int64_t t = 0; t < n_q; t++) {
            ggml_tensor * qt = n_q == 1 ? q : ggml_view_4d(ctx0, q, q->ne[0], 1, q->ne[2], q->ne[3], q->nb[1], q->nb[2], q->nb[3], t*q->nb[1]);
            ggml_tensor * mt = n_q == 1 || kq_mask == nullptr ? kq_mask :
                               ggml_view_2d(ctx0, kq_mask, kq_mask->ne[0], 1, kq_mask->nb[1], t*kq_mask->nb[1]);
            ggml_tensor * ot = ggml_flash_attn_ext(ctx0, qt, k, v, mt, kq_scale, hparams.f_max_alibi_bias, 0.0f);
            res->add_fused_node({LLM_FUSED_OP_FLASH_ATTN, ot, il});
            ggml_flash_attn_ext_add_sinks(ot, sinks);
            ggml_flash_attn_ext_set_n_kv_max(ot, static_cast<int32_t>(n_kv_max));
            ggml_prec_set_acc(ot, GGML_PREC_F32);
            cur = cur ? ggml_concat(ctx0, cur, ot, 2) : ot;
        }

        if (v_mla) {
            // as build_attn_mha: a matrix-matrix product with n_tokens in dimension 1
            cur = ggml_permute(ctx0, cur, 0, 2, 1, 3);
            cur = ggml_mul_mat(ctx0, v_mla, cur);
            cb(cur, "fattn_mla", il);
            cur = ggml_permute(ctx0, cur, 0, 2, 1, 3);
            cur = ggml_cont(ctx0, cur);
        }

        cur = ggml_reshape_2d(ctx0, cur, cur->ne[0]*cur->ne[1], cur->ne[2]*cur->ne[3]);
    } else {
        if (cparams.flash_attn) {
            return nullptr;
        }
        ggml_tensor * q2 = ggml_view_2d(ctx0, q, q->ne[0], q->ne[2], q->nb[2], 0);
        ggml_tensor * k2 = ggml_view_2d(ctx0, k, k->ne[0], k->ne[1], k->nb[1], 0);
        ggml_tensor * kq = ggml_mul_mat(ctx0, k2, q2);                   // [n_kv, n_head]
        ggml_prec_set_acc(kq, GGML_PREC_F32);
        kq = ggml_reshape_3d(ctx0, kq, kq->ne[0], 1, kq->ne[1]);          // [n_kv, 1 token, n_head]
        cb(kq, "kq", il);

        kq = ggml_soft_max_ext(ctx0, kq, kq_mask, kq_scale, hparams.f_max_alibi_bias);
        ggml_soft_max_add_sinks(kq, sinks);
        cb(kq, "kq_soft_max", il);

        if (!v_trans) {
            v = ggml_cont(ctx0, ggml_transpose(ctx0, v));
            cb(v, "v_cont", il);
        }

        ggml_tensor * v2 = ggml_view_2d(ctx0, v, v->ne[0], v->ne[1], v->nb[1], 0);
        ggml_tensor * kqv = ggml_mul_mat(ctx0, v2, ggml_reshape_2d(ctx0, kq, kq->ne[0], kq->ne[2])); // [n_embd_v, n_head]
        kqv = ggml_reshape_3d(ctx0, kqv, kqv->ne[0], 1, kqv->ne[1]);                                // [n_embd_v, 1, n_head]
        cb(kqv, "kqv", il);

        // MLA's absorbed form: decompress from MQA back to MHA
        if (v_mla) {
            kqv = ggml_mul_mat(ctx0, v_mla, kqv);
            cb(kqv, "kqv_mla", il);
        }

        cur = ggml_permute(ctx0, kqv, 0, 2, 1, 3);
        cur = ggml_cont_2d(ctx0, cur, cur->ne[0]*cur->ne[1], cur->ne[2]*cur->ne[3]);

        if (!cparams.offload_kqv) {
            // all nodes between the KV store and the attention output are run on the CPU
            ggml_backend_sched_set_tensor_backend(sched, cur, backend_cpu);
        }
    }

    ggml_build_forward_expand(gf, cur);

    return cur;
}

// deepseek-cpu: MLA attention on the latent (K-only) cache. Stores k_cur like build_attn, then attends
// either in the absorbed form (q_absorbed against the latent cache, one shared K/V head, v_mla applied
// after) or, when that costs fewer multiply-adds (large batches: prefill), through K and V decompressed
// from the cache with wk_b / wv_b as ordinary multi-head attention.
//   q_absorbed [kv_lora_rank + n_rot, n_head, n_tokens]   k_cur [kv_lora_rank + n_rot, 1, n_tokens]
//   q_nope     [n_embd_head_qk_nope, n_head, n_tokens]     v_cur [kv_lora_rank, 1, n_tokens]
//   q_pe       [n_rot, n_head, n_tokens], rope applied     wk_b  [n_embd_head_qk_nope, kv_lora_rank, n_head]
//                                                          wv_b  [kv_lora_rank, n_embd_head_v, n_head]
// Multiply-adds per layer, with r = kv_lora_rank, H heads, T tokens,
// n_kv cached tokens: absorbed  T*H*r*(dn + dv) + T*n_kv*H*(2r + n_rot)
//                     MHA       n_kv*H*r*(dn + dv) + T*n_kv*H*(dn + n_rot + dv)
// For a 512-token prefill of DeepSeek-V2-Lite that is 5.6 G vs 2.4 G per layer; for one decoded token
// the absorbed form is far cheaper. DEEPSEEK_CPU_MLA_MHA=0 / =1 forces either form.
ggml_tensor * llm_graph_context::build_attn_mla(
        llm_graph_input_attn_k * inp,
        ggml_tensor * wo,
        ggml_tensor * wo_b,
        ggml_tensor * wo_s,
        ggml_tensor * q_absorbed,
        ggml_tensor * q_nope,
        ggml_tensor * q_pe,
        ggml_tensor * k_cur,
        ggml_tensor * v_cur,
        ggml_tensor * wk_b,
        ggml_tensor * wv_b,
            float     kq_scale,
            int       il) const {
    const auto * mctx_cur = inp->mctx;

    ggml_tensor * k = mctx_cur->get_k(ctx0, il);

    const int64_t r    = wv_b->ne[0];
    const int64_t dn   = wk_b->ne[0];
    const int64_t dv   = wv_b->ne[1];
    const int64_t H    = wk_b->ne[2];
    const int64_t dr   = k->ne[0] - r;
    const int64_t T    = q_absorbed->ne[2];
    const int64_t n_kv = k->ne[2];

    // the decompressed path needs one stream and a cache type ggml_cast can read. It attends with f32 K/V
    // through flash attention itself (below), so it serves flash_attn = on as well: there, the absorbed
    // form would run the 576/512-wide heads through the generic flash-attention kernel on the f16 cache
    const bool can_mha = k->ne[1] == 1 && k->ne[3] == 1 &&
                         (k->type == GGML_TYPE_F16 || k->type == GGML_TYPE_F32 || k->type == GGML_TYPE_BF16) &&
                         wk_b->ne[1] == r && wv_b->ne[2] == H && q_nope->ne[0] == dn && q_pe->ne[0] == dr;
    const double cost_mqa = (double) T*H*r*(dn + dv) + (double) T*n_kv*H*(2*r + dr);
    const double cost_mha = (double) n_kv*H*r*(dn + dv) + (double) T*n_kv*H*(dn + dr + dv);
    // the decompression runs in f32 and adds casts and copies: ask for a clear win
    bool use_mha = can_mha && cost_mha < 0.75*cost_mqa;
    if (const char * env = getenv("DEEPSEEK_CPU_MLA_MHA"); env && *env && can_mha) {
        use_mha = atoi(env) != 0;
    }

    if (!use_mha) {
        return build_attn(inp, wo, wo_b, wo_s, q_absorbed, k_cur, v_cur, nullptr, nullptr, wv_b, kq_scale, il);
    }

    // K, V and q are f32 here, so ggml's tiled CPU flash attention runs f32 GEMM tiles with an online
    // softmax and skips the KV tiles the causal mask hides: about half the work of the full T x n_kv
    // products of a fresh prefill, and no [n_kv, T, H] score tensor. DEEPSEEK_CPU_MLA_FA=0 attends through
    // the separate KQ / softmax / KQV products instead.
    bool use_fa = true;
    if (const char * env = getenv("DEEPSEEK_CPU_MLA_FA"); env && *env) {
        use_fa = atoi(env) != 0;
    }

    ggml_tensor * q_cur = ggml_concat(ctx0, q_nope, q_pe, 0);             // [dn + dr, H, T]
    if (!use_fa) {
        // stored head-major, so that the per-head view build_attn_mha takes is contiguous: an f32 KQ
        // product then goes to tinyBLAS instead of one vec_dot_f32 per element (flash attention reads
        // the rows where they are)
        q_cur = ggml_cont(ctx0, ggml_permute(ctx0, q_cur, 0, 2, 1, 3));   // [dn + dr, T, H]
        q_cur = ggml_permute(ctx0, q_cur, 0, 2, 1, 3);                    // [dn + dr, H, T] view
    }
    cb(q_cur, "q_mha", il);

    // these nodes are added to the graph together so that they are not reordered (as in build_attn)
    ggml_build_forward_expand(gf, q_cur);
    ggml_build_forward_expand(gf, v_cur);
    ggml_build_forward_expand(gf, k_cur);

    // store to KV cache
    {
        const auto & k_idxs = inp->get_k_idxs();

        ggml_build_forward_expand(gf, mctx_cur->cpy_k(ctx0, k_cur, k_idxs, il));
    }

    // latent part [r, n_kv] and rope part [dr, 1, n_kv] of the cached rows, in f32
    ggml_tensor * c = ggml_cast(ctx0, ggml_view_2d(ctx0, k, r, n_kv, k->nb[2], 0), GGML_TYPE_F32);
    cb(c, "mla_latent_f32", il);
    ggml_tensor * k_pe = ggml_cast(ctx0, ggml_view_3d(ctx0, k, dr, 1, n_kv, k->nb[1], k->nb[2], ggml_row_size(k->type, r)), GGML_TYPE_F32);
    cb(k_pe, "mla_k_pe_f32", il);

    // k_nope[h] = wk_b[h] c: wk_b contracts over its dim 0 (dn), so use its per-head transpose
    // [r, dn, H] (dequantized, ~1M values per layer) as one [r, dn*H] matrix
    ggml_tensor * wk_b_t = ggml_cont(ctx0, ggml_transpose(ctx0, ggml_cast(ctx0, wk_b, GGML_TYPE_F32)));
    ggml_tensor * k_nope = ggml_mul_mat(ctx0, ggml_reshape_2d(ctx0, wk_b_t, r, dn*H), c); // [dn*H, n_kv]
    k_nope = ggml_reshape_3d(ctx0, k_nope, dn, H, n_kv);
    cb(k_nope, "mla_k_nope", il);

    ggml_tensor * k_mha = ggml_concat(ctx0, k_nope, ggml_repeat_4d(ctx0, k_pe, dr, H, n_kv, 1), 0); // [dn + dr, H, n_kv]
    cb(k_mha, "k_mha", il);

    ggml_tensor * v_mha = ggml_mul_mat(ctx0, ggml_reshape_2d(ctx0, wv_b, r, dv*H), c); // [dv*H, n_kv]
    v_mha = ggml_reshape_3d(ctx0, v_mha, dv, H, n_kv);
    cb(v_mha, "v_mha", il);

    ggml_tensor * cur = nullptr;
    if (use_fa) {
        ggml_tensor * kq_mask_f16 = dsc_kq_mask_as_f16(inp->get_kq_mask());

        cur = ggml_flash_attn_ext(ctx0,
                ggml_permute(ctx0, q_cur, 0, 2, 1, 3),   // [dn + dr, T,    H]
                ggml_permute(ctx0, k_mha, 0, 2, 1, 3),   // [dn + dr, n_kv, H]
                ggml_permute(ctx0, v_mha, 0, 2, 1, 3),   // [dv,      n_kv, H]
                kq_mask_f16, kq_scale, hparams.f_max_alibi_bias, 0.0f);
        ggml_prec_set_acc(cur, GGML_PREC_F32);
        cur = ggml_reshape_2d(ctx0, cur, dv*H, T);       // [dv, H, T] -> [dv*H, T]
    } else {
        cur = build_attn_mha(q_cur, k_mha, v_mha, nullptr, inp->get_kq_mask(), nullptr, nullptr, 0, kq_scale, il);
    }
    cb(cur, "kqv_out", il);

    if (wo) {
        cur = build_lora_mm(wo, cur, wo_s);
    }

    if (wo_b) {
        cur = ggml_add(ctx0, cur, wo_b);
    }

    return cur;
}
