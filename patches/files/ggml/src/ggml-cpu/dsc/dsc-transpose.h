#pragma once

// deepseek-cpu: the 8 x 8 transpose of 32-bit groups that puts 8 weight rows side by side, 4 bytes of
// each per vector (the q5_0/q8_0 re-layout in dsc/mul-mat-id-experts.c, the q6_K unpacking in
// dsc/x86-repack.cpp), shared by C and C++: o[c] gets dword c of v[0..7], v[r]'s in lane r.

#if defined(__AVX2__)
#include <immintrin.h>

static inline __attribute__((always_inline)) void dsc_store_transpose8x8_epi32(__m256i * o, const __m256i * v) {
    const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(v[4], v[5]), t5 = _mm256_unpackhi_epi32(v[4], v[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(v[6], v[7]), t7 = _mm256_unpackhi_epi32(v[6], v[7]);
    // u0 holds dwords 0 (low lane) and 4 (high lane) of v[0..3], u4 the same of v[4..7], ...
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(u0, u4, 0x20));
    _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(u1, u5, 0x20));
    _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(u2, u6, 0x20));
    _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(u3, u7, 0x20));
    _mm256_storeu_si256(o + 4, _mm256_permute2x128_si256(u0, u4, 0x31));
    _mm256_storeu_si256(o + 5, _mm256_permute2x128_si256(u1, u5, 0x31));
    _mm256_storeu_si256(o + 6, _mm256_permute2x128_si256(u2, u6, 0x31));
    _mm256_storeu_si256(o + 7, _mm256_permute2x128_si256(u3, u7, 0x31));
}
#endif
