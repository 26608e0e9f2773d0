#pragma once

// deepseek-cpu: entry points of our kernels called from ops.cpp (dsc/copy-ops.cpp, dsc/flash-attn-f32.cpp,
// dsc/mla-attention.cpp, dsc/hyper-connections.cpp). Each returns false when it does not take the case, and
// stock code then runs.

#include "ggml-cpu-impl.h"

// ggml_compute_forward_dup_bytes, ggml_compute_forward_concat_f32
bool ggml_dsc_dup_bytes_strided(const ggml_tensor * src0, char * dst_ptr, size_t id, const int ir0, const int ir1,
                                const size_t type_size);
bool ggml_dsc_concat_f32_rows(const ggml_compute_params * params, ggml_tensor * dst, const int32_t dim);

// ggml_compute_forward_flash_attn_ext_f16
bool ggml_dsc_flash_attn_ext_mqa(const ggml_compute_params * params, ggml_tensor * dst);
bool ggml_dsc_flash_attn_ext_f32_tiled_ok(const ggml_compute_params * params, const ggml_tensor * dst);
void ggml_dsc_flash_attn_ext_f32_tiled(const ggml_compute_params * params, ggml_tensor * dst, int64_t ir0, int64_t ir1);

// ggml_compute_forward_dsv4_hc_post_f32 (dsc/hyper-connections.cpp)
bool ggml_dsc_dsv4_hc_post_f32(const ggml_compute_params * params, ggml_tensor * dst);

// upstream (ops.cpp), not static so that the one-token MLA kernel can combine its partials with it
void ggml_flash_attn_ext_reduce_partials(
        const ggml_compute_params * params,
        ggml_tensor * dst,
        const int64_t n_chunks,
        const int64_t chunk_size);
