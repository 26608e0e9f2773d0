// deepseek-cpu: checks the CPU backend's repacked (CPU_REPACK extra buffer) MUL_MAT and MUL_MAT_ID
// against the same ops with the weights in a plain CPU buffer.
//
// test-backend-ops never places weights in an extra buffer type, so the repack kernels are not
// covered there. Every case below runs twice on the CPU backend - weights in CPU_REPACK, weights in
// the default CPU buffer - and the outputs must agree to within float rounding (both sides quantize
// the activations to the same Q8 rows; only the order of the float accumulation differs).

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <random>
#include <string>
#include <vector>

struct mm_case {
    ggml_type type;
    int64_t   k;        // row length
    int64_t   n;        // output rows (src0 ne1)
    int64_t   n_as;     // experts (0 = plain MUL_MAT)
    int64_t   n_used;   // experts per token
    int64_t   n_tok;    // tokens
    bool      bcast;    // MUL_MAT_ID with src1 ne1 == 1 (gate/up), else ne1 == n_used (down)
    int       n_threads;
};

static std::vector<float> run(const mm_case & c, ggml_backend_buffer_type_t wbuft, const std::vector<uint8_t> & wdata,
                              const std::vector<float> & xdata, const std::vector<int32_t> & ids, bool * repacked) {
    ggml_init_params ip = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx_w = ggml_init(ip);
    ggml_context * ctx   = ggml_init(ip);

    ggml_tensor * w = c.n_as ? ggml_new_tensor_3d(ctx_w, c.type, c.k, c.n, c.n_as) : ggml_new_tensor_2d(ctx_w, c.type, c.k, c.n);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(ctx_w, wbuft);
    ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    *repacked = w->extra != nullptr;
    if (wbuft != ggml_backend_cpu_buffer_type() && !*repacked) {
        // no repacked layout for this type/shape on this CPU
        ggml_backend_buffer_free(wbuf);
        ggml_free(ctx);
        ggml_free(ctx_w);
        return {};
    }
    ggml_backend_tensor_set(w, wdata.data(), 0, wdata.size());

    ggml_tensor * x;
    ggml_tensor * out;
    ggml_tensor * id = nullptr;
    if (c.n_as) {
        x   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.k, c.bcast ? 1 : c.n_used, c.n_tok);
        id  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, c.n_used, c.n_tok);
        out = ggml_mul_mat_id(ctx, w, x, id);
    } else {
        x   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.k, c.n_tok);
        out = ggml_mul_mat(ctx, w, x);
    }
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);

    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, c.n_threads);
    ggml_backend_buffer_t abuf = ggml_backend_alloc_ctx_tensors(ctx, be);
    ggml_backend_tensor_set(x, xdata.data(), 0, xdata.size() * sizeof(float));
    if (id) {
        ggml_backend_tensor_set(id, ids.data(), 0, ids.size() * sizeof(int32_t));
    }
    GGML_ASSERT(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS);

    std::vector<float> res(ggml_nelements(out));
    ggml_backend_tensor_get(out, res.data(), 0, res.size() * sizeof(float));

    ggml_backend_buffer_free(abuf);
    ggml_backend_buffer_free(wbuf);
    ggml_backend_free(be);
    ggml_free(ctx);
    ggml_free(ctx_w);
    return res;
}

// deepseek-cpu: n_rows random rows of k values quantized to t (wq), and what they dequantize to (wd)
static void random_weights(std::mt19937 & rng, std::normal_distribution<float> & nd, ggml_type t, int64_t k, int64_t n_rows,
                           std::vector<uint8_t> & wq, std::vector<float> & wd) {
    std::vector<float> wf(k * n_rows);
    for (auto & v : wf) { v = nd(rng); }
    wq.resize(ggml_row_size(t, k) * n_rows);
    ggml_quantize_chunk(t, wf.data(), wq.data(), 0, n_rows, k, nullptr);
    wd.resize(k * n_rows);
    ggml_get_type_traits(t)->to_float(wq.data(), wd.data(), k * n_rows);
}

// activations that q8_0 (blk = 32) or q8_K (blk = 256) represents exactly (an fp16 scale times integers,
// one of them +-127 per block), so the backend's quantizer and a reference see the same values
static std::vector<float> q8_0_exact_activations(std::mt19937 & rng, int64_t n, int64_t blk = 32) {
    std::vector<float> xf(n);
    for (int64_t b0 = 0; b0 < n; b0 += blk) {
        const float d = ggml_fp16_to_fp32(ggml_fp32_to_fp16(0.01f + 0.04f * (float) (rng() % 1000) / 1000.0f));
        for (int j = 0; j < blk; ++j) {
            xf[b0 + j] = d * (float) ((int) (rng() % 255) - 127);
        }
        xf[b0 + rng() % blk] = d * ((rng() & 1) ? 127.0f : -127.0f);
    }
    return xf;
}

