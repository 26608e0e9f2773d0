// deepseek-cpu: the repack buffer's expert paths (one token: rows in chunks the threads take as they ask;
// several tokens: 4 or 8 rows at a time through the repacked GEMM) for forward_mul_mat_id's hooks, the
// q4_0 4-byte interleave make_block_q4_0x8 hands to on AVX2 builds, and q4_0 / q4_K / q6_K weights in the
// plain buffer through the repacked GEMM (ggml_dsc_mul_mat_plain_repacked, called from ggml-cpu.c).
#define GGML_COMMON_IMPL_CPP
#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"
#include "ggml-backend-impl.h"

#include "ggml-impl.h"
#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "simd-mappings.h"
#include "traits.h"

#include "arch-fallback.h"

#include <cmath>
#include <cstring>
#include <cassert>
#include <algorithm>
#include <vector>

#include "../repack.h"


// deepseek-cpu: nrg (4 or 8) q8_0 rows of nb blocks into the q4_0 GEMM's interleaved activation layout,
// nrg / 4 groups of nb block_q8_0x4 (row m's k 8j .. 8j+7 at qs[32j + 8m]), for rows that are not
// adjacent (an expert's gathered tokens) or not quantized in that layout (plain-buffer weights)
static void dsc_gather_q8_0x4(const block_q8_0 * const * rows, int nrg, int64_t nb, block_q8_0x4 * out) {
    for (int h = 0; h < nrg / 4; h++) {
        for (int64_t b = 0; b < nb; b++) {
            block_q8_0x4 & x = out[h * nb + b];
            for (int m = 0; m < 4; m++) {
                x.d[m] = rows[4 * h + m][b].d;
                for (int j = 0; j < 4; j++) {
                    memcpy(x.qs + 32 * j + 8 * m, rows[4 * h + m][b].qs + 8 * j, 8);
                }
            }
        }
    }
}

// deepseek-cpu: nrg (4 or 8) q8_K rows of nb super-blocks into the q4_K GEMM's activation layout, nrg / 4
// groups of nb block_q8_Kx4 as ggml_quantize_mat_q8_K_4x8 lays them out: row m's k 8j .. 8j+7 at
// qs[32j + 8m], the sum of its 16-group g at bsums[16 (g / 4) + 4m + g % 4]. For an expert's gathered
// tokens, which MUL_MAT_ID has already quantized to q8_K row by row, so they need not be copied as
// floats and quantized again.
static void dsc_gather_q8_Kx4(const block_q8_K * const * rows, int nrg, int64_t nb, block_q8_Kx4 * out) {
    for (int h = 0; h < nrg / 4; h++) {
        for (int64_t b = 0; b < nb; b++) {
            block_q8_Kx4 & x = out[h * nb + b];
            for (int m = 0; m < 4; m++) {
                const block_q8_K & r = rows[4 * h + m][b];
                x.d[m] = r.d;
                for (int j = 0; j < QK_K / 8; j++) {
                    memcpy(x.qs + 32 * j + 8 * m, r.qs + 8 * j, 8);
                }
                for (int q = 0; q < QK_K / 64; q++) {
                    memcpy(x.bsums + 16 * q + 4 * m, r.bsums + 4 * q, 4 * sizeof(int16_t));
                }
            }
        }
    }
}

// deepseek-cpu: make_block_q4_0x8 (repack.cpp) on AVX2 builds, after the scales: the x86 AVX2 kernels
// (dsc/x86-repack.cpp, gemv/gemm_q4_0_8x4u_q8_0_avx2) read a 4-byte interleave of the unsigned nibbles
// instead: qs[32 * j + 4 * c + i] = column c's qs[4 * j + i]. A 256-bit load is then 8 columns x 4 k,
// whose maddubs sums reduce to one int32 per column in order.
// MXFP4 blocks keep their nibbles as q4_0 does (qs[i]: element i low, 16 + i high), so make_block_mxfp4x8
// takes the same interleave.
template <typename B, typename Bx8>
static void ggml_dsc_interleave_4u(const B * in, Bx8 & out) {
    static_assert(sizeof(out.qs) == 8 * sizeof(in[0].qs) && sizeof(in[0].qs) == 16, "8 blocks of 32 nibbles");
    for (int j = 0; j < 4; j++) {
        for (int c = 0; c < 8; c++) {
            memcpy(&out.qs[32 * j + 4 * c], &in[c].qs[4 * j], 4);
        }
    }
}

