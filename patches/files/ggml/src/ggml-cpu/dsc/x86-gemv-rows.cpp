// deepseek-cpu: few-row GEMVs (2-4 activation rows) on the repacked q4_0 / q4_K layouts of AVX2 builds
// (make_block_q4_0x8 / make_block_q4_Kx8 with the 4-byte interleave, see dsc/x86-repack.cpp).
//
// Why: a speculative verify (MTP: the next token and 1-3 drafts) is a batch of 2-4 tokens. Stock
// repack code runs the GEMM only on whole groups of four rows and every other row through the one-row
// GEMV, so 2 tokens read every weight twice and cost ~1.8x one decode step. Decode streams weights
// from memory with arithmetic to spare, so these kernels unpack each weight load once and let the
// 2-4 rows meet it: one pass over the weights for the batch.
//
// Per row, the integer sums and the float steps (isum -> float, times d_w * d_a, one FMA per block in
// k order; q4_K's mins accumulated apart and subtracted at the end) are those of the one-row GEMVs in
// dsc/x86-repack.cpp, so every row's result is bit-identical to decoding it alone: a verified token
// sees exactly the logits a plain decode would have given it.
#define GGML_COMMON_IMPL_CPP
#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"
#include "ggml-backend-impl.h"

#include "ggml-impl.h"
#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "simd-mappings.h"
#include "traits.h"

#include "../repack.h"
#include "dsc-tuning.h"
#include "dsc-x86-blocks.h"

#if defined(__AVX2__)
// R rows a[r] (block_q8_0, n / 32 blocks each) x the nc / 8 column groups of vx; row r's sums at out[r]
template <int R>
static void gemv_q4_0_8x4u_rows(int n, float * const * out, const void * vx, const block_q8_0 * const * a, int nc) {
    const int nb = n / QK8_0;
    const block_q4_0x8 * w0 = (const block_q4_0x8 *) vx;

    const __m256i m4b     = _mm256_set1_epi8(0x0F);
    const __m256i ones_u8 = _mm256_set1_epi8(1);
    const __m256i ones16  = _mm256_set1_epi16(1);

    __m256i off[GGML_DSC_Q4_0_KCV][R]; // -8 * sum(activations) per block and row (unsigned nibbles)
    __m256  rsc[GGML_DSC_Q4_0_KCV][R]; // activation scale per block and row

    for (int b0 = 0; b0 < nb; b0 += GGML_DSC_Q4_0_KCV) {
        const int kc = MIN(nb - b0, GGML_DSC_Q4_0_KCV);

        for (int bb = 0; bb < kc; bb++) {
            for (int r = 0; r < R; r++) {
                const block_q8_0 & q = a[r][b0 + bb];
                const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones_u8, _mm256_loadu_si256((const __m256i *) q.qs)), ones16);
                __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
                t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
                t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
                off[bb][r] = _mm256_set1_epi32(-8 * _mm_cvtsi128_si32(t));
                rsc[bb][r] = _mm256_set1_ps(GGML_CPU_FP16_TO_FP32(q.d));
            }
        }

        for (int x = 0; x < nc / 8; x++) {
            const block_q4_0x8 * p = w0 + (int64_t) x * nb + b0;
            __m256 acc[R];
            for (int r = 0; r < R; r++) {
                acc[r] = b0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out[r] + 8 * x);
            }
            for (int bb = 0; bb < kc; bb++) {
                _mm_prefetch((const char *) &p[bb] + GGML_DSC_GEMV_PREFETCH, _MM_HINT_T0);
                _mm_prefetch((const char *) &p[bb] + GGML_DSC_GEMV_PREFETCH + 64, _MM_HINT_T0);
                // |8 maddubs pairs| <= 8 * 2 * 15 * 127 = 30480: the int16 sums do not overflow
                __m256i sum[R];
                for (int r = 0; r < R; r++) {
                    sum[r] = _mm256_setzero_si256();
                }
                for (int j = 0; j < 4; j++) {
                    const __m256i wv = _mm256_loadu_si256((const __m256i *) (p[bb].qs + 32 * j));
                    const __m256i lo = _mm256_and_si256(wv, m4b);                       // k 4j .. 4j+3
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), m4b); // k 16+4j .. 16+4j+3
                    for (int r = 0; r < R; r++) {
                        const int8_t * q = a[r][b0 + bb].qs;
                        sum[r] = _mm256_add_epi16(sum[r], _mm256_maddubs_epi16(lo, ggml_dsc_bcast4(q + 4 * j)));
                        sum[r] = _mm256_add_epi16(sum[r], _mm256_maddubs_epi16(hi, ggml_dsc_bcast4(q + 16 + 4 * j)));
                    }
                }
                const __m256 col_scale = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p[bb].d));
                for (int r = 0; r < R; r++) {
                    const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(sum[r], ones16), off[bb][r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(col_scale, rsc[bb][r]), acc[r]);
                }
            }
            for (int r = 0; r < R; r++) {
                _mm256_storeu_ps(out[r] + 8 * x, acc[r]);
            }
        }
    }
}
#endif