// deepseek-cpu: MUL_MAT_ID with the weights in the plain CPU buffer (the layout of types without a
// repacked form, e.g. the q5_0/q8_0 expert down-projections of a Q4_K_M DeepSeek-V2) against a
// double-precision reference: dequantized weights times the q8_0-rounded activations. Experts that see
// several tokens go through the gathered tinyBLAS path, single-token experts through vec_dot.
static int check_mmid_plain(std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int n_fail = 0, n_run = 0;
    for (ggml_type t : { GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, GGML_TYPE_Q4_0, GGML_TYPE_IQ4_NL }) {
        for (int64_t k : { 256, 1408 }) {
            for (int64_t n : { 64, 130 }) {
                for (int nt : { 1, 2, 3 }) {
                    for (int64_t tok : { 1, 2, 5, 33, 200 }) {
                        for (bool bc : { true, false }) {
                            const mm_case c = { t, k, n, 8, tok > 100 ? 2 : 3, tok, bc, nt };
                            std::vector<uint8_t> wq;
                            std::vector<float>   wd;
                            random_weights(rng, nd, c.type, c.k, c.n * c.n_as, wq, wd);

                            const int64_t n_xr = c.n_tok * (c.bcast ? 1 : c.n_used);
                            const std::vector<float> xf = q8_0_exact_activations(rng, c.k * n_xr);
                            const std::vector<float> & xd = xf;

                            // with 200 tokens over 8 experts, two take most tokens (> 64, several chunks)
                            std::vector<int32_t> ids;
                            for (int64_t i = 0; i < c.n_tok; ++i) {
                                std::vector<int32_t> perm(c.n_as);
                                for (int64_t e = 0; e < c.n_as; ++e) { perm[e] = (int32_t) e; }
                                for (int64_t e = 0; e < c.n_used; ++e) {
                                    const int64_t lim = (rng() % 4 == 0) ? c.n_as - e : std::min<int64_t>(2, c.n_as - e);
                                    std::swap(perm[e], perm[e + rng() % lim]);
                                    ids.push_back(perm[e]);
                                }
                            }

                            bool rp = false;
                            const std::vector<float> out = run(c, ggml_backend_cpu_buffer_type(), wq, xf, ids, &rp);
                            n_run++;
                            double max_err = 0.0, max_ref = 0.0;
                            for (int64_t i = 0; i < c.n_tok; ++i) {
                                for (int64_t s = 0; s < c.n_used; ++s) {
                                    const int32_t e = ids[i * c.n_used + s];
                                    const float * x = xd.data() + c.k * (i * (c.bcast ? 1 : c.n_used) + (c.bcast ? 0 : s));
                                    for (int64_t r = 0; r < c.n; ++r) {
                                        const float * w = wd.data() + c.k * (e * c.n + r);
                                        double ref = 0.0;
                                        for (int64_t j = 0; j < c.k; ++j) { ref += (double) w[j] * x[j]; }
                                        const double got = out[(i * c.n_used + s) * c.n + r];
                                        max_err = std::max(max_err, std::fabs(got - ref));
                                        max_ref = std::max(max_ref, std::fabs(ref));
                                    }
                                }
                            }
                            const double rel = max_err / std::max(max_ref, 1e-6);
                            const bool ok = std::isfinite(rel) && rel < 1e-4;
                            n_fail += !ok;
                            if (!ok || getenv("VERBOSE")) {
                                printf("%s plain mul_mat_id %s k=%lld n=%lld tok=%lld %s thr=%d: rel err %.3g\n", ok ? "ok  " : "FAIL",
                                       ggml_type_name(t), (long long) k, (long long) n, (long long) tok, bc ? "bcast" : "per-slot", nt, rel);
                            }
                        }
                    }
                }
            }
        }
    }
    printf("test-repack-ops: plain-buffer MUL_MAT_ID %d/%d cases agree with the reference\n", n_run - n_fail, n_run);
    return n_fail;
}

// deepseek-cpu: two MUL_MAT_IDs of plain q5_0/q8_0 experts in one graph, every token on the same expert:
// each op's chunks see the same expert rows and token ranges, and a thread keeps the tokens it gathered
// from one chunk to the next, so a note left over from the first op would feed it the first op's
// activations in the second.
static int check_mmid_plain_two_ops(std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int n_fail = 0, n_run = 0;
    for (ggml_type t : { GGML_TYPE_Q8_0, GGML_TYPE_Q5_0 }) {
        for (int nt : { 1, 2 }) {
            const int64_t k = 256, n = 130, n_as = 4, tok = 40;
            std::vector<uint8_t> wq;
            std::vector<float>   wd;
            random_weights(rng, nd, t, k, n * n_as, wq, wd);
            const std::vector<float> x1 = q8_0_exact_activations(rng, k * tok);
            const std::vector<float> x2 = q8_0_exact_activations(rng, k * tok);
            const std::vector<int32_t> ids(tok, 2);

            ggml_init_params ip = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true };
            ggml_context * ctx = ggml_init(ip);
            ggml_tensor * w  = ggml_new_tensor_3d(ctx, t, k, n, n_as);
            ggml_tensor * a  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, 1, tok);
            ggml_tensor * b  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, 1, tok);
            ggml_tensor * id = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, tok);
            ggml_tensor * ya = ggml_mul_mat_id(ctx, w, a, id);
            ggml_tensor * yb = ggml_mul_mat_id(ctx, w, b, id);
            ggml_cgraph * gf = ggml_new_graph(ctx);
            ggml_build_forward_expand(gf, ya);
            ggml_build_forward_expand(gf, yb);
            ggml_backend_t be = ggml_backend_cpu_init();
            ggml_backend_cpu_set_n_threads(be, nt);
            ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
            ggml_backend_tensor_set(w, wq.data(), 0, wq.size());
            ggml_backend_tensor_set(a, x1.data(), 0, x1.size() * sizeof(float));
            ggml_backend_tensor_set(b, x2.data(), 0, x2.size() * sizeof(float));
            ggml_backend_tensor_set(id, ids.data(), 0, ids.size() * sizeof(int32_t));
            GGML_ASSERT(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS);
            for (int o = 0; o < 2; o++) {
                std::vector<float> out(ggml_nelements(ya));
                ggml_backend_tensor_get(o ? yb : ya, out.data(), 0, out.size() * sizeof(float));
                const std::vector<float> & x = o ? x2 : x1;
                double max_err = 0.0, max_ref = 0.0;
                for (int64_t i = 0; i < tok; ++i) {
                    for (int64_t r = 0; r < n; ++r) {
                        const float * wr = wd.data() + k * (2 * n + r);
                        double ref = 0.0;
                        for (int64_t j = 0; j < k; ++j) { ref += (double) wr[j] * x[k * i + j]; }
                        max_err = std::max(max_err, std::fabs(out[i * n + r] - ref));
                        max_ref = std::max(max_ref, std::fabs(ref));
                    }
                }
                const double rel = max_err / std::max(max_ref, 1e-6);
                const bool ok = std::isfinite(rel) && rel < 1e-4;
                n_run++;
                n_fail += !ok;
                if (!ok || getenv("VERBOSE")) {
                    printf("%s two mul_mat_id %s op %d thr=%d: rel err %.3g\n", ok ? "ok  " : "FAIL", ggml_type_name(t), o, nt, rel);
                }
            }
            ggml_backend_buffer_free(buf);
            ggml_backend_free(be);
            ggml_free(ctx);
        }
    }
    printf("test-repack-ops: plain-buffer MUL_MAT_ID, two in one graph: %d/%d agree with the reference\n", n_run - n_fail, n_run);
    return n_fail;
}