void ggml_dsc_interleave_q4_0x8_4u(const block_q4_0 * in, block_q4_0x8 * out_p) {
    ggml_dsc_interleave_4u(in, *out_p);
}

void ggml_dsc_interleave_mxfp4x8_4u(const block_mxfp4 * in, block_mxfp4x8 * out_p) {
    ggml_dsc_interleave_4u(in, *out_p);
}

// the most experts the one-token path keeps a list of (n_expert_used x tokens)
#define GGML_DSC_MMID_MAX_USED 64

// deepseek-cpu: for one token every used expert has one row, and splitting each expert's rows in
// halves (below) ties the op to the slower thread: on a shared machine one core often streams
// weights more slowly than the other, and the faster one then waits at the barrier (12-19% of the
// op's time in the op profile). Instead the used experts' rows are cut into chunks, a few per
// expert and thread, that the threads take as they ask. Every row is still one GEMV over its own
// 8-row group, so the sums are the same.
bool ggml_dsc_mmid_one_token_begin(const struct ggml_dsc_mmid * dsc) {
    const ggml_compute_params * params = dsc->params;
    const ggml_tensor * src0 = dsc->src0;
    const ggml_tensor * src1 = dsc->dst->src[1];
    const ggml_tensor * ids  = dsc->ids;
    const ggml_tensor * dst  = dsc->dst;

    GGML_TENSOR_BINARY_OP_LOCALS

    const int ith = params->ith;
    const int nth = params->nth;
    const int n_ids = ids->ne[0]; // n_expert_used
    const int n_as  = ne02;       // n_expert
    const int64_t NB_COLS = dsc->nb_cols;
    const char * wdata = dsc->wdata;
    const size_t nbw1 = dsc->nbw1;
    const size_t nbw2 = dsc->nbw2;
    const int64_t * matrix_row_counts = dsc->row_counts;
    const ggml_dsc_mmid_row * matrix_rows = dsc->rows;
    GGML_UNUSED(ith); GGML_UNUSED(nth); GGML_UNUSED(n_ids); GGML_UNUSED(n_as); GGML_UNUSED(NB_COLS); GGML_UNUSED(wdata);
    GGML_UNUSED(nbw1); GGML_UNUSED(nbw2); GGML_UNUSED(matrix_row_counts); GGML_UNUSED(matrix_rows);
    // a few tokens (a speculative verify's batch) the same way when the few-row GEMVs can run each
    // expert's 2 .. GGML_DSC_GEMV_ROWS_MAX rows in one pass over its weights
    const int64_t n_tok = ids->ne[1];
    const bool few_tokens = n_tok == 1 ||
        (n_tok <= GGML_DSC_GEMV_ROWS_MAX && ggml_dsc_gemv_rows_fits(src0->type, NB_COLS, dsc->inter_size));
    const bool dsc_one_token = few_tokens && n_ids * n_tok <= GGML_DSC_MMID_MAX_USED && nth > 1 && ne01 % NB_COLS == 0;
    if (dsc_one_token && ith == 0) {
        ggml_threadpool_chunk_set(params->threadpool, nth);
    }
    return dsc_one_token;
}

