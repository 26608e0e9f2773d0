// deepseek-cpu: tiled flash attention for f32 q over f32 or f16 K and V (MLA prefill through decompressed
// K/V; DeepSeek-V4's prompts over its f16 cache, with attention sinks), x86 AVX2 + FMA. Called from
// ggml_compute_forward_flash_attn_ext_f16 (ops.cpp).

#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "common.h"
#include "simd-mappings.h"
#include "ops.h"
#include "dsc-f32-tile.h"
#include "dsc/fa-exp.h"
#include "dsc/dsc-ops.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__)
// deepseek-cpu: tiled flash attention for f32 q, K and V (MLA prefill through decompressed K/V).
// The stock tiled kernel packs every K tile transposed with scalar stores and converts the mask with
// scalar code for every (query tile, key tile) pair: ~30% of its time for DK = 192. Here both products
// keep the query tile as the SIMD dimension, so K and V are read in place as broadcast operands:
//   S^T[k][q]  = sum_d K[k][d] * Qs^T[d][q]   (Qs = scale*Q, transposed once per query tile)
//   O^T[v][q] += sum_k V[k][v] * P^T[k][q]
// and the online softmax runs down the key rows, 8 queries per vector. Key tiles whose mask rows are
// all -inf are skipped, all-zero mask tiles are not added. O^T is transposed into dst once per tile.
// An f16 K (V) tile is converted to f32 once per (query tile, key tile) it is used in: 1/QT of the
// tile's multiply-adds; K and V that are one tensor (V4's shared K/V head) are converted once. Scores,
// sums and outputs stay in f32 (stock code accumulates V in f16 for an f16 cache). Sinks as stock.

// GGML_DSC_FA_QT queries per tile (the SIMD dimension, 8 vectors), GGML_DSC_FA_KT keys per tile: dsc/dsc-tuning.h
// (e^x: dsc_fa_exp_nonpos, dsc/fa-exp.h)

// C[RM rows][16] (row stride GGML_DSC_FA_QT) (+)= sum_kk A(i, kk) * B[kk][16] (row stride GGML_DSC_FA_QT),
// A(i, kk) = A[i*a_si + kk*a_sk]; ZERO: C starts at 0 instead of being read
template <int RM, bool ZERO>
static inline void dsc_fa_ukernel(float * GGML_RESTRICT C, const float * GGML_RESTRICT A, int64_t a_si, int64_t a_sk,
                                  const float * GGML_RESTRICT B, int K) {
    dsc_f32_tile(RM, C, GGML_DSC_FA_QT, A, a_si, a_sk, B, GGML_DSC_FA_QT, K, ZERO);
}

// C[M][GGML_DSC_FA_QT] (+)= A(M x K) * B[K][GGML_DSC_FA_QT], in 6-row x 16-column register tiles
template <bool ZERO>
static void dsc_fa_gemm(float * GGML_RESTRICT C, const float * GGML_RESTRICT A, int64_t a_si, int64_t a_sk,
                        const float * GGML_RESTRICT B, int M, int K) {
    for (int n = 0; n < GGML_DSC_FA_QT; n += 16) {
        int i = 0;
        for (; i + 6 <= M; i += 6) {
            dsc_fa_ukernel<6, ZERO>(C + i*GGML_DSC_FA_QT + n, A + i*a_si, a_si, a_sk, B + n, K);
        }
        switch (M - i) {
            case 5: dsc_fa_ukernel<5, ZERO>(C + i*GGML_DSC_FA_QT + n, A + i*a_si, a_si, a_sk, B + n, K); break;
            case 4: dsc_fa_ukernel<4, ZERO>(C + i*GGML_DSC_FA_QT + n, A + i*a_si, a_si, a_sk, B + n, K); break;
            case 3: dsc_fa_ukernel<3, ZERO>(C + i*GGML_DSC_FA_QT + n, A + i*a_si, a_si, a_sk, B + n, K); break;
            case 2: dsc_fa_ukernel<2, ZERO>(C + i*GGML_DSC_FA_QT + n, A + i*a_si, a_si, a_sk, B + n, K); break;
            case 1: dsc_fa_ukernel<1, ZERO>(C + i*GGML_DSC_FA_QT + n, A + i*a_si, a_si, a_sk, B + n, K); break;
            default: break;
        }
    }
}