// deepseek-cpu: plain MUL_MAT of q4_0 or q4_K weights left in the default CPU buffer (DeepSeek's 3D
// attn_v_b, or any weight with the extra buffers off) against the same double-precision reference. From
// 16 rows the x86 build repacks them on the fly for the repacked GEMM (n a multiple of 8); n = 130 keeps
// tinyBLAS (q4_0) or the tiled kernel (q4_K). q5_0 and q8_0 weights (a Q4_K_M model's dense ffn_down)
// go from 16 rows through the broadcast expert GEMM, any n; at k = 4096 a thread's rows take several
// re-laid-out chunks.
static int check_mm_plain(std::mt19937 & rng, ggml_type t) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int n_fail = 0, n_run = 0;
    const bool k_quant = t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q6_K;
    const int64_t k2 = k_quant ? 1536 : t == GGML_TYPE_Q4_0 ? 1408 : 4096;
    for (int64_t k : { (int64_t) 512, k2 }) {
        for (int64_t n : { 64, 136, 130 }) {
            for (int nt : { 1, 2, 3 }) {
                for (int64_t tok : { 3, 15, 16, 17, 30, 33, 64, 200 }) {
                    const mm_case c = { t, k, n, 0, 0, tok, false, nt };
                    std::vector<uint8_t> wq;
                    std::vector<float>   wd;
                    random_weights(rng, nd, c.type, c.k, c.n, wq, wd);
                    const std::vector<float> xf = q8_0_exact_activations(rng, c.k * c.n_tok, k_quant ? 256 : 32);
                    bool rp = false;
                    const std::vector<float> out = run(c, ggml_backend_cpu_buffer_type(), wq, xf, {}, &rp);
                    n_run++;
                    double max_err = 0.0, max_ref = 0.0;
                    for (int64_t i = 0; i < c.n_tok; ++i) {
                        for (int64_t r = 0; r < c.n; ++r) {
                            double ref = 0.0;
                            for (int64_t j = 0; j < c.k; ++j) { ref += (double) wd[r * c.k + j] * xf[i * c.k + j]; }
                            max_err = std::max(max_err, std::fabs(out[i * c.n + r] - ref));
                            max_ref = std::max(max_ref, std::fabs(ref));
                        }
                    }
                    const double rel = max_err / std::max(max_ref, 1e-6);
                    const bool ok = std::isfinite(rel) && rel < 1e-5;
                    n_fail += !ok;
                    if (!ok || getenv("VERBOSE")) {
                        printf("%s plain mul_mat %s k=%lld n=%lld tok=%lld thr=%d: rel err %.3g\n", ok ? "ok  " : "FAIL",
                               ggml_type_name(t), (long long) k, (long long) n, (long long) tok, nt, rel);
                    }
                }
            }
        }
    }
    printf("test-repack-ops: plain-buffer %s MUL_MAT %d/%d cases agree with the reference\n", ggml_type_name(t), n_run - n_fail, n_run);
    return n_fail;
}

// deepseek-cpu: one token times q4_0, q5_0 or q8_0 weights (decode: a Q4_K_M DeepSeek-V2-Lite's expert
// down-projections, attn_k_b's 16 planes, the dense layer-0 ffn_down; a Q4_0 file's attn_k_b and attn_v_b),
// q6_K (the output head), q3_K / q2_K (ds-q3 and ds-q2 experts in the plain buffer) or MXFP4 (V4's experts
// there, under a memory budget)
// goes through the x86 multi-row GEMV, which must give bit for bit what reference mode (use_ref: one
// ggml_vec_dot_<type>_q8_0 or _q8_K per row) gives. Shapes: plain 2D, per-plane 3D (one src1 row per plane),
// MUL_MAT_ID with one token (broadcast and per-slot src1); k up to past the GEMV's 512-block limit, where
// it declines and vec_dot runs.
static int check_gemv_bit_identical(std::mt19937 & rng, ggml_type t) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int n_fail = 0, n_run = 0;
    const bool k_quant = ggml_blck_size(t) == 256;  // QK_K
    // MXFP4 also at 3 blocks: its reference takes blocks in pairs and an odd last one in scalar code
    const std::vector<int64_t> ks = k_quant ? std::vector<int64_t>{ 256, 1536, 2048, 4096, 256 * 65 }
                                  : t == GGML_TYPE_MXFP4 ? std::vector<int64_t>{ 32, 96, 128, 1408, 4096, 32 * 513 }
                                                         : std::vector<int64_t>{ 32, 128, 1408, 4096, 32 * 513 };
    for (int64_t k : ks) {
        for (int64_t n : { 1, 7, 64, 130 }) {
            for (int kind = 0; kind < 4; ++kind) {  // 0: 2D, 1: 16 planes, 2: MMID bcast, 3: MMID per-slot
                if (k > 4096 && n > 7) {
                    continue;
                }
                const int64_t planes = kind == 1 ? 16 : kind >= 2 ? 8 : 1;
                std::vector<uint8_t> wq;
                std::vector<float>   wd;
                random_weights(rng, nd, t, k, n * planes, wq, wd);
                const int64_t n_xr = kind == 1 ? 16 : kind == 3 ? 3 : 1;
                std::vector<float> xf(k * n_xr);
                for (auto & v : xf) { v = nd(rng); }
                std::vector<int32_t> ids = { 5, 0, 7 };
                for (int nt : { 1, 2 }) {
                    std::vector<float> res[2];
                    for (int ref = 0; ref < 2; ++ref) {
                        ggml_init_params ip = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true };
                        ggml_context * ctx = ggml_init(ip);
                        ggml_tensor * w = planes > 1 ? ggml_new_tensor_3d(ctx, t, k, n, planes)
                                                     : ggml_new_tensor_2d(ctx, t, k, n);
                        ggml_tensor * x = kind == 1 ? ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, 1, 16)
                                                    : ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, n_xr, 1);
                        ggml_tensor * id = kind >= 2 ? ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 3, 1) : nullptr;
                        ggml_tensor * out = kind >= 2 ? ggml_mul_mat_id(ctx, w, x, id) : ggml_mul_mat(ctx, w, x);
                        ggml_cgraph * gf = ggml_new_graph(ctx);
                        ggml_build_forward_expand(gf, out);
                        ggml_backend_t be = ggml_backend_cpu_init();
                        ggml_backend_cpu_set_n_threads(be, nt);
                        ggml_backend_cpu_set_use_ref(be, ref == 1);
                        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
                        ggml_backend_tensor_set(w, wq.data(), 0, wq.size());
                        ggml_backend_tensor_set(x, xf.data(), 0, xf.size() * sizeof(float));
                        if (id) {
                            ggml_backend_tensor_set(id, ids.data(), 0, ids.size() * sizeof(int32_t));
                        }
                        GGML_ASSERT(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS);
                        res[ref].resize(ggml_nelements(out));
                        ggml_backend_tensor_get(out, res[ref].data(), 0, res[ref].size() * sizeof(float));
                        ggml_backend_buffer_free(buf);
                        ggml_backend_free(be);
                        ggml_free(ctx);
                    }
                    const bool ok = res[0].size() == res[1].size() &&
                                    memcmp(res[0].data(), res[1].data(), res[0].size() * sizeof(float)) == 0;
                    n_run++;
                    n_fail += !ok;
                    if (!ok || getenv("VERBOSE")) {
                        printf("%s %s one-token k=%lld n=%lld kind=%d thr=%d: %s\n", ok ? "ok  " : "FAIL", ggml_type_name(t),
                               (long long) k, (long long) n, kind, nt, ok ? "bit-identical to use_ref" : "differs from use_ref");
                    }
                }
            }
        }
    }
    printf("test-repack-ops: %s one-token products %d/%d bit-identical to reference mode\n", ggml_type_name(t), n_run - n_fail, n_run);
    return n_fail;
}