// the rows expert cur_a got, from ir1_first on, one GEMV each over its weight rows [r0, r1)
static void gemv_rows(const struct ggml_dsc_mmid * dsc, int cur_a, int64_t ir1_first, int64_t r0, int64_t r1) {
    const ggml_compute_params * params = dsc->params;
    const ggml_tensor * src0 = dsc->src0;
    const ggml_tensor * src1 = dsc->dst->src[1];
    const ggml_tensor * ids  = dsc->ids;
    const ggml_tensor * dst  = dsc->dst;

    GGML_TENSOR_BINARY_OP_LOCALS

    const int ith = params->ith;
    const int nth = params->nth;
    const int n_ids = ids->ne[0]; // n_expert_used
    const int n_as  = ne02;       // n_expert
    const int64_t NB_COLS = dsc->nb_cols;
    const char * wdata = dsc->wdata;
    const size_t nbw1 = dsc->nbw1;
    const size_t nbw2 = dsc->nbw2;
    const int64_t * matrix_row_counts = dsc->row_counts;
    const ggml_dsc_mmid_row * matrix_rows = dsc->rows;
    GGML_UNUSED(ith); GGML_UNUSED(nth); GGML_UNUSED(n_ids); GGML_UNUSED(n_as); GGML_UNUSED(NB_COLS); GGML_UNUSED(wdata);
    GGML_UNUSED(nbw1); GGML_UNUSED(nbw2); GGML_UNUSED(matrix_row_counts); GGML_UNUSED(matrix_rows);

#define MMID_MATRIX_ROW(row_id, i1) matrix_rows[(row_id) * ne12 + (i1)]
    const auto * src0_cur = (const char *) src0->data + cur_a*nb02;
    const int64_t n_rows = matrix_row_counts[cur_a] - ir1_first;
    if (n_rows >= 2 && n_rows <= GGML_DSC_GEMV_ROWS_MAX) {
        // the expert's tokens in one pass over its weight rows (dsc/x86-gemv-rows.cpp)
        float *      out[GGML_DSC_GEMV_ROWS_MAX];
        const void * a[GGML_DSC_GEMV_ROWS_MAX];
        for (int64_t k = 0; k < n_rows; k++) {
            const ggml_dsc_mmid_row rm = MMID_MATRIX_ROW(cur_a, ir1_first + k);
            out[k] = (float *) ((char *) dst->data + (rm.i1*nb1 + rm.i2*nb2)) + r0;
            a[k]   = (const char *) wdata + ((rm.i1 % ne11)*nbw1 + rm.i2*nbw2);
        }
        if (ggml_dsc_gemv_rows(src0->type, NB_COLS, dsc->inter_size, ne00, out, src0_cur + r0*nb01, a, (int) n_rows, (int) (r1 - r0))) {
            return;
        }
    }
    for (int64_t ir1 = ir1_first; ir1 < matrix_row_counts[cur_a]; ir1++) {
        const ggml_dsc_mmid_row rm = MMID_MATRIX_ROW(cur_a, ir1);
        const auto * src1_col = (const char *) wdata + ((rm.i1 % ne11)*nbw1 + rm.i2*nbw2);
        dsc->gemv(
            ne00, (float *) ((char *) dst->data + (rm.i1*nb1 + rm.i2*nb2)) + r0, ne01,
            src0_cur + r0*nb01, src1_col, 1, r1 - r0);
    }
#undef MMID_MATRIX_ROW
}

