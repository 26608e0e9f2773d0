// deepseek-cpu: 2-4 activation columns times q6_K rows in the plain buffer (DeepSeek's output head in
// Q4_0 and Q4_K_M files, which no repacked layout takes on x86): a speculative verify's batch.
//
// Why: for a few columns stock code runs ggml_vec_dot_q6_K_q8_K once per row and column, unpacking
// every 6-bit weight again for each column; one decode step streams the head at memory speed, but a
// 2-token verify then cost 1.7x a decode step's head (V3 shapes, Zen 3), all of it unpacking. Here
// each weight block is unpacked once and meets the 2-4 columns.
//
// Per column the integer products land in the same int32 lanes as in the stock AVX2 vec_dot (same
// maddubs pairs, same scale madds; the int32 sums are exact in any order), and the float steps are
// its own (d = d_a * d_w, one FMA of d x lanes per block, the same 8-lane horizontal sum), so every
// column's value is bit-identical to the one-column path: a verified token's logits are a decode's.
#include "ggml-cpu-impl.h"
#include "ggml-cpu.h"
#include "quants.h"
#include "simd-mappings.h"
#include "dsc/dsc-mul-mat.h"

#if defined(__AVX2__)
#include <immintrin.h>

// scale group i's two 6-bit scales (bytes 2i, 2i+1 of the block's 16), each spread over 8 int16
static const uint8_t dsc_q6_K_scale_shuffle[8][16] = {
    { 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1 }, { 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3 },
    { 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5 }, { 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7 },
    { 8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9 }, { 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11 },
    { 12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13 }, { 14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15 },
};

// the stock AVX2 kernels' horizontal sum of 8 floats, in their order
static inline float dsc_hsum8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

// one q6_K row (nb blocks) against nc columns y[c] (q8_K), into out[c]. Always inlined with a constant nc
// (below), so the column loops unroll and the sums stay in registers: with nc a variable they went to
// memory and two columns took longer than stock's two vec_dot passes.
static inline __attribute__((always_inline)) void dsc_q6_K_row_cols(int nb, const block_q6_K * x, const block_q8_K * const * y, int nc, float * out) {
    const __m256i m3  = _mm256_set1_epi8(3);
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };

    for (int i = 0; i < nb; ++i) {
        const float    dw      = GGML_CPU_FP16_TO_FP32(x[i].d);
        const uint8_t * q4     = x[i].ql;
        const uint8_t * qh     = x[i].qh;
        const __m128i  scales  = _mm_loadu_si128((const __m128i *) x[i].scales);
        const __m256i  scales16 = _mm256_cvtepi8_epi16(scales);

        __m256i sumi[4];
        for (int c = 0; c < nc; ++c) {
            sumi[c] = _mm256_setzero_si256();
        }
        for (int j = 0; j < QK_K / 128; ++j) {
            const __m256i b1 = _mm256_loadu_si256((const __m256i *) (q4 + 64 * j));
            const __m256i b2 = _mm256_loadu_si256((const __m256i *) (q4 + 64 * j + 32));
            const __m256i bh = _mm256_loadu_si256((const __m256i *) (qh + 32 * j));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(b1, m15), _mm256_slli_epi16(_mm256_and_si256(bh, m3), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(b2, m15), _mm256_slli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(12)), 2));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m15), _mm256_and_si256(bh, _mm256_set1_epi8(48)));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m15),
                                   _mm256_srli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8((char) -64)), 2));
            for (int k = 0; k < 4; ++k) {
                const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, _mm_loadu_si128((const __m128i *) dsc_q6_K_scale_shuffle[4 * j + k])));
                for (int c = 0; c < nc; ++c) {
                    const __m256i a = _mm256_loadu_si256((const __m256i *) (y[c][i].qs + 128 * j + 32 * k));
                    sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q[k], a)));
                }
            }
        }
        for (int c = 0; c < nc; ++c) {
            // the 6-bit quants are stored + 32: 32 x scale x sum(activations) per 16-value group, from bsums
            const __m256i sub = _mm256_slli_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *) y[c][i].bsums), scales16), 5);
            const float d = y[c][i].d * dw;
            acc[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[c], sub)), acc[c]);
        }
    }
    for (int c = 0; c < nc; ++c) {
        out[c] = dsc_hsum8(acc[c]);
    }
}
#endif

bool ggml_dsc_mul_mat_few_cols(const struct ggml_compute_params * params, struct ggml_tensor * dst,
                               int64_t ir0_start, int64_t ir0_end, int64_t ir1_start, int64_t ir1_end,
                               const void * wdata, size_t row_size) {
#if defined(__AVX2__)
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];
    const int64_t nc = ir1_end - ir1_start;
    // 2D only, src1 converted to q8_K rows in wdata (contiguous, row_size apart)
    if (params->use_ref || src0->type != GGML_TYPE_Q6_K || src1->type != GGML_TYPE_F32 || nc < 2 || nc > 4 ||
        src0->ne[0] % QK_K != 0 || src0->ne[2] != 1 || src0->ne[3] != 1 || src1->ne[2] != 1 || src1->ne[3] != 1) {
        return false;
    }
    const int nb = (int) (src0->ne[0] / QK_K);
    const block_q8_K * y[4];
    float *            d[4];
    for (int64_t c = 0; c < nc; ++c) {
        y[c] = (const block_q8_K *) ((const char *) wdata + (ir1_start + c) * row_size);
        d[c] = (float *) ((char *) dst->data + (ir1_start + c) * dst->nb[1]);
    }
    for (int64_t r = ir0_start; r < ir0_end; ++r) {
        const block_q6_K * x = (const block_q6_K *) ((const char *) src0->data + r * src0->nb[1]);
        float v[4];
        switch (nc) {
            case 2:  dsc_q6_K_row_cols(nb, x, y, 2, v); break;
            case 3:  dsc_q6_K_row_cols(nb, x, y, 3, v); break;
            default: dsc_q6_K_row_cols(nb, x, y, 4, v); break;
        }
        for (int64_t c = 0; c < nc; ++c) {
            d[c][r] = v[c];
        }
    }
    return true;
#else
    GGML_UNUSED(params); GGML_UNUSED(dst); GGML_UNUSED(ir0_start); GGML_UNUSED(ir0_end);
    GGML_UNUSED(ir1_start); GGML_UNUSED(ir1_end); GGML_UNUSED(wdata); GGML_UNUSED(row_size);
    return false;
#endif
}
