#pragma once

// deepseek-cpu: the 6-bit scales and mins of block_q4_Kx8 decoded with shuffles, shared by the q4_K
// kernels in dsc/x86-repack.cpp (AVX2, AVX-512 VNNI) and dsc/amx-gemm.cpp (AMX). C++ only.

#if defined(__AVX2__)
#include <immintrin.h>
#include <cstdint>

// deepseek-cpu: block_q4_Kx8 holds one 12-byte scale group per sub-block, for its 8 columns: bytes 0-3
// scales 0-3 (6 bits), 4-7 mins 0-3, 8-11 the low 4 bits of scales 4-7 (low nibble) and of mins 4-7
// (high nibble); the top 2 bits of bytes 0-7 are the high bits of scales/mins 4-7. dec[i] gets
// sub-block i's scales of columns 0-7 (bytes 0-7) and mins (bytes 8-15). Decoded with shuffles: the
// stock scalar decode patches 4-byte words that the vector loads reading them back cannot forward
// from (~12% of the q4_K GEMM).
static inline void ggml_dsc_q4_K_decode_scales(const uint8_t * scales, __m128i dec[8]) {
    const __m128i dec_lo  = _mm_set_epi8(11, 10, 9, 8, 7, 6, 5, 4, 11, 10, 9, 8, 3, 2, 1, 0);  // byte with the low bits
    const __m128i dec_hi  = _mm_set_epi8(7, 6, 5, 4, -1, -1, -1, -1, 3, 2, 1, 0, -1, -1, -1, -1); // byte with the top 2
    const __m128i dec_m1  = _mm_set_epi8(0, 0, 0, 0, 63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63);
    const __m128i dec_m2  = _mm_set_epi8(15, 15, 15, 15, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m128i dec_top = _mm_set1_epi8((char) 0xC0);
    for (int i = 0; i < 8; i++) {
        // the last group's 16-byte load reads 4 bytes of qs, which follows scales in block_q4_Kx8
        const __m128i v  = _mm_loadu_si128((const __m128i *) (scales + 12 * i));
        const __m128i lo = _mm_shuffle_epi8(v, dec_lo);
        const __m128i hi = _mm_shuffle_epi8(v, dec_hi);
        dec[i] = _mm_or_si128(_mm_or_si128(_mm_and_si128(lo, dec_m1), _mm_and_si128(_mm_srli_epi16(lo, 4), dec_m2)),
                              _mm_srli_epi16(_mm_and_si128(hi, dec_top), 2));
    }
}
#endif
