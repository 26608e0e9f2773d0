#pragma once

// deepseek-cpu: the binary-op row loop for a src1 with one element per row, used by apply_binary_op
// (binary-ops.cpp)

#include "common.h"

#include <cstdint>

// deepseek-cpu: src1 with one element per row (ne10 == 1, e.g. MoE routing weights [1, n_used, n_tokens]
// scaling the experts' outputs): one loop over the row with the value hoisted, which the compiler
// vectorizes, instead of ne00 calls of the contiguous loop with n = 1
template <float (*op)(float, float), typename src0_t, typename src1_t, typename dst_t>
static inline void vec_binary_op_scalar(const int64_t n, dst_t * z, const src0_t * x, const src1_t * y) {
    constexpr auto src0_to_f32 = type_conversion_table<src0_t>::to_f32;
    constexpr auto src1_to_f32 = type_conversion_table<src1_t>::to_f32;
    constexpr auto f32_to_dst  = type_conversion_table<dst_t >::from_f32;

    const float v = src1_to_f32(*y);
    for (int i = 0; i < n; i++) {
        z[i] = f32_to_dst(op(src0_to_f32(x[i]), v));
    }
}