// 0: anything else (add the mask); 1: all +0 (nothing to add); 2: all -inf (skip the tile).
// On the f16 bit patterns: all equal to x iff their AND and their OR are both x.
static int dsc_fa_mask_kind(const ggml_fp16_t * const * rows, int nrows, int64_t ic, int kv_tile) {
    __m256i v_or = _mm256_setzero_si256(), v_and = _mm256_set1_epi16(-1);
    uint16_t s_or = 0, s_and = 0xffff;
    for (int r = 0; r < nrows; r++) {
        const ggml_fp16_t * m = rows[r] + ic;
        int k = 0;
        for (; k + 16 <= kv_tile; k += 16) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(m + k));
            v_or  = _mm256_or_si256(v_or, v);
            v_and = _mm256_and_si256(v_and, v);
        }
        for (; k < kv_tile; k++) {
            s_or  |= m[k];
            s_and &= m[k];
        }
    }
    alignas(32) uint16_t o[16], a[16];
    _mm256_store_si256((__m256i *) o, v_or);
    _mm256_store_si256((__m256i *) a, v_and);
    for (int i = 0; i < 16; i++) {
        s_or  |= o[i];
        s_and &= a[i];
    }
    if (s_or == 0) {
        return 1;
    }
    return s_or == 0xfc00 && s_and == 0xfc00 ? 2 : 0; // 0xfc00: f16 -inf
}

