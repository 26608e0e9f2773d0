#pragma once

// deepseek-cpu: entry points of our matrix-product kernels (dsc/mul-mat-routes.c, dsc/f32-gemm.c,
// dsc/mul-mat-id-experts.c), called from ggml-cpu.c. Each returns false (or NULL, or 0) when it does
// not take the case, and stock code then runs.

#include "ggml-cpu-impl.h"

#ifdef __cplusplus
extern "C" {
#endif

// the multi-row GEMV for one column times rows of this type and length, or NULL (vec_dot per row then runs)
typedef void (*ggml_dsc_gemv_t)(int n, int nr, float * GGML_RESTRICT s, const void * GGML_RESTRICT vx, size_t bx, const void * GGML_RESTRICT vy);
ggml_dsc_gemv_t ggml_dsc_gemv_for(enum ggml_type type, int64_t n);

// ggml_compute_forward_mul_mat
bool ggml_dsc_mul_mat_repacked_fits(const struct ggml_compute_params * params, const struct ggml_tensor * dst);
bool ggml_dsc_mul_mat_f32(const struct ggml_compute_params * params, struct ggml_tensor * dst);
bool ggml_dsc_mul_mat_quantized(const struct ggml_compute_params * params, struct ggml_tensor * dst, const void * wdata);
bool ggml_dsc_mul_mat_g8(const struct ggml_compute_params * params, struct ggml_tensor * dst, const void * wdata);
// one chunk of 2-4 columns times q6_K rows, each weight block unpacked once for all of them (dsc/x86-gemv-cols.c)
bool ggml_dsc_mul_mat_few_cols(const struct ggml_compute_params * params, struct ggml_tensor * dst,
                               int64_t ir0_start, int64_t ir0_end, int64_t ir1_start, int64_t ir1_end,
                               const void * wdata, size_t row_size);
void ggml_dsc_mul_mat_plane_chunks(const struct ggml_compute_params * params, const struct ggml_tensor * dst,
                                   int64_t nr1, int64_t * nchunk0, int64_t * nchunk1);

// ggml_compute_forward_mul_mat_id and ggml_graph_plan
size_t ggml_dsc_mul_mat_id_thread_size(const struct ggml_tensor * dst);
void   ggml_dsc_mul_mat_id_scratch_reset(char * dsc_scratch, size_t dsc_scratch_size, int ith);
size_t ggml_dsc_mul_mat_id_wsize(const struct ggml_tensor * node, int n_tasks);
bool   ggml_dsc_mul_mat_id_expert(
        const struct ggml_compute_params * params,
        struct ggml_tensor * dst,
        const int64_t cur_a, const int64_t cne1,
        const char * src0_cur,
        const struct mmid_row_mapping * matrix_rows,
        const struct mmid_row_mapping * expert_rows,
        const void * wdata, const size_t row_size, const bool src1_cont,
        char * dsc_scratch, const size_t dsc_scratch_size,
        void * current_chunk_ctr); // the expert's atomic_int chunk counter

// upstream (ggml-cpu.c), not static so that the expert GEMMs can fall back to it
void ggml_compute_forward_mul_mat_id_one_chunk(
    struct ggml_tensor * dst,
    const struct ggml_tensor * src0,
    const struct ggml_tensor * src1,
    const struct ggml_tensor * ids,
    const int64_t cur_a,
    const int64_t ir0_start,
    const int64_t ir0_end,
    const int64_t ir1_start,
    const int64_t ir1_end,
    const char * src0_cur,
    const struct mmid_row_mapping * matrix_rows,
    const size_t row_size,
    const bool src1_cont,
    const void * wdata,
    const bool use_ref);

#ifdef __cplusplus
}
#endif
