#pragma once

// deepseek-cpu: declarations of our repacked-weight code (dsc/x86-repack.cpp, dsc/repack-dsc.cpp), for
// the hooks in repack.cpp and arch/x86/repack.cpp. Included by repack.h inside its extern "C" block
// (C++ only, as repack.h is).

// deepseek-cpu: x86 builds with AVX2 (AVX-512 ones too) store repacked q4_K quants in a 4-byte
// interleave (make_block_q4_Kx8), which only their kernels (dsc/x86-repack.cpp) read. The 4-byte
// kernels were faster than stock's AVX-512 q4_K GEMM on Zen 4 as well.
#if defined(__AVX2__)
#define GGML_DSC_Q4_K_4U 1
#else
#define GGML_DSC_Q4_K_4U 0
#endif

struct ggml_compute_params;

// the first call of the stock x86 q4_0 / q4_K 8x8 kernels: true when done here (the 4-byte interleave
// AVX2 builds repack to), false elsewhere (the stock code runs)
bool ggml_dsc_gemv_q4_0_8x8_q8_0(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc);
bool ggml_dsc_gemm_q4_0_8x8_q8_0(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc);
bool ggml_dsc_gemv_q4_K_8x8_q8_K(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc);
bool ggml_dsc_gemm_q4_K_8x8_q8_K(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc);
bool ggml_dsc_gemv_mxfp4_8x8_q8_0(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc);
bool ggml_dsc_gemm_mxfp4_8x8_q8_0(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc);

// make_block_q4_0x8's AVX2 layout: qs of the 8 blocks in (scales already set) into out
void ggml_dsc_interleave_q4_0x8_4u(const block_q4_0 * in, block_q4_0x8 * out);
// make_block_mxfp4x8's AVX2 layout: the same interleave of the 8 blocks' nibbles (exponents already set)
void ggml_dsc_interleave_mxfp4x8_4u(const block_mxfp4 * in, block_mxfp4x8 * out);
// repack.cpp's make_block_q4_0x8 / make_block_q4_Kx8 (interleave 8), for the plain-buffer GEMM
void ggml_dsc_make_block_q4_0x8(block_q4_0 * in, block_q4_0x8 * out);
void ggml_dsc_make_block_q4_Kx8(block_q4_K * in, block_q4_Kx8 * out);