// after the barrier, when ggml_dsc_mmid_one_token_begin was true: false when no expert got a row
bool ggml_dsc_mmid_one_token(const struct ggml_dsc_mmid * dsc) {
    const ggml_compute_params * params = dsc->params;
    const ggml_tensor * src0 = dsc->src0;
    const ggml_tensor * src1 = dsc->dst->src[1];
    const ggml_tensor * ids  = dsc->ids;
    const ggml_tensor * dst  = dsc->dst;

    GGML_TENSOR_BINARY_OP_LOCALS

    const int ith = params->ith;
    const int nth = params->nth;
    const int n_ids = ids->ne[0]; // n_expert_used
    const int n_as  = ne02;       // n_expert
    const int64_t NB_COLS = dsc->nb_cols;
    const char * wdata = dsc->wdata;
    const size_t nbw1 = dsc->nbw1;
    const size_t nbw2 = dsc->nbw2;
    const int64_t * matrix_row_counts = dsc->row_counts;
    const ggml_dsc_mmid_row * matrix_rows = dsc->rows;
    GGML_UNUSED(ith); GGML_UNUSED(nth); GGML_UNUSED(n_ids); GGML_UNUSED(n_as); GGML_UNUSED(NB_COLS); GGML_UNUSED(wdata);
    GGML_UNUSED(nbw1); GGML_UNUSED(nbw2); GGML_UNUSED(matrix_row_counts); GGML_UNUSED(matrix_rows);

#define MMID_MATRIX_ROW(row_id, i1) matrix_rows[(row_id) * ne12 + (i1)]
    int used[GGML_DSC_MMID_MAX_USED]; // at most n_ids experts per token (ggml_dsc_mmid_one_token_begin)
    int n_used = 0;
    for (int a = 0; a < n_as && n_used < GGML_DSC_MMID_MAX_USED; a++) {
        if (matrix_row_counts[a] > 0) {
            used[n_used++] = a;
        }
    }
    if (n_used > 0) {
        // about four chunks per thread, and no fewer than four per expert
        const int64_t per_expert = MAX((int64_t) 4, (4*nth + n_used - 1)/n_used);
        int64_t rows = (ne01/per_expert)/NB_COLS*NB_COLS;
        rows = MAX(rows, (int64_t) NB_COLS);
        const int64_t nch    = (ne01 + rows - 1)/rows;
        const int64_t nitems = n_used*nch;
        for (int64_t w = ith; w < nitems; w = ggml_threadpool_chunk_add(params->threadpool, 1)) {
            const int64_t r0 = (w%nch)*rows;
            gemv_rows(dsc, used[w/nch], 0, r0, MIN(r0 + rows, ne01));
        }
        return true;
    }
    return false;
#undef MMID_MATRIX_ROW
}