#if GGML_DSC_Q4_K_4U
// R rows a[r] (block_q8_K, n / 256 blocks each) x the nc / 8 column groups of vx; row r's sums at out[r]
template <int R>
static void gemv_q4_K_8x4u_rows(int n, float * const * out, const void * vx, const block_q8_K * const * a, int nc) {
    const int nb = n / QK_K;
    const block_q4_Kx8 * w0 = (const block_q4_Kx8 *) vx;

    const __m256i m4b  = _mm256_set1_epi8(0x0F);
    const __m128i rep2 = _mm_set_epi8(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0); // a column's scale over its two int16

    for (int x = 0; x < nc / 8; x++) {
        const block_q4_Kx8 * p = w0 + (int64_t) x * nb;
        __m256 acc[R], accm[R];
        for (int r = 0; r < R; r++) {
            acc[r]  = _mm256_setzero_ps();
            accm[r] = _mm256_setzero_ps();
        }
        for (int b = 0; b < nb; b++) {
            const block_q4_Kx8 & w = p[b];
            const char * pf = (const char *) &w + GGML_DSC_GEMV_PREFETCH;
            _mm_prefetch(pf, _MM_HINT_T0);
            _mm_prefetch(pf + 64, _MM_HINT_T0);

            __m128i dec[8];
            ggml_dsc_q4_K_decode_scales(w.scales, dec);

            __m256i isum[R];
            for (int r = 0; r < R; r++) {
                isum[r] = _mm256_setzero_si256();
            }
            for (int j = 0; j < 4; j++) {
                const uint8_t * q = w.qs + 256 * j;
                for (int l = 0; l < 4; l++) {
                    _mm_prefetch((const char *) q + GGML_DSC_GEMV_PREFETCH + 64 * l, _MM_HINT_T0);
                }
                __m256i slo[R], shi[R];
                for (int r = 0; r < R; r++) {
                    slo[r] = _mm256_setzero_si256();
                    shi[r] = _mm256_setzero_si256();
                }
                for (int t = 0; t < 8; t++) {
                    const __m256i v  = _mm256_loadu_si256((const __m256i *) (q + 32 * t));
                    const __m256i lo = _mm256_and_si256(v, m4b);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4b);
                    for (int r = 0; r < R; r++) {
                        const int8_t * ar = a[r][b].qs + 64 * j + 4 * t;
                        slo[r] = _mm256_add_epi16(slo[r], _mm256_maddubs_epi16(lo, ggml_dsc_bcast4(ar)));
                        shi[r] = _mm256_add_epi16(shi[r], _mm256_maddubs_epi16(hi, ggml_dsc_bcast4(ar + 32)));
                    }
                }
                const __m256i sc_lo = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(dec[2 * j], rep2));
                const __m256i sc_hi = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(dec[2 * j + 1], rep2));
                for (int r = 0; r < R; r++) {
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(slo[r], sc_lo));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(shi[r], sc_hi));
                }
            }

            const __m256 wd   = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w.d));
            const __m256 wmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w.dmin));
            for (int r = 0; r < R; r++) {
                const __m256i im    = ggml_dsc_q4_K_row_mins(dec, a[r][b].bsums);
                const __m256  row_d = _mm256_set1_ps(a[r][b].d);
                acc[r]  = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(wd, row_d), acc[r]);
                accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(wmin, row_d), accm[r]);
            }
        }
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(out[r] + 8 * x, _mm256_sub_ps(acc[r], accm[r]));
        }
    }
}
#endif