// deepseek-cpu: 2-4 tokens times q6_K weights in the plain buffer (the output head of Q4_0 and Q4_K_M files)
// go through the few-column kernel (dsc/x86-gemv-cols.c): every token's output must be bit for bit what
// the op gives for that token alone.
static int check_few_cols_q6_K(std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int n_fail = 0, n_run = 0;
    for (int64_t k : { 256, 1536 }) {
        for (int64_t n : { 7, 64, 130 }) {
            for (int nt : { 1, 2 }) {
                for (int64_t tok : { 2, 3, 4, 5 }) {
                    const mm_case c = { GGML_TYPE_Q6_K, k, n, 0, 0, tok, false, nt };
                    std::vector<uint8_t> wq;
                    std::vector<float>   wd;
                    random_weights(rng, nd, c.type, c.k, c.n, wq, wd);
                    std::vector<float> xf(c.k * c.n_tok);
                    for (auto & v : xf) { v = nd(rng); }
                    bool rp = false;
                    const std::vector<float> all = run(c, ggml_backend_cpu_buffer_type(), wq, xf, {}, &rp);
                    n_run++;
                    bool same = true;
                    for (int64_t i = 0; i < c.n_tok; ++i) {
                        mm_case one = c;
                        one.n_tok = 1;
                        const std::vector<float> x1(xf.begin() + c.k * i, xf.begin() + c.k * (i + 1));
                        const std::vector<float> o1 = run(one, ggml_backend_cpu_buffer_type(), wq, x1, {}, &rp);
                        same = same && memcmp(o1.data(), all.data() + c.n * i, c.n * sizeof(float)) == 0;
                    }
                    n_fail += !same;
                    if (!same || getenv("VERBOSE")) {
                        printf("%s few cols q6_K k=%lld n=%lld tok=%lld thr=%d\n", same ? "ok  " : "FAIL", (long long) k,
                               (long long) n, (long long) tok, nt);
                    }
                }
            }
        }
    }
    printf("test-repack-ops: few-token q6_K products %d/%d bit-identical to one token at a time\n", n_run - n_fail, n_run);
    return n_fail;
}
// deepseek-cpu: a speculative verify's batch (2-4 tokens, and the 1-3 rows after a 4-row GEMM) times
// repacked q4_0 / q4_K weights goes through the few-row GEMVs (dsc/x86-gemv-rows.cpp), plain MUL_MAT and
// MUL_MAT_ID alike: every token's output must be bit for bit what the same op gives for that token
// alone (the one-row decode GEMV), so a verified token sees the logits a plain decode would give it.
static int check_few_rows_bit_identical(std::mt19937 & rng, ggml_backend_buffer_type_t repack_buft) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int n_fail = 0, n_run = 0;
    for (ggml_type t : { GGML_TYPE_Q4_0, GGML_TYPE_Q4_K }) {
        const std::vector<int64_t> ks = t == GGML_TYPE_Q4_K ? std::vector<int64_t>{ 512, 2560 }
                                                            : std::vector<int64_t>{ 256, 4224 };
        for (int64_t k : ks) {
            for (int nt : { 1, 2 }) {
                // a plain MUL_MAT takes whole fours through the GEMM, whose float steps for q4_K are ordered
                // differently from its GEMV: there q4_K is bit-identical below 4 tokens; q4_0's GEMM is
                for (int64_t tok : { 2, 3, 4, 6, 7 }) {
                  for (int kind = 0; kind < 3; ++kind) {  // 0: MUL_MAT, 1: MUL_MAT_ID bcast, 2: per-slot
                        // the expert path takes a few tokens apart only on more than one thread
                        if ((t == GGML_TYPE_Q4_K && tok > (kind == 0 ? 3 : 4)) || (kind > 0 && nt == 1)) {
                            continue;
                        }
                        const mm_case c = kind == 0 ? mm_case{ t, k, 64, 0, 0, tok, false, nt }
                                                    : mm_case{ t, k, 64, 8, 3, tok, kind == 1, nt };
                        const int64_t n_w = c.k * c.n * (c.n_as ? c.n_as : 1);
                        std::vector<float> wf(n_w);
                        for (auto & v : wf) { v = nd(rng); }
                        std::vector<uint8_t> wq(ggml_row_size(t, c.k) * (n_w / c.k));
                        ggml_quantize_chunk(t, wf.data(), wq.data(), 0, n_w / c.k, c.k, nullptr);
                        const int64_t xr = c.n_as ? (c.bcast ? 1 : c.n_used) : 1;  // src1 rows per token
                        std::vector<float> xf(c.k * xr * c.n_tok);
                        for (auto & v : xf) { v = nd(rng); }
                        // every token on experts 0-2 in some order: experts see 1 .. tok tokens each
                        std::vector<int32_t> ids;
                        for (int64_t i = 0; i < c.n_tok && c.n_as; ++i) {
                            int32_t p[3] = { 0, 1, 2 };
                            std::shuffle(p, p + 3, rng);
                            ids.insert(ids.end(), p, p + 3);
                        }
                        bool rp = false;
                        const std::vector<float> all = run(c, repack_buft, wq, xf, ids, &rp);
                        if (!rp) {
                            continue;
                        }
                        n_run++;
                        const int64_t per_tok = c.n * (c.n_as ? c.n_used : 1);  // dst values per token
                        bool same = true;
                        for (int64_t i = 0; i < c.n_tok; ++i) {
                            mm_case one = c;
                            one.n_tok = 1;
                            const std::vector<float> x1(xf.begin() + c.k * xr * i, xf.begin() + c.k * xr * (i + 1));
                            const std::vector<int32_t> id1 = c.n_as ? std::vector<int32_t>(ids.begin() + 3 * i, ids.begin() + 3 * (i + 1))
                                                                    : std::vector<int32_t>();
                            const std::vector<float> o1 = run(one, repack_buft, wq, x1, id1, &rp);
                            same = same && memcmp(o1.data(), all.data() + per_tok * i, per_tok * sizeof(float)) == 0;
                        }
                        n_fail += !same;
                        if (!same || getenv("VERBOSE")) {
                            printf("%s few rows %s k=%lld tok=%lld %s thr=%d: %s\n", same ? "ok  " : "FAIL", ggml_type_name(t),
                                   (long long) k, (long long) tok, kind == 0 ? "mul_mat" : kind == 1 ? "mmid bcast" : "mmid per-slot",
                                   nt, same ? "bit-identical to one token at a time" : "differs from one token at a time");
                        }
                  }
                }
            }
        }
    }
    printf("test-repack-ops: few-token repacked products %d/%d bit-identical to one token at a time\n", n_run - n_fail, n_run);
    return n_fail;
}


