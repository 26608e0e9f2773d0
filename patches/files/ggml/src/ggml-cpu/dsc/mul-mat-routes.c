// deepseek-cpu: where ggml_compute_forward_mul_mat (ggml-cpu.c) hands a product to our kernels: the
// x86 multi-row decode GEMVs (also used by MUL_MAT_ID's one-token experts), the repacked GEMMs
// (repack.cpp) for plain-buffer weights, the q5_0 / q8_0 broadcast GEMM (dsc/mul-mat-id-experts.c)
// and the one-token per-plane chunking.

#include "ggml-cpu-impl.h"
#include "ggml-cpu.h"
#include "quants.h"
#include "dsc/dsc-mul-mat.h"

#if defined(__AVX2__)
// deepseek-cpu: the x86 multi-row GEMV for one column times rows of this type and length, or NULL
// (vec_dot per row then runs)
// (the type: ggml_dsc_gemv_t, dsc/dsc-mul-mat.h)
ggml_dsc_gemv_t ggml_dsc_gemv_for(enum ggml_type type, int64_t n) {
    // the q8_0-column GEMVs keep per-block column terms on the stack (ggml_dsc_gemv_fits); the k-quants' take any length
    const bool fits = ggml_dsc_gemv_fits(n);
    switch (type) {
        case GGML_TYPE_Q4_0: return fits ? ggml_dsc_gemv_q4_0_q8_0 : NULL;
        case GGML_TYPE_Q5_0: return fits ? ggml_dsc_gemv_q5_0_q8_0 : NULL;
        case GGML_TYPE_Q8_0: return fits ? ggml_dsc_gemv_q8_0_q8_0 : NULL;
        case GGML_TYPE_MXFP4: return fits ? ggml_dsc_gemv_mxfp4_q8_0 : NULL;
        case GGML_TYPE_Q3_K: return n % QK_K == 0 ? ggml_dsc_gemv_q3_K_q8_K : NULL;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
        case GGML_TYPE_Q6_K: return n % QK_K == 0 ? ggml_dsc_gemv_q6_K_q8_K : NULL;
        case GGML_TYPE_Q2_K: return n % QK_K == 0 ? ggml_dsc_gemv_q2_K_q8_K : NULL;
#endif
        default:             return NULL;
    }
}
#else
ggml_dsc_gemv_t ggml_dsc_gemv_for(enum ggml_type type, int64_t n) {
    GGML_UNUSED(type);
    GGML_UNUSED(n);
    return NULL;
}
#endif

#if defined(__AVX2__)
// deepseek-cpu: repack.cpp
bool ggml_dsc_mul_mat_plain_repacked_fits(const struct ggml_compute_params * params, const struct ggml_tensor * dst);
bool ggml_dsc_mul_mat_plain_repacked(const struct ggml_compute_params * params, struct ggml_tensor * dst, const void * wdata);
#endif

// the plain-buffer q4_K and q6_K products that the repacked GEMMs take (stock tiled code must not)
bool ggml_dsc_mul_mat_repacked_fits(const struct ggml_compute_params * params, const struct ggml_tensor * dst) {
#if defined(__AVX2__)
    return ggml_dsc_mul_mat_plain_repacked_fits(params, dst);
#else
    GGML_UNUSED(params);
    GGML_UNUSED(dst);
    return false;
#endif
}

// src1 already quantized to vec_dot_type in wdata: true when one of our GEMMs did the whole product
bool ggml_dsc_mul_mat_quantized(const struct ggml_compute_params * params, struct ggml_tensor * dst, const void * wdata) {
#if defined(__AVX2__)
    // deepseek-cpu: q4_0, q4_K and q6_K weights in the plain buffer through the repacked GEMMs (repack.cpp)
    if (ggml_dsc_mul_mat_plain_repacked(params, dst, wdata)) {
        return true;
    }
#endif
    // deepseek-cpu: q5_0 and q8_0 ones through the broadcast expert GEMM (dsc/mul-mat-id-experts.c)
    return ggml_dsc_mul_mat_g8(params, dst, wdata);
}

void ggml_dsc_mul_mat_plane_chunks(const struct ggml_compute_params * params, const struct ggml_tensor * dst,
                                   int64_t nr1, int64_t * nchunk0, int64_t * nchunk1) {
    const int64_t ne02 = dst->src[0]->ne[2];
    const int64_t ne03 = dst->src[0]->ne[3];
    const int64_t ne11 = dst->src[1]->ne[1];
    const int     nth  = params->nth;

    // deepseek-cpu: one token times per-plane weights (MLA decode: q_nope by each head's attn_k_b, the
    // attention output by each head's attn_v_b, 16 planes of 36 KB in Q4_0): the chunks above take 16 rows
    // of every plane, so each one gathers 16 small pieces from all over the weights and the memory stream
    // restarts at every piece. A chunk per plane reads one contiguous matrix instead.
    if (!params->use_ref && ne11 == 1 && ne02*ne03 > 1 && nr1 >= 4*nth && !ggml_is_numa()) {
        *nchunk0 = 1;
        *nchunk1 = nr1;
    }
}
