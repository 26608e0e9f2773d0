// deepseek-cpu: quantize_row_q8_K for AVX2 builds, called first by quantize_row_q8_K (arch/x86/quants.c):
// true when done here.
#include "ggml-common.h"
#include "ggml-quants.h"
#include "ggml-impl.h"
#include "ggml-cpu.h"
#include "simd-mappings.h"

#include "../quants.h"
#include "../ggml-cpu-impl.h"

#include <string.h>
#include <assert.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

bool ggml_dsc_quantize_row_q8_K(const float * GGML_RESTRICT x, void * GGML_RESTRICT vy, int64_t k) {
#if defined(__AVX2__)

    // deepseek-cpu: every q4_K/q6_K product quantizes its activations to q8_K, and the scalar reference
    // took ~0.7% of a Q4_K_M DeepSeek-V2 prefill. The same steps, 8 lanes at a time, with the same
    // results byte for byte: the reference's max is the first value of largest |x| (found again by
    // comparing |x| with the vector maximum), its rounding (x * iscale + 1.5 * 2^23, then the low bits)
    // is round-half-to-even of the f32 product, which _mm256_round_ps does, and a NaN, which it
    // turns into 0, is masked to 0.
    assert(k % QK_K == 0);
    const int64_t nb = k / QK_K;
    block_q8_K * GGML_RESTRICT y = (block_q8_K *) vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);

    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        __m256 vmax = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) {
            // max_ps returns its second operand when either is NaN, so NaNs never become the maximum
            vmax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), vmax);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (!amax) {
            y[i].d = 0;
            memset(y[i].qs, 0, QK_K);
            memset(y[i].bsums, 0, sizeof(y[i].bsums));
            continue;
        }
        float max = 0;
        const __m256 vamax = _mm256_set1_ps(amax);
        for (int j = 0; j < QK_K; j += 8) {
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), vamax, _CMP_EQ_OQ));
            if (hit) {
                max = x[j + __builtin_ctz(hit)];
                break;
            }
        }
        const float iscale = -127.f/max;
        const __m256 vis = _mm256_set1_ps(iscale);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            for (int u = 0; u < 4; u++) {
                const __m256 v = _mm256_mul_ps(vis, _mm256_loadu_ps(x + j + 8*u));
                const __m256 r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                q[u] = _mm256_andnot_si256(_mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)), _mm256_cvtps_epi32(r));
                q[u] = _mm256_min_epi32(q[u], _mm256_set1_epi32(127));
            }
            // packs interleave the 128-bit lanes: bytes come out as dwords 0,2,4,6,1,3,5,7 of 8 elements each
            const __m256i p = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])), perm);
            _mm256_storeu_si256((__m256i *) (y[i].qs + j), p);
            // sums of the two 16-value groups: 8 sums of 4, then within each 128-bit lane
            __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16);
            s = _mm256_hadd_epi32(s, s);
            s = _mm256_hadd_epi32(s, s);
            y[i].bsums[j/16 + 0] = (int16_t) _mm256_extract_epi32(s, 0);
            y[i].bsums[j/16 + 1] = (int16_t) _mm256_extract_epi32(s, 4);
        }
        y[i].d = 1/iscale;
    }
    return true;
#else
    GGML_UNUSED(x); GGML_UNUSED(vy); GGML_UNUSED(k);
    return false;
#endif
}
