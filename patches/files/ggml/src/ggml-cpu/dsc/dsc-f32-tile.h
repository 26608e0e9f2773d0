#pragma once

// deepseek-cpu: the f32 outer-product register tile of the x86 flash attention (dsc/flash-attn-f32.cpp)
// and of the f32 x f32 GEMM (dsc/f32-gemm.c), shared by C and C++:
//   C[i][0..15] (+)= sum_kk A[i*a_si + kk*a_sk] * B[kk*ldb + 0..15],  i < rm <= DSC_F32_TILE_MR
// The output columns are the SIMD dimension, so A's values are broadcasts (load-pipe uops) and a
// 6 x 16 tile takes 2 B vectors per 12 FMAs, with no horizontal reduction. zero: C starts at 0
// instead of being read. Always inlined, so constant rm and strides fold into the loop.

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#define DSC_F32_TILE_MR 6

static inline __attribute__((always_inline)) void dsc_f32_tile(const int rm, float * GGML_RESTRICT C, const int64_t ldc,
        const float * GGML_RESTRICT A, const int64_t a_si, const int64_t a_sk,
        const float * GGML_RESTRICT B, const int64_t ldb, const int kc, const bool zero) {
    __m256 c[DSC_F32_TILE_MR][2];
    for (int i = 0; i < rm; i++) {
        c[i][0] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(C + i*ldc);
        c[i][1] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(C + i*ldc + 8);
    }
    for (int kk = 0; kk < kc; kk++) {
        const __m256 b0 = _mm256_loadu_ps(B + kk*ldb);
        const __m256 b1 = _mm256_loadu_ps(B + kk*ldb + 8);
        for (int i = 0; i < rm; i++) {
            const __m256 a = _mm256_broadcast_ss(A + i*a_si + kk*a_sk);
            c[i][0] = _mm256_fmadd_ps(a, b0, c[i][0]);
            c[i][1] = _mm256_fmadd_ps(a, b1, c[i][1]);
        }
    }
    for (int i = 0; i < rm; i++) {
        _mm256_storeu_ps(C + i*ldc,     c[i][0]);
        _mm256_storeu_ps(C + i*ldc + 8, c[i][1]);
    }
}
#endif