// deepseek-cpu: ggml_cont of a transposed view (what MLA attention does with its latent cache on every
// decoded token when flash attention is off) against a plain loop; the copy must be exact.
static int check_cont_transpose() {
    int n_fail = 0, n_run = 0;
    std::mt19937 rng(7);
    struct shape { int64_t r, r_view, c, p; };
    for (ggml_type t : { GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I8 }) {
        for (int nt : { 1, 2, 3 }) {
            for (const shape & sh : { shape{ 576, 512, 1, 1 }, shape{ 576, 512, 7, 1 }, shape{ 576, 512, 512, 1 },
                                      shape{ 576, 512, 1000, 1 }, shape{ 33, 33, 100, 3 }, shape{ 40, 17, 65, 2 } }) {
                const size_t ts = ggml_type_size(t);
                ggml_init_params ip = { ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true };
                ggml_context * ctx = ggml_init(ip);
                ggml_tensor * x = ggml_new_tensor_3d(ctx, t, sh.r, sh.c, sh.p);
                ggml_tensor * v = ggml_view_3d(ctx, x, sh.r_view, sh.c, sh.p, x->nb[1], x->nb[2], 0);
                ggml_tensor * y = ggml_cont(ctx, ggml_transpose(ctx, v));
                ggml_cgraph * gf = ggml_new_graph(ctx);
                ggml_build_forward_expand(gf, y);
                ggml_backend_t be = ggml_backend_cpu_init();
                ggml_backend_cpu_set_n_threads(be, nt);
                ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
                std::vector<uint8_t> xb(ggml_nbytes(x));
                for (auto & b : xb) { b = (uint8_t) rng(); }
                ggml_backend_tensor_set(x, xb.data(), 0, xb.size());
                GGML_ASSERT(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS);
                std::vector<uint8_t> yb(ggml_nbytes(y)), want(ggml_nbytes(y));
                ggml_backend_tensor_get(y, yb.data(), 0, yb.size());
                for (int64_t p = 0; p < sh.p; p++) {
                    for (int64_t r = 0; r < sh.r_view; r++) {
                        for (int64_t c = 0; c < sh.c; c++) {
                            memcpy(&want[((p * sh.r_view + r) * sh.c + c) * ts], &xb[((p * sh.c + c) * sh.r + r) * ts], ts);
                        }
                    }
                }
                n_run++;
                if (yb != want) {
                    n_fail++;
                    printf("FAIL cont(transpose) %s %lldx%lld of %lld x %lld planes, %d threads\n", ggml_type_name(t),
                           (long long) sh.r_view, (long long) sh.c, (long long) sh.r, (long long) sh.p, nt);
                }
                ggml_backend_buffer_free(buf);
                ggml_backend_free(be);
                ggml_free(ctx);
            }
        }
    }
    printf("test-repack-ops: %d/%d cont(transpose) cases exact\n", n_run - n_fail, n_run);
    return n_fail;
}

// deepseek-cpu: the CPU backend's q8_K quantizer (the activations of every q4_K/q6_K product) against the
// reference in ggml-base, byte for byte: random rows, blocks whose largest |x| comes twice with both
// signs, exact ties of the rounding (x = j + 0.5 with iscale 1), zero blocks and a NaN. (q8_K has no
// from_float_ref in the type traits; the reference is exported from ggml-base, ggml-quants.h.)
extern "C" void quantize_row_q8_K_ref(const float * x, void * y, int64_t k);

