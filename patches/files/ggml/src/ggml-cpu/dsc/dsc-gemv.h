#pragma once

// deepseek-cpu: declarations of the single-token GEMVs (dsc/x86-gemv.inc, compiled in arch/x86/quants.c)
// and of quantize_row_q8_K's AVX2 path (dsc/x86-quantize.c). Included by quants.h inside its extern "C"
// block; C and C++.

#include "dsc-tuning.h"

// true: y = quantize_row_q8_K(x) done here (AVX2 builds); false: the caller's reference runs
bool ggml_dsc_quantize_row_q8_K(const float * GGML_RESTRICT x, void * GGML_RESTRICT vy, int64_t k);

#if defined(__AVX2__)
// deepseek-cpu: s[r] = row r (of nr, bx bytes apart) . vy, bit-identical to ggml_vec_dot_q4_0_q8_0 /
// ggml_vec_dot_q5_0_q8_0 / ggml_vec_dot_q8_0_q8_0, for rows that ggml_dsc_gemv_fits (a multiple of 32 values, at most 512
// blocks: the column's per-block terms live on the stack)
static inline bool ggml_dsc_gemv_fits(int64_t n) {
    return n % QK8_0 == 0 && n / QK8_0 <= GGML_DSC_GEMV_MAX_BLOCKS;
}
void ggml_dsc_gemv_q4_0_q8_0(int n, int nr, float * GGML_RESTRICT s, const void * GGML_RESTRICT vx, size_t bx, const void * GGML_RESTRICT vy);
void ggml_dsc_gemv_q5_0_q8_0(int n, int nr, float * GGML_RESTRICT s, const void * GGML_RESTRICT vx, size_t bx, const void * GGML_RESTRICT vy);
void ggml_dsc_gemv_q8_0_q8_0(int n, int nr, float * GGML_RESTRICT s, const void * GGML_RESTRICT vx, size_t bx, const void * GGML_RESTRICT vy);
// the same for MXFP4 rows (ggml_vec_dot_mxfp4_q8_0): DeepSeek-V4's experts in the plain buffer
void ggml_dsc_gemv_mxfp4_q8_0(int n, int nr, float * GGML_RESTRICT s, const void * GGML_RESTRICT vx, size_t bx, const void * GGML_RESTRICT vy);
// s[r] = row r . vy, bit-identical to ggml_vec_dot_q3_K_q8_K, for any multiple of QK_K values (ds-q3's
// experts; AVX2 and AVX-512 VNNI blocks)
void ggml_dsc_gemv_q3_K_q8_K(int n, int nr, float * GGML_RESTRICT s, const void * GGML_RESTRICT vx, size_t bx, const void * GGML_RESTRICT vy);
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// deepseek-cpu: s[r] = row r . vy, bit-identical to ggml_vec_dot_q6_K_q8_K, for any multiple of QK_K values
void ggml_dsc_gemv_q6_K_q8_K(int n, int nr, float * GGML_RESTRICT s, const void * GGML_RESTRICT vx, size_t bx, const void * GGML_RESTRICT vy);
// the same for q2_K rows (ggml_vec_dot_q2_K_q8_K): the experts of ds-q2
void ggml_dsc_gemv_q2_K_q8_K(int n, int nr, float * GGML_RESTRICT s, const void * GGML_RESTRICT vx, size_t bx, const void * GGML_RESTRICT vy);
#endif