// the rows expert cur_a got that go through the GEMM, 8 or 4 at a time, over weight rows
// [src0_cur_start, src0_cur_end); returns how many (the caller runs the rest through the GEMV)
int64_t ggml_dsc_mmid_expert_gemm(const struct ggml_dsc_mmid * dsc, int cur_a, int64_t src0_cur_start, int64_t src0_cur_end) {
    const ggml_compute_params * params = dsc->params;
    const ggml_tensor * src0 = dsc->src0;
    const ggml_tensor * src1 = dsc->dst->src[1];
    const ggml_tensor * ids  = dsc->ids;
    const ggml_tensor * dst  = dsc->dst;

    GGML_TENSOR_BINARY_OP_LOCALS

    const int ith = params->ith;
    const int nth = params->nth;
    const int n_ids = ids->ne[0]; // n_expert_used
    const int n_as  = ne02;       // n_expert
    const int64_t NB_COLS = dsc->nb_cols;
    const char * wdata = dsc->wdata;
    const size_t nbw1 = dsc->nbw1;
    const size_t nbw2 = dsc->nbw2;
    const int64_t * matrix_row_counts = dsc->row_counts;
    const ggml_dsc_mmid_row * matrix_rows = dsc->rows;
    GGML_UNUSED(ith); GGML_UNUSED(nth); GGML_UNUSED(n_ids); GGML_UNUSED(n_as); GGML_UNUSED(NB_COLS); GGML_UNUSED(wdata);
    GGML_UNUSED(nbw1); GGML_UNUSED(nbw2); GGML_UNUSED(matrix_row_counts); GGML_UNUSED(matrix_rows);

#define MMID_MATRIX_ROW(row_id, i1) matrix_rows[(row_id) * ne12 + (i1)]
    const int64_t nr1 = matrix_row_counts[cur_a]; // src1 rows
    const auto * src0_cur = (const char *) src0->data + cur_a*nb02;

    int ir1_first = 0;
    if (src0->type == GGML_TYPE_Q4_0 && dsc->inter_size == 8 && NB_COLS == 8 &&
        dsc->param_type == GGML_TYPE_Q8_0) {
        // deepseek-cpu: an expert that gets several rows (prefill, batched decode) runs them four at
        // a time through the GEMM, which unpacks each weight block once for four rows; the rows'
        // q8_0 blocks, already quantized above, are gathered into the GEMM's 4-row interleaved
        // layout. Per row the GEMM does what the GEMV does, so the results are the same.
        // (Plain locals, not thread_local: a thread_local in this template becomes a GNU_UNIQUE
        // symbol, which makes the library impossible to dlclose - portable builds then keep every
        // CPU variant they probed mapped.)
        const int64_t nbk  = ne10 / QK8_0;
        const int64_t ncol = src0_cur_end - src0_cur_start;
        if (nr1 >= 4 && ne10 % QK8_0 == 0) {
            // eight rows per call while there are eight (AVX2's GEMM then unpacks each weight block
            // once for eight rows), then four
            std::vector<block_q8_0x4> xq;
            std::vector<float>        out;
            xq.resize(2 * nbk);
            while (ir1_first + 4 <= nr1) {
                const int nrg = ir1_first + 8 <= nr1 ? 8 : 4;
                const block_q8_0 * rows[8];
                float *            dsts[8];
                for (int m = 0; m < nrg; m++) {
                    const ggml_dsc_mmid_row rm = MMID_MATRIX_ROW(cur_a, ir1_first + m);
                    rows[m] = (const block_q8_0 *) ((const char *) wdata + ((rm.i1 % ne11) * nbw1 + rm.i2 * nbw2));
                    dsts[m] = (float *) ((char *) dst->data + (rm.i1 * nb1 + rm.i2 * nb2)) + src0_cur_start;
                }
                dsc_gather_q8_0x4(rows, nrg, nbk, xq.data());
#if defined(__AVX2__)
                // each row's sums go straight to its token's slot of dst
                ggml_dsc_gemm_q4_0_rows(ne00, dsts, src0_cur + src0_cur_start * nb01, xq.data(), nrg, ncol);
#else
                out.resize(8 * ncol);
                dsc->gemm(ne00, out.data(), ncol, src0_cur + src0_cur_start * nb01,
                          xq.data(), nrg, ncol);
                for (int m = 0; m < nrg; m++) {
                    memcpy(dsts[m], out.data() + m * ncol, ncol * sizeof(float));
                }
#endif
                ir1_first += nrg;
            }
        }
    }

    if (src0->type == GGML_TYPE_Q4_K && dsc->inter_size == 8 && NB_COLS == 8 &&
        dsc->param_type == GGML_TYPE_Q8_K) {
        // deepseek-cpu: the same for q4_K (Q4_K_M's experts): eight rows at a time while there are
        // eight, then four, through the q4_K GEMM, their q8_K rows gathered into its 4-row layout
        // (block_q8_Kx4, per-row partial sums included).
        const int64_t nbk  = ne10 / QK_K;
        const int64_t ncol = src0_cur_end - src0_cur_start;
        if (nr1 >= 4 && ne10 % QK_K == 0) {
            std::vector<block_q8_Kx4> xq;
            std::vector<float>        out;
            xq.resize(2 * nbk);
            while (ir1_first + 4 <= nr1) {
                const int nrg = ir1_first + 8 <= nr1 ? 8 : 4;
                const block_q8_K * rows[8];
                float *            dsts[8];
                for (int m = 0; m < nrg; m++) {
                    const ggml_dsc_mmid_row rm = MMID_MATRIX_ROW(cur_a, ir1_first + m);
                    rows[m] = (const block_q8_K *) ((const char *) wdata + ((rm.i1 % ne11) * nbw1 + rm.i2 * nbw2));
                    dsts[m] = (float *) ((char *) dst->data + (rm.i1 * nb1 + rm.i2 * nb2)) + src0_cur_start;
                }
                dsc_gather_q8_Kx4(rows, nrg, nbk, xq.data());
#if GGML_DSC_Q4_K_4U
                // each row's sums go straight to its token's slot of dst
                ggml_dsc_gemm_q4_K_rows(ne00, dsts, src0_cur + src0_cur_start * nb01, xq.data(), nrg, ncol);
#else
                out.resize(8 * ncol);
                dsc->gemm(ne00, out.data(), ncol, src0_cur + src0_cur_start * nb01,
                          xq.data(), nrg, ncol);
                for (int m = 0; m < nrg; m++) {
                    memcpy(dsts[m], out.data() + m * ncol, ncol * sizeof(float));
                }
#endif
                ir1_first += nrg;
            }
        }
    }
    return ir1_first;
#undef MMID_MATRIX_ROW
}