// T: the K/V element type (float: read in place; ggml_fp16_t: converted a tile at a time)
template <typename T>
static void dsc_fa_tiled(
        const ggml_compute_params * params,
        ggml_tensor * dst,
        int64_t ir0, int64_t ir1) {
    const ggml_tensor * q     = dst->src[0];
    const ggml_tensor * k     = dst->src[1];
    const ggml_tensor * v     = dst->src[2];
    const ggml_tensor * mask  = dst->src[3];
    const ggml_tensor * sinks = dst->src[4];

    GGML_TENSOR_LOCALS(int64_t, neq, q,   ne)
    GGML_TENSOR_LOCALS(size_t,  nbq, q,   nb)
    GGML_TENSOR_LOCALS(int64_t, nek, k,   ne)
    GGML_TENSOR_LOCALS(size_t,  nbk, k,   nb)
    GGML_TENSOR_LOCALS(int64_t, nev, v,   ne)
    GGML_TENSOR_LOCALS(size_t,  nbv, v,   nb)
    GGML_TENSOR_LOCALS(int64_t, ne,  dst, ne)
    GGML_TENSOR_LOCALS(size_t,  nb,  dst, nb)

    const int64_t DK = nek0;
    const int64_t DV = nev0;

    float scale = 1.0f;
    memcpy(&scale, (float *) dst->op_params + 0, sizeof(float));

    const int64_t rk2 = neq2/nek2, rk3 = neq3/nek3;
    const int64_t rv2 = neq2/nev2, rv3 = neq3/nev3;

    // same per-thread stride as the stock tiled kernel (the planner sizes wdata for that one); ours
    // fits in it with room for one f32 K tile and one V tile
    static_assert(GGML_DSC_FA_QT <= GGML_FA_TILE_Q && GGML_DSC_FA_KT <= GGML_FA_TILE_KV,
                  "the tiles must fit the planner's scratch");
    const size_t stride = GGML_FA_TILE_Q*DK + 2*GGML_FA_TILE_Q*GGML_FA_TILE_KV + GGML_FA_TILE_Q*DV +
                          GGML_FA_TILE_KV*DV + GGML_FA_TILE_KV*DK + CACHE_LINE_SIZE_F32;
    float * QsT = (float *) params->wdata + params->ith*stride; // [DK][QT]
    float * ST  = QsT + DK*GGML_DSC_FA_QT;                             // [KT][QT]
    float * OT  = ST  + GGML_DSC_FA_KT*GGML_DSC_FA_QT;                      // [DV][QT]
    float * Mx  = OT  + DV*GGML_DSC_FA_QT;                             // [QT] running max
    float * L   = Mx  + GGML_DSC_FA_QT;                                // [QT] running sum
    float * Kf  = L   + GGML_DSC_FA_QT;                                // [KT][DK] an f16 K tile in f32
    float * Vf  = Kf  + GGML_DSC_FA_KT*DK;                             // [KT][DV] an f16 V tile in f32

    constexpr bool f16 = std::is_same<T, ggml_fp16_t>::value;
    // V4 passes one tensor as K and V: its converted K tile serves as the V tile
    const bool v_is_k = f16 && v->data == k->data && nbv1 == nbk1 && nbv2 == nbk2 && nbv3 == nbk3 && DV <= DK;
    const int64_t k_row = f16 ? DK : (int64_t) (nbk1/sizeof(float));
    const int64_t v_row = f16 ? (v_is_k ? DK : DV) : (int64_t) (nbv1/sizeof(float));

    int64_t ir = ir0;
    while (ir < ir1) {
        const int64_t iq3 = ir/(neq2*neq1);
        const int64_t iq2 = (ir - iq3*neq2*neq1)/neq1;
        const int64_t iq1 = ir - iq3*neq2*neq1 - iq2*neq1;
        const int tile_rows = (int) MIN((int64_t) GGML_DSC_FA_QT, MIN(ir1 - ir, neq1 - iq1));

        // Qs^T, zero columns past the tile's queries
        for (int64_t d = 0; d < DK; d++) {
            memset(QsT + d*GGML_DSC_FA_QT + tile_rows, 0, (GGML_DSC_FA_QT - tile_rows)*sizeof(float));
        }
        for (int tq = 0; tq < tile_rows; tq++) {
            const float * pq = (const float *) ((const char *) q->data + (iq1 + tq)*nbq1 + iq2*nbq2 + iq3*nbq3);
            for (int64_t d = 0; d < DK; d++) {
                QsT[d*GGML_DSC_FA_QT + tq] = pq[d]*scale;
            }
        }
        memset(OT, 0, DV*GGML_DSC_FA_QT*sizeof(float));
        for (int tq = 0; tq < GGML_DSC_FA_QT; tq++) {
            Mx[tq] = -INFINITY;
            L[tq]  = 0.0f;
        }

        const ggml_fp16_t * mrows[GGML_DSC_FA_QT];
        if (mask) {
            for (int tq = 0; tq < tile_rows; tq++) {
                mrows[tq] = (const ggml_fp16_t *) ((const char *) mask->data + (iq1 + tq)*mask->nb[1] +
                            (iq2%mask->ne[2])*mask->nb[2] + (iq3%mask->ne[3])*mask->nb[3]);
            }
        }

        const char * kh = (const char *) k->data + (iq2/rk2)*nbk2 + (iq3/rk3)*nbk3;
        const char * vh = (const char *) v->data + (iq2/rv2)*nbv2 + (iq3/rv3)*nbv3;

        for (int64_t ic = 0; ic < nek1; ic += GGML_DSC_FA_KT) {
            const int kv_tile = (int) MIN((int64_t) GGML_DSC_FA_KT, nek1 - ic);

            const int kind = mask ? dsc_fa_mask_kind(mrows, tile_rows, ic, kv_tile) : 1;
            if (kind == 2) {
                continue;
            }

            const float * kt;
            const float * vt;
            if constexpr (f16) {
                for (int tk = 0; tk < kv_tile; tk++) {
                    ggml_cpu_fp16_to_fp32((const ggml_fp16_t *) (kh + (ic + tk)*nbk1), Kf + tk*DK, DK);
                }
                if (!v_is_k) {
                    for (int tk = 0; tk < kv_tile; tk++) {
                        ggml_cpu_fp16_to_fp32((const ggml_fp16_t *) (vh + (ic + tk)*nbv1), Vf + tk*DV, DV);
                    }
                }
                kt = Kf;
                vt = v_is_k ? Kf : Vf;
            } else {
                kt = (const float *) (kh + ic*nbk1);
                vt = (const float *) (vh + ic*nbv1);
            }

            // S^T = K_tile Qs^T
            dsc_fa_gemm<true>(ST, kt, k_row, 1, QsT, kv_tile, (int) DK);

            if (kind == 0) {
                for (int tq = 0; tq < tile_rows; tq++) {
                    const ggml_fp16_t * m = mrows[tq] + ic;
                    for (int tk = 0; tk < kv_tile; tk++) {
                        ST[tk*GGML_DSC_FA_QT + tq] += GGML_CPU_FP16_TO_FP32(m[tk]);
                    }
                }
            }

            // online softmax down the key rows, 8 queries at a time
            for (int tq = 0; tq < GGML_DSC_FA_QT; tq += 8) {
                __m256 mx = _mm256_set1_ps(-INFINITY);
                for (int tk = 0; tk < kv_tile; tk++) {
                    mx = _mm256_max_ps(mx, _mm256_loadu_ps(ST + tk*GGML_DSC_FA_QT + tq));
                }
                const __m256 m_old = _mm256_loadu_ps(Mx + tq);
                const __m256 m_new = _mm256_max_ps(m_old, mx);
                // a query with every key so far masked keeps M = -inf; subtract 0 there, so its
                // exponentials are exp(-inf) = 0 instead of NaN
                const __m256 m_use = _mm256_andnot_ps(_mm256_cmp_ps(m_new, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ), m_new);
                const __m256 alpha = dsc_fa_exp_nonpos(_mm256_sub_ps(m_old, m_use));
                __m256 sum = _mm256_setzero_ps();
                for (int tk = 0; tk < kv_tile; tk++) {
                    float * s = ST + tk*GGML_DSC_FA_QT + tq;
                    const __m256 p = dsc_fa_exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(s), m_use));
                    _mm256_storeu_ps(s, p);
                    sum = _mm256_add_ps(sum, p);
                }
                _mm256_storeu_ps(Mx + tq, m_new);
                _mm256_storeu_ps(L + tq, _mm256_fmadd_ps(_mm256_loadu_ps(L + tq), alpha, sum));
                if (_mm256_movemask_ps(_mm256_cmp_ps(alpha, _mm256_set1_ps(1.0f), _CMP_NEQ_UQ))) {
                    for (int64_t d = 0; d < DV; d++) {
                        float * o = OT + d*GGML_DSC_FA_QT + tq;
                        _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_loadu_ps(o), alpha));
                    }
                }
            }

            // O^T += V_tile^T P^T
            dsc_fa_gemm<false>(OT, vt, 1, v_row, ST, (int) DV, kv_tile);
        }

        // a sink: one more logit in each head's softmax, with no value (as stock code)
        if (sinks) {
            const float s = ((const float *) sinks->data)[iq2];
            for (int tq = 0; tq < tile_rows; tq++) {
                if (s > Mx[tq]) {
                    const float ms = expf(Mx[tq] - s);
                    for (int64_t d = 0; d < DV; d++) {
                        OT[d*GGML_DSC_FA_QT + tq] *= ms;
                    }
                    L[tq] = L[tq]*ms + 1.0f;
                } else {
                    L[tq] += expf(s - Mx[tq]);
                }
            }
        }

        for (int tq = 0; tq < tile_rows; tq++) {
            const float l_inv = L[tq] == 0.0f ? 0.0f : 1.0f/L[tq];
            const int64_t i1 = iq1 + tq;
            // permute(0, 2, 1, 3)
            float * out = (float *) ((char *) dst->data + (iq3*ne2*ne1 + iq2 + i1*ne1)*nb1);
            for (int64_t d = 0; d < DV; d++) {
                out[d] = OT[d*GGML_DSC_FA_QT + tq]*l_inv;
            }
        }

        ir += tile_rows;
    }
}

