#pragma once

// deepseek-cpu: the vector e^x of our flash attention kernels (dsc/flash-attn-f32.cpp, dsc/mla-attention.cpp)

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

// e^x for x <= 0; exactly 0 below -87 (and for -inf). Degree-7 Taylor on |g| <= ln2/2: ~1e-7 relative.
static inline __m256 dsc_fa_exp_nonpos(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 xc = _mm256_max_ps(x, lo);
    const __m256 n  = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 g = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    g = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), g);
    __m256 p = _mm256_set1_ps(1.0f/5040);
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(1.0f/720));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(1.0f/120));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(1.0f/24));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(1.0f/6));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), r);
}
#endif