#if defined(__AVX2__)
// deepseek-cpu: q4_0 and q4_K (q6_K: below) weights that stay in the plain CPU buffer (3D weights such as DeepSeek's
// attn_v_b, which the repack buffer does not take, or any weight when the extra buffers are off) times a
// batch of rows: each thread repacks its columns to the 8-column layout once per call (~ one read of its
// slice) and runs them through the repacked GEMM, instead of tinyBLAS's 4x2 q4_0 tiles (~26 vs ~100
// GMAC/s per core on Zen 3) or the tiled q4_K kernel (~55). The caller has already quantized src1 to
// vec_dot_type rows (q8_0, q8_K) in wdata.
bool ggml_dsc_mul_mat_plain_repacked_fits(const struct ggml_compute_params * params, const struct ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    if (params->use_ref || (src0->type != GGML_TYPE_Q4_0 && src0->type != GGML_TYPE_Q4_K && src0->type != GGML_TYPE_Q6_K) ||
        src1->type != GGML_TYPE_F32) {
        return false;
    }
    return src1->ne[1] >= 16 && src0->ne[1] % 8 == 0 && src0->ne[0] % ggml_blck_size(src0->type) == 0 &&
           src0->ne[2] == 1 && src0->ne[3] == 1 && src1->ne[2] == 1 && src1->ne[3] == 1 &&
           src0->nb[1] == ggml_row_size(src0->type, src0->ne[0]);
}

static void dsc_gather_x4(const block_q8_0 * const * rows, int nrg, int64_t nb, block_q8_0x4 * out) { dsc_gather_q8_0x4(rows, nrg, nb, out); }
static void dsc_gather_x4(const block_q8_K * const * rows, int nrg, int64_t nb, block_q8_Kx4 * out) { dsc_gather_q8_Kx4(rows, nrg, nb, out); }
static block_q4_0x8 dsc_make_x8(block_q4_0 * in) { block_q4_0x8 out; ggml_dsc_make_block_q4_0x8(in, &out); return out; }
static block_q4_Kx8 dsc_make_x8(block_q4_K * in) { block_q4_Kx8 out; ggml_dsc_make_block_q4_Kx8(in, &out); return out; }

// W: the weight block, WX8: its 8-column repacked block, A: the activation row block, AX4: its 4-row layout
template <typename W, typename WX8, typename A, typename AX4>
static void dsc_mul_mat_plain_repacked(const struct ggml_compute_params * params, struct ggml_tensor * dst, const void * wdata,
                                       decltype(ggml_gemm_q4_0_8x8_q8_0) gemm, decltype(ggml_gemv_q4_0_8x8_q8_0) gemv) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS

    const int     ith = params->ith;
    const int     nth = params->nth;
    const int64_t nb  = ne00 / ggml_blck_size(src0->type);
    const size_t  row_size = nb * sizeof(A);

    // this thread's columns, in whole groups of 8
    const int64_t c0 = ((ith * ne01 / nth) + 7) / 8 * 8;
    const int64_t c1 = std::min<int64_t>(((ith + 1) * ne01 / nth + 7) / 8 * 8, ne01);
    if (c0 >= c1) {
        return;
    }
    const int64_t ncol = c1 - c0;

    std::vector<WX8> w((size_t) (ncol / 8) * nb);
    const W * src = (const W *) src0->data + c0 * nb;
    W tmp[8];
    for (int64_t g = 0; g < ncol / 8; g++) {
        for (int64_t x = 0; x < nb; x++) {
            for (int i = 0; i < 8; i++) {
                tmp[i] = src[(8 * g + i) * nb + x];
            }
            w[g * nb + x] = dsc_make_x8(tmp);
        }
    }

    // rows eight at a time while there are eight, then four, in the GEMM's interleaved activation layout;
    // the last one to three through the GEMV
    std::vector<AX4> xq((size_t) 2 * nb);
    const size_t bs = nb1 / sizeof(float);
    int64_t r = 0;
    while (r + 4 <= ne11) {
        const int nrg = r + 8 <= ne11 ? 8 : 4;
        const A * rows[8];
        for (int m = 0; m < nrg; m++) {
            rows[m] = (const A *) ((const char *) wdata + (r + m) * row_size);
        }
        dsc_gather_x4(rows, nrg, nb, xq.data());
        gemm((int) ne00, (float *) ((char *) dst->data + r * nb1) + c0, bs, w.data(), xq.data(), nrg, (int) ncol);
        r += nrg;
    }
    for (; r < ne11; r++) {
        gemv((int) ne00, (float *) ((char *) dst->data + r * nb1) + c0, bs, w.data(), (const char *) wdata + r * row_size, 1, (int) ncol);
    }
}