void ggml_dsc_flash_attn_ext_f32_tiled(
        const ggml_compute_params * params,
        ggml_tensor * dst,
        int64_t ir0, int64_t ir1) {
    if (dst->src[1]->type == GGML_TYPE_F16) {
        dsc_fa_tiled<ggml_fp16_t>(params, dst, ir0, ir1);
    } else {
        dsc_fa_tiled<float>(params, dst, ir0, ir1);
    }
}

// deepseek-cpu: f32 q over f32 or f16 K/V (both one type) without ALiBi or softcap, sinks in f32, go to
// the tiled kernel from GGML_DSC_FA_MIN_Q queries on (below that, the untiled kernel)
bool ggml_dsc_flash_attn_ext_f32_tiled_ok(const ggml_compute_params * params, const ggml_tensor * dst) {
    const ggml_tensor * q     = dst->src[0];
    const ggml_tensor * k     = dst->src[1];
    const ggml_tensor * v     = dst->src[2];
    const ggml_tensor * sinks = dst->src[4];
    const int64_t neq1 = q->ne[1];
    const bool use_ref = params->use_ref;

    const float * fa_params = (const float *) dst->op_params;
    const bool use_dsc = !use_ref && neq1 >= GGML_DSC_FA_MIN_Q && q->type == GGML_TYPE_F32 &&
                         (k->type == GGML_TYPE_F32 || k->type == GGML_TYPE_F16) && v->type == k->type &&
                         fa_params[1] == 0.0f && fa_params[2] == 0.0f &&
                         (sinks == nullptr || (sinks->type == GGML_TYPE_F32 && sinks->ne[0] >= q->ne[2])) &&
                         (dst->src[3] == nullptr || dst->src[3]->type == GGML_TYPE_F16);
    return use_dsc;
}
#else
bool ggml_dsc_flash_attn_ext_f32_tiled_ok(const ggml_compute_params * params, const ggml_tensor * dst) {
    GGML_UNUSED(params);
    GGML_UNUSED(dst);
    return false;
}

void ggml_dsc_flash_attn_ext_f32_tiled(const ggml_compute_params * params, ggml_tensor * dst, int64_t ir0, int64_t ir1) {
    GGML_UNUSED(params);
    GGML_UNUSED(dst);
    GGML_UNUSED(ir0);
    GGML_UNUSED(ir1);
    GGML_ABORT("unreachable: ggml_dsc_flash_attn_ext_f32_tiled_ok is false in this build");
}
#endif // __AVX2__ && __FMA__