// what the repacked MUL_MAT_ID (forward_mul_mat_id in repack.cpp) hands its expert hooks
struct ggml_dsc_mmid_row {  // its mmid_row_mapping
    int32_t i1;
    int32_t i2;
};
typedef void (*ggml_dsc_gemx_t)(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
struct ggml_dsc_mmid {
    const struct ggml_compute_params * params;
    const struct ggml_tensor * src0;
    const struct ggml_tensor * ids;
    const struct ggml_tensor * dst;
    const char * wdata;                  // src1 in PARAM_TYPE rows, nbw1 apart, planes nbw2 apart
    size_t nbw1;
    size_t nbw2;
    const int64_t * row_counts;          // [n_as]
    const struct ggml_dsc_mmid_row * rows; // [n_as][ne12]
    int64_t nb_cols;                     // NB_COLS
    int64_t inter_size;                  // INTER_SIZE
    enum ggml_type param_type;           // PARAM_TYPE
    ggml_dsc_gemx_t gemv;                // gemv<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>
    ggml_dsc_gemx_t gemm;                // gemm<...>
};
// before the barrier (thread 0 sets the chunk counter): whether the one-token path runs
bool ggml_dsc_mmid_one_token_begin(const struct ggml_dsc_mmid * dsc);
// after it: the used experts' rows in chunks the threads take as they ask; false when no expert got a row
bool ggml_dsc_mmid_one_token(const struct ggml_dsc_mmid * dsc);
// expert cur_a's rows 8 or 4 at a time through the GEMM; returns how many (the rest go through the GEMV)
int64_t ggml_dsc_mmid_expert_gemm(const struct ggml_dsc_mmid * dsc, int cur_a, int64_t src0_cur_start, int64_t src0_cur_end);

#if defined(__AVX2__)
// deepseek-cpu: q4_0, q4_K and q6_K weights from the plain buffer through the repacked GEMM (also declared in
// ggml-cpu.c, which cannot include this header)
bool ggml_dsc_mul_mat_plain_repacked_fits(const struct ggml_compute_params * params, const struct ggml_tensor * dst);
bool ggml_dsc_mul_mat_plain_repacked(const struct ggml_compute_params * params, struct ggml_tensor * dst, const void * wdata);
#endif

#if defined(__AVX2__)
// deepseek-cpu: the repacked q4_0 (4-byte interleave) and q4_K GEMMs with each activation row's output
// at its own address (MUL_MAT_ID writes every row straight into its token's slot of dst)
void ggml_dsc_gemm_q4_0_rows(int n, float * const * rows, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc);
#endif
#if defined(__AVX2__)
// deepseek-cpu: 8 columns (weight rows) of q6_K over one super-block, unpacked for the AVX2 GEMM: qs
// vector t holds k 4t..4t+3 of the 8 columns as q - 32 (signed bytes), scales[j] the 8 columns' scales of
// 16-value group j, d their super-block scales, corr their 128 * sum_j scale_j * sum(q - 32 over group j)
// (the GEMM multiplies q - 32 by activations + 128, unsigned, and takes this back off).
struct block_q6_Kx8u {
    float   d[8];
    int32_t corr[8];
    int8_t  scales[16 * 8];
    int8_t  qs[QK_K * 8];
};
void ggml_dsc_make_q6_Kx8u(const block_q6_K * const * in, block_q6_Kx8u * out);
// out[r] + 8 x: row r's sums for columns 8 x .. 8 x + 7 (W: nc / 8 groups of n / QK_K blocks); a[r]: row r's q8_K blocks
void ggml_dsc_gemm_q6_K_x8u(int n, float * const * out, int nr, const block_q6_Kx8u * W, const block_q8_K * const * a, int nc);
#endif
#if GGML_DSC_Q4_K_4U
void ggml_dsc_gemm_q4_K_rows(int n, float * const * rows, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc);
#endif

// deepseek-cpu: 2 .. GGML_DSC_GEMV_ROWS_MAX activation rows times repacked q4_0 / q4_K weights in one pass
// over the weights (dsc/x86-gemv-rows.cpp): a speculative verify's 1 + 1..3 draft tokens. a[r]: row r in
// the layout's vec_dot_type (block_q8_0 / block_q8_K), its sums at out[r]. False: no kernel for this
// type, layout or row count (the caller runs one GEMV per row).
#define GGML_DSC_GEMV_ROWS_MAX 4
bool ggml_dsc_gemv_rows_fits(enum ggml_type type, int64_t nb_cols, int64_t inter_size);
bool ggml_dsc_gemv_rows(enum ggml_type type, int64_t nb_cols, int64_t inter_size,
                        int n, float * const * out, const void * vx, const void * const * a, int nr, int nc);
// the same with rows vy_stride bytes apart and outputs s_stride bytes apart
bool ggml_dsc_gemv_rows_strided(enum ggml_type type, int64_t nb_cols, int64_t inter_size,
                                int n, float * s, size_t s_stride, const void * vx, const void * vy, size_t vy_stride, int nr, int nc);

// the AMX path the repack buffer tries first (dsc/amx-gemm.cpp)
#include "dsc-amx.h"

// a CPU_REPACK buffer over a read-only mapping of [offset, offset + size) of the file fd: the loader's
// repack cache (dsc/repack-mapped-buffer.cpp); NULL when it cannot be mapped. Handed to the loader by the
// CPU backend's get_proc_address.
ggml_backend_buffer_t ggml_dsc_repack_buffer_from_file(int fd, size_t offset, size_t size);