// deepseek-cpu: whether the few-row GEMVs take this repacked weight type and layout. They take 2 to
// GGML_DSC_GEMV_ROWS_MAX rows; one row goes to the one-row GEMV, whose several memory streams per
// thread (GGML_DSC_GEMV_STREAMS) make it the faster one there.
bool ggml_dsc_gemv_rows_fits(enum ggml_type type, int64_t nb_cols, int64_t inter_size) {
#if defined(__AVX2__)
    if (nb_cols == 8 && inter_size == 8 && type == GGML_TYPE_Q4_0) {
        return true;
    }
#endif
#if GGML_DSC_Q4_K_4U
    if (nb_cols == 8 && inter_size == 8 && type == GGML_TYPE_Q4_K) {
        return true;
    }
#endif
    GGML_UNUSED(type); GGML_UNUSED(nb_cols); GGML_UNUSED(inter_size);
    return false;
}

#if defined(__AVX2__)
template <typename A>
static void gemv_rows_dispatch(void (*const k[3])(int, float * const *, const void *, const A * const *, int),
                               int n, float * const * out, const void * vx, const void * const * a, int nr, int nc) {
    k[nr - 2](n, out, vx, (const A * const *) a, nc);
}
#endif

bool ggml_dsc_gemv_rows(enum ggml_type type, int64_t nb_cols, int64_t inter_size,
                        int n, float * const * out, const void * vx, const void * const * a, int nr, int nc) {
    if (nr < 2 || nr > GGML_DSC_GEMV_ROWS_MAX || nc % 8 != 0 || !ggml_dsc_gemv_rows_fits(type, nb_cols, inter_size)) {
        return false;
    }
#if defined(__AVX2__)
    if (type == GGML_TYPE_Q4_0) {
        static void (*const k[3])(int, float * const *, const void *, const block_q8_0 * const *, int) = {
            gemv_q4_0_8x4u_rows<2>, gemv_q4_0_8x4u_rows<3>, gemv_q4_0_8x4u_rows<4> };
        gemv_rows_dispatch(k, n, out, vx, a, nr, nc);
        return true;
    }
#endif
#if GGML_DSC_Q4_K_4U
    if (type == GGML_TYPE_Q4_K) {
        static void (*const k[3])(int, float * const *, const void *, const block_q8_K * const *, int) = {
            gemv_q4_K_8x4u_rows<2>, gemv_q4_K_8x4u_rows<3>, gemv_q4_K_8x4u_rows<4> };
        gemv_rows_dispatch(k, n, out, vx, a, nr, nc);
        return true;
    }
#endif
    GGML_UNUSED(n); GGML_UNUSED(out); GGML_UNUSED(vx); GGML_UNUSED(a);
    return false;
}

bool ggml_dsc_gemv_rows_strided(enum ggml_type type, int64_t nb_cols, int64_t inter_size,
                                int n, float * s, size_t s_stride, const void * vx, const void * vy, size_t vy_stride, int nr, int nc) {
    if (nr < 2 || nr > GGML_DSC_GEMV_ROWS_MAX) {
        return false;
    }
    float *      out[GGML_DSC_GEMV_ROWS_MAX];
    const void * a[GGML_DSC_GEMV_ROWS_MAX];
    for (int r = 0; r < nr; r++) {
        out[r] = (float *) ((char *) s + r * s_stride);
        a[r]   = (const char *) vy + r * vy_stride;
    }
    return ggml_dsc_gemv_rows(type, nb_cols, inter_size, n, out, vx, a, nr, nc);
}
