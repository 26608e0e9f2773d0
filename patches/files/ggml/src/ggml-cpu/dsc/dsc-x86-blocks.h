#pragma once

// deepseek-cpu: small AVX2 pieces shared by the repacked-weight kernels (dsc/x86-repack.cpp: the one-row
// GEMVs and the GEMMs; dsc/x86-gemv-rows.cpp: the few-row GEMVs). C++ only.

#if defined(__AVX2__)
#include <immintrin.h>
#include <cstdint>
#include <cstring>

#include "dsc-q4k-scales.h"

// 4 activation bytes broadcast to all eight 32-bit lanes: they meet 8 columns x 4 k of a 4-byte interleave
static inline __m256i ggml_dsc_bcast4(const int8_t * p) {
    int32_t v;
    memcpy(&v, p, sizeof(v));
    return _mm256_set1_epi32(v);
}

// The q4_K GEMV's mins term: one activation row's mins x sub-block sums for the 8 columns of a
// super-block (int32, column order), from the decoded scales (dec[i] bytes 8-15: sub-block i's mins)
// and the row's 16 q8_K bsums.
static inline __m256i ggml_dsc_q4_K_row_mins(const __m128i dec[8], const int16_t * bsums) {
    // the row's 8 sub-block sums as int16; int32 lane p = (sum of sub-block 2p, of 2p+1)
    const __m256i ssum = _mm256_broadcastsi128_si256(_mm_hadd_epi16(
            _mm_loadu_si128((const __m128i *) bsums), _mm_loadu_si128((const __m128i *) (bsums + 8))));
    __m256i im = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_unpackhi_epi8(dec[0], dec[1])), _mm256_shuffle_epi32(ssum, 0x00));
    im = _mm256_add_epi32(im, _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_unpackhi_epi8(dec[2], dec[3])), _mm256_shuffle_epi32(ssum, 0x55)));
    im = _mm256_add_epi32(im, _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_unpackhi_epi8(dec[4], dec[5])), _mm256_shuffle_epi32(ssum, 0xAA)));
    im = _mm256_add_epi32(im, _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_unpackhi_epi8(dec[6], dec[7])), _mm256_shuffle_epi32(ssum, 0xFF)));
    return im;
}
#endif