// q6_K (no stock x86 repacked layout): each thread unpacks its columns to block_q6_Kx8u and runs every
// row through ggml_dsc_gemm_q6_K_x8u, which reads the q8_K rows in place. ~55 GMAC/s per core for the
// tiled kernel this replaces (Q4_K_M's q6_K ffn_down_shexp).
static void dsc_mul_mat_plain_q6_K(const struct ggml_compute_params * params, struct ggml_tensor * dst, const void * wdata) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS

    const int     ith = params->ith;
    const int     nth = params->nth;
    const int64_t nb  = ne00 / QK_K;
    const size_t  row_size = nb * sizeof(block_q8_K);

    const int64_t c0 = ((ith * ne01 / nth) + 7) / 8 * 8;
    const int64_t c1 = std::min<int64_t>(((ith + 1) * ne01 / nth + 7) / 8 * 8, ne01);
    if (c0 >= c1) {
        return;
    }
    const int64_t ncol = c1 - c0;

    std::vector<block_q6_Kx8u> w((size_t) (ncol / 8) * nb);
    const block_q6_K * src = (const block_q6_K *) src0->data + c0 * nb;
    for (int64_t g = 0; g < ncol / 8; g++) {
        for (int64_t x = 0; x < nb; x++) {
            const block_q6_K * in[8];
            for (int i = 0; i < 8; i++) {
                in[i] = src + (8 * g + i) * nb + x;
            }
            ggml_dsc_make_q6_Kx8u(in, &w[g * nb + x]);
        }
    }

    for (int64_t r = 0; r < ne11; r += 8) {
        const int nr = (int) std::min<int64_t>(8, ne11 - r);
        float *            out[8];
        const block_q8_K * a[8];
        for (int m = 0; m < nr; m++) {
            out[m] = (float *) ((char *) dst->data + (r + m) * nb1) + c0;
            a[m]   = (const block_q8_K *) ((const char *) wdata + (r + m) * row_size);
        }
        ggml_dsc_gemm_q6_K_x8u((int) ne00, out, nr, w.data(), a, (int) ncol);
    }
}

// Returns false, on every thread alike, when the shapes do not fit (ggml_dsc_mul_mat_plain_repacked_fits).
bool ggml_dsc_mul_mat_plain_repacked(const struct ggml_compute_params * params, struct ggml_tensor * dst, const void * wdata) {
    if (!ggml_dsc_mul_mat_plain_repacked_fits(params, dst)) {
        return false;
    }
    if (dst->src[0]->type == GGML_TYPE_Q6_K) {
        dsc_mul_mat_plain_q6_K(params, dst, wdata);
    } else if (dst->src[0]->type == GGML_TYPE_Q4_0) {
        dsc_mul_mat_plain_repacked<block_q4_0, block_q4_0x8, block_q8_0, block_q8_0x4>(params, dst, wdata, ggml_gemm_q4_0_8x8_q8_0, ggml_gemv_q4_0_8x8_q8_0);
    } else {
        dsc_mul_mat_plain_repacked<block_q4_K, block_q4_Kx8, block_q8_K, block_q8_Kx4>(params, dst, wdata, ggml_gemm_q4_K_8x8_q8_K, ggml_gemv_q4_K_8x8_q8_K);
    }
    return true;
}
#endif