static int check_q8_K_quantize() {
    const ggml_from_float_t ours = ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float;
    const ggml_from_float_t ref  = quantize_row_q8_K_ref;
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t k = 8 * 256;
    int n_fail = 0, n_run = 0;
    for (int kind = 0; kind < 7; kind++) {
        for (int rep = 0; rep < 50; rep++) {
            std::vector<float> x(k);
            for (auto & v : x) { v = nd(rng) * (kind == 1 ? 1e-30f : kind == 2 ? 1e4f : 1.0f); }
            for (int64_t b = 0; b < k / 256; b++) {
                float * xb = x.data() + 256 * b;
                if (kind == 3) { // the largest |x| twice, negative first in odd blocks; far apart or in one vector
                    const float m = 9.0f + (float) (rng() % 100);
                    const int i0 = (rep & 1) ? 8 * (int) (rng() % 32) + (int) (rng() % 4) : (int) (rng() % 128);
                    const int i1 = (rep & 1) ? i0 + 1 + (int) (rng() % 4) : 128 + (int) (rng() % 128);
                    xb[i0] = (b & 1) ? -m : m;
                    xb[i1] = (b & 1) ? m : -m;
                } else if (kind == 4) { // iscale = 1: every value a tie of the rounding
                    for (int j = 0; j < 256; j++) { xb[j] = (float) ((int) (rng() % 253) - 126) + 0.5f; }
                    xb[rng() % 256] = -127.0f;
                } else if (kind == 5 && (b % 3) == 0) {
                    std::fill(xb, xb + 256, (b % 2) ? -0.0f : 0.0f);
                } else if (kind == 6 && b == 2) {
                    xb[rng() % 256] = std::nanf("");
                }
            }
            // both zeroed: the reference leaves a zero block's partial sums as they were (ours zeroes them)
            std::vector<uint8_t> a(ggml_row_size(GGML_TYPE_Q8_K, k), 0), w(a.size(), 0);
            ours(x.data(), a.data(), k);
            ref(x.data(), w.data(), k);
            n_run++;
            if (a != w) {
                n_fail++;
                size_t i = 0;
                while (a[i] == w[i]) { i++; }
                printf("FAIL q8_K quantize kind %d rep %d: first differing byte %zu (%d vs %d)\n", kind, rep, i, a[i], w[i]);
            }
        }
    }
    printf("test-repack-ops: q8_K quantize %d/%d rows byte-identical to the reference\n", n_run - n_fail, n_run);
    return n_fail;
}

// distinct experts per token, skewed so some experts get many rows and some none
static std::vector<int32_t> random_ids(std::mt19937 & rng, const mm_case & c) {
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < c.n_tok; ++t) {
        std::vector<int32_t> perm(c.n_as);
        for (int64_t e = 0; e < c.n_as; ++e) { perm[e] = (int32_t) e; }
        for (int64_t e = 0; e < c.n_used; ++e) {
            const int64_t lim = std::min<int64_t>(c.n_as - e, (rng() % 3 == 0) ? c.n_as - e : std::max<int64_t>(1, (c.n_as - e) / 2));
            std::swap(perm[e], perm[e + rng() % lim]);
            ids.push_back(perm[e]);
        }
    }
    return ids;
}

// the AMX path (dsc/amx-gemm.cpp) and its switch, exported by ggml-cpu
extern "C" bool ggml_dsc_amx_enabled(void);
extern "C" bool ggml_dsc_amx_set_enabled(bool on);

// deepseek-cpu: prompt-sized q4_0 / q4_K products on AMX tiles against the AVX-512 VNNI kernels they
// replace, both with the weights in CPU_REPACK. The integer block sums are exact either way and the AMX
// path does the VNNI GEMMs' float steps in their order, so their outputs must be bit-identical (not
// merely close): any difference is a bug (the rows VNNI leaves to its q4_K GEMV: below). Token counts cover full and partial 16-row tiles, one and
// two tiles per pass; n = 48 ends q4_0 on a single 16-column tile.
static int check_amx_bit_identical(std::mt19937 & rng, ggml_backend_buffer_type_t repack_buft) {
    if (!ggml_dsc_amx_enabled()) {
        printf("test-repack-ops: AMX cases skipped: CPU lacks AMX (or the kernel refused it, or DEEPSEEK_CPU_AMX=0)\n");
        return 0;
    }
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<mm_case> cases;
    for (ggml_type t : { GGML_TYPE_Q4_0, GGML_TYPE_Q4_K }) {
        const std::vector<int64_t> ks = t == GGML_TYPE_Q4_K ? std::vector<int64_t>{ 512, 2560 } : std::vector<int64_t>{ 256, 1408, 4224 };
        for (const int64_t k : ks) {
            for (int nt : { 1, 2, 3 }) {
                for (int64_t tok : { 16, 17, 31, 33, 64 }) {
                    cases.push_back({ t, k, 48, 0, 0, tok, false, nt });
                    cases.push_back({ t, k, 128, 8, 3, tok, true, nt });
                    cases.push_back({ t, k, 64, 4, 4, tok, false, nt });
                }
                cases.push_back({ t, k, 128, 0, 0, 200, false, nt });
                cases.push_back({ t, k, 128, 16, 6, 200, true, nt });
                cases.push_back({ t, k, 128, 16, 6, 200, false, nt });
            }
        }
    }
    int n_fail = 0, n_run = 0;
    for (const auto & c : cases) {
        const int64_t n_w = c.k * c.n * (c.n_as ? c.n_as : 1);
        std::vector<float> wf(n_w);
        for (auto & v : wf) { v = nd(rng); }
        std::vector<uint8_t> wq(ggml_row_size(c.type, c.k) * (n_w / c.k));
        ggml_quantize_chunk(c.type, wf.data(), wq.data(), 0, n_w / c.k, c.k, nullptr);
        std::vector<float> xf(c.k * c.n_tok * (c.n_as ? (c.bcast ? 1 : c.n_used) : 1));
        for (auto & v : xf) { v = nd(rng); }
        const std::vector<int32_t> ids = c.n_as ? random_ids(rng, c) : std::vector<int32_t>();

        bool rp = false;
        ggml_dsc_amx_set_enabled(false);
        const std::vector<float> vnni = run(c, repack_buft, wq, xf, ids, &rp);
        ggml_dsc_amx_set_enabled(true);
        const std::vector<float> amx = run(c, repack_buft, wq, xf, ids, &rp);
        if (!rp) {
            continue;
        }
        n_run++;
        // The VNNI path runs an op's rows through its GEMM four at a time and a last one to three
        // through the GEMV (per expert, in token order); for q4_K the GEMV sums the mins term apart and
        // subtracts it at the end, where the GEMM (and AMX) subtract per super-block: those rows are
        // the same sums in another float order and must agree to 1e-5 of the largest output; every
        // other output bit for bit.
        std::vector<bool> gemv_row(c.n_tok * std::max<int64_t>(c.n_used, 1), false);
        if (c.type == GGML_TYPE_Q4_K) {
            if (c.n_as == 0) {
                for (int64_t t = c.n_tok - c.n_tok % 4; t < c.n_tok; t++) { gemv_row[t] = true; }
            } else {
                std::vector<std::vector<int64_t>> rows_of(c.n_as);
                for (int64_t t = 0; t < c.n_tok; t++) {
                    for (int64_t u = 0; u < c.n_used; u++) { rows_of[ids[t * c.n_used + u]].push_back(t * c.n_used + u); }
                }
                for (const auto & r : rows_of) {
                    for (size_t i = r.size() - r.size() % 4; i < r.size(); i++) { gemv_row[r[i]] = true; }
                }
            }
        }
        double max_ref = 0.0, max_gemv_err = 0.0;
        size_t n_diff = 0;
        for (size_t i = 0; i < vnni.size(); i++) { max_ref = std::max(max_ref, (double) std::fabs(vnni[i])); }
        for (size_t i = 0; i < amx.size() && amx.size() == vnni.size(); i++) {
            if (gemv_row[i / c.n]) {
                max_gemv_err = std::max(max_gemv_err, (double) std::fabs(amx[i] - vnni[i]));
            } else {
                n_diff += memcmp(&amx[i], &vnni[i], sizeof(float)) != 0;
            }
        }
        const bool ok = amx.size() == vnni.size() && n_diff == 0 && max_gemv_err <= 1e-5 * max_ref;
        if (!ok) {
            n_fail++;
        }
        if (!ok || getenv("VERBOSE")) {
            printf("%s AMX %s k=%lld n=%lld n_as=%lld used=%lld tok=%lld %s thr=%d: %zu of %zu outputs differ, GEMV rows within %.2g\n",
                   ok ? "ok  " : "FAIL", ggml_type_name(c.type), (long long) c.k, (long long) c.n, (long long) c.n_as,
                   (long long) c.n_used, (long long) c.n_tok, c.bcast ? "bcast" : "per-slot", c.n_threads, n_diff, amx.size(),
                   max_gemv_err / std::max(max_ref, 1e-30));
        }
    }
    printf("test-repack-ops: AMX products %d/%d bit-identical to the AVX-512 VNNI GEMMs\n", n_run - n_fail, n_run);
    return n_fail;
}

// deepseek-cpu: the repacked 4-bit kernels keep AVX2 partial sums in int16; MXFP4's unsigned weights
// (0 .. 24, the e2m1 table + 12) against activations of +-127 reach 8 * 2 * 24 * 127 = 48768 in eight
// maddubs pairs, past int16, so its sums widen every four. Random weights never come near that: here
// every weight is the largest code and every activation +-127, one token (GEMV) and 4, 8, 12 (GEMMs).
static int check_w4_extremes(ggml_backend_buffer_type_t repack_buft) {
    int n_fail = 0, n_run = 0;
    for (ggml_type t : { GGML_TYPE_MXFP4, GGML_TYPE_Q4_0 }) {
        for (float wv : { 1.0f, -1.0f }) {
            for (float xv : { 1.0f, -1.0f }) {
                for (int64_t tok : { 1, 4, 8, 12 }) {
                    const mm_case c = { t, 256, 16, 0, 0, tok, false, 2 };
                    std::vector<float> wf(c.k * c.n, wv);
                    std::vector<uint8_t> wq(ggml_row_size(t, c.k) * c.n);
                    ggml_quantize_chunk(t, wf.data(), wq.data(), 0, c.n, c.k, nullptr);
                    const std::vector<float> xf(c.k * tok, xv);
                    bool rp = false, rp_ref = false;
                    const std::vector<float> a = run(c, repack_buft, wq, xf, {}, &rp);
                    if (!rp) {
                        continue;
                    }
                    const std::vector<float> b = run(c, ggml_backend_cpu_buffer_type(), wq, xf, {}, &rp_ref);
                    n_run++;
                    double max_err = 0.0, max_ref = 0.0;
                    for (size_t i = 0; i < a.size(); ++i) {
                        max_err = std::max(max_err, (double) std::fabs(a[i] - b[i]));
                        max_ref = std::max(max_ref, (double) std::fabs(b[i]));
                    }
                    const double rel = max_err / std::max(max_ref, 1e-6);
                    const bool ok = std::isfinite(rel) && rel < 1e-4 && max_ref > 0.0;
                    if (!ok) {
                        n_fail++;
                        printf("FAIL %s extremes w=%g x=%g tok=%lld: rel err %.3g (reference %g)\n",
                               ggml_type_name(t), wv, xv, (long long) tok, rel, max_ref);
                    }
                }
            }
        }
    }
    printf("test-repack-ops: largest weights x largest activations, repacked 4-bit: %d/%d agree with the plain buffer\n",
           n_run - n_fail, n_run);
    return n_fail;
}

int main() {
    ggml_log_set([](ggml_log_level level, const char * text, void *) {
        if (level >= GGML_LOG_LEVEL_WARN) {
            fputs(text, stderr);
        }
    }, nullptr);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU));
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t repack_buft = nullptr;
    if (get_extra) {
        for (ggml_backend_buffer_type_t * p = get_extra(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)); p && *p; ++p) {
            if (std::string(ggml_backend_buft_name(*p)) == "CPU_REPACK") {
                repack_buft = *p;
            }
        }
    }
    if (!repack_buft) {
        printf("test-repack-ops: no CPU_REPACK buffer type in this build, skipping\n");
        return 0;
    }
    ggml_backend_buffer_type_t cpu_buft = ggml_backend_cpu_buffer_type();

    std::vector<mm_case> cases;
    for (ggml_type t : { GGML_TYPE_Q4_0, GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4 }) {
      // q4_0 (and MXFP4, on the same kernels) also at k = 1408 (44 blocks) and 4224 (132 blocks): the x86
      // q4_0 GEMM walks k in chunks of 16 blocks (8 when it takes 8 rows) and the GEMV in chunks of 128,
      // so these cover several chunks and a partial last one; q4_K at k = 2560 (10 super-blocks) for the
      // q4_K GEMM's chunks of 4. 12 tokens: one 8-row and one 4-row GEMM call; 7: a 4-row call and three GEMV rows
      const std::vector<int64_t> ks = t == GGML_TYPE_Q4_K ? std::vector<int64_t>{ 512, 2560 }
                                    : t == GGML_TYPE_Q4_0 || t == GGML_TYPE_MXFP4 ? std::vector<int64_t>{ 256, 1408, 4224 }
                                                          : std::vector<int64_t>{ 256 };
      for (const int64_t k : ks) {
        for (int nt : { 1, 2, 3 }) {
            for (int64_t tok : { 1, 2, 3, 4, 5, 7, 8, 12, 17, 33, 64 }) {
                cases.push_back({ t, k, 64, 0, 0, tok, false, nt });
                for (bool bc : { true, false }) {
                    cases.push_back({ t, k, 64, 8, 3, tok, bc, nt });
                    cases.push_back({ t, k, 40, 4, 4, tok, bc, nt });  // every expert sees every token
                }
            }
            cases.push_back({ t, k, 128, 16, 6, 200, true, nt });
            cases.push_back({ t, k, 128, 16, 6, 200, false, nt });
        }
      }
    }

    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int n_fail = 0, n_run = 0, n_repacked = 0; (void) n_repacked;
    for (const auto & c : cases) {
        const int64_t n_w = c.k * c.n * (c.n_as ? c.n_as : 1);
        std::vector<float> wf(n_w);
        for (auto & v : wf) { v = nd(rng); }
        std::vector<uint8_t> wq(ggml_row_size(c.type, c.k) * (n_w / c.k));
        ggml_quantize_chunk(c.type, wf.data(), wq.data(), 0, n_w / c.k, c.k, nullptr);

        const int64_t n_x = c.k * c.n_tok * (c.n_as ? (c.bcast ? 1 : c.n_used) : 1);
        std::vector<float> xf(n_x);
        for (auto & v : xf) { v = nd(rng); }
        const std::vector<int32_t> ids = c.n_as ? random_ids(rng, c) : std::vector<int32_t>();

        bool rp_a = false, rp_b = false;
        std::vector<float> a = run(c, repack_buft, wq, xf, ids, &rp_a);
        if (!rp_a) {
            continue;
        }
        std::vector<float> b = run(c, cpu_buft,    wq, xf, ids, &rp_b);
        n_run++;
        n_repacked += rp_a;

        double max_err = 0.0, max_ref = 0.0;
        for (size_t i = 0; i < a.size(); ++i) {
            max_err = std::max(max_err, (double) std::fabs(a[i] - b[i]));
            max_ref = std::max(max_ref, (double) std::fabs(b[i]));
        }
        const double rel = max_err / std::max(max_ref, 1e-6);
        const bool ok = std::isfinite(rel) && rel < 1e-4;
        if (!ok) {
            n_fail++;
        }
        if (!ok || getenv("VERBOSE")) {
            printf("%s %s k=%lld n=%lld n_as=%lld used=%lld tok=%lld %s thr=%d repacked=%d: rel err %.3g\n",
                   ok ? "ok  " : "FAIL", ggml_type_name(c.type), (long long) c.k, (long long) c.n, (long long) c.n_as,
                   (long long) c.n_used, (long long) c.n_tok, c.bcast ? "bcast" : "per-slot", c.n_threads, (int) rp_a, rel);
        }
    }
    n_fail += check_cont_transpose();
    n_fail += check_mmid_plain(rng);
    n_fail += check_mmid_plain_two_ops(rng);
    n_fail += check_mm_plain(rng, GGML_TYPE_Q4_0);
    n_fail += check_mm_plain(rng, GGML_TYPE_Q4_K);
    n_fail += check_mm_plain(rng, GGML_TYPE_Q5_0);
    n_fail += check_mm_plain(rng, GGML_TYPE_Q8_0);
    n_fail += check_mm_plain(rng, GGML_TYPE_Q6_K);
    n_fail += check_q8_K_quantize();
    n_fail += check_gemv_bit_identical(rng, GGML_TYPE_Q4_0);
    n_fail += check_gemv_bit_identical(rng, GGML_TYPE_Q5_0);
    n_fail += check_gemv_bit_identical(rng, GGML_TYPE_Q8_0);
    n_fail += check_gemv_bit_identical(rng, GGML_TYPE_MXFP4);
    n_fail += check_gemv_bit_identical(rng, GGML_TYPE_Q6_K);
    n_fail += check_gemv_bit_identical(rng, GGML_TYPE_Q3_K);
    n_fail += check_gemv_bit_identical(rng, GGML_TYPE_Q2_K);
    n_fail += check_w4_extremes(repack_buft);
    n_fail += check_few_rows_bit_identical(rng, repack_buft);
    n_fail += check_few_cols_q6_K(rng);
    n_fail += check_amx_bit_identical(rng, repack_buft);
    printf("test-repack-ops: %d/%d cases agree\n", n_run - n_fail, n_run);
    if (n_run == 0) {
        printf("test-repack-ops: no type has a repacked layout on this CPU\n");
    }
    return n_fail == 0 ? 0 : 1;
}
