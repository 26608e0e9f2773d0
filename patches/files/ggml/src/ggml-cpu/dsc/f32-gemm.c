// deepseek-cpu: the f32 x f32 outer-product GEMM for MUL_MAT with many src1 rows (AVX2 + FMA builds
// without AVX-512). Called from ggml_compute_forward_mul_mat (ggml-cpu.c).

#include "ggml-cpu-impl.h"
#include "dsc-f32-tile.h"
#include "dsc/dsc-mul-mat.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// deepseek-cpu: f32 x f32 products with many src1 rows (MLA prefill's K decompression: a
// [kv_lora_rank, n_embd_head_qk_nope * n_head] matrix times every cached latent row) as an
// outer-product GEMM. tinyBLAS's AVX2 f32 tile (4 x 3 dot products along k) re-reads 7 vectors for
// every 12 FMAs and reaches ~27 GMAC/s per core here. Here a panel of src0 (GGML_DSC_F32_NC rows x
// GGML_DSC_F32_KC k, 32 KB) is packed transposed once, so that the output columns are the SIMD
// dimension of the register tile shared with the f32 flash attention (dsc_f32_tile, dsc-f32-tile.h:
// 6 broadcasts and 2 panel vectors per 12 FMAs, no horizontal reduction). Each thread owns a range
// of output columns; no barrier. The sums are f32 FMAs in k order, so results differ from tinyBLAS
// only in rounding. AVX-512 builds keep tinyBLAS, whose 512-bit tile has twice the registers (not
// measured here: no AVX-512 machine).
// GGML_DSC_F32_KC, GGML_DSC_F32_NC: dsc/dsc-tuning.h

bool ggml_dsc_mul_mat_f32(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS

    if (params->use_ref || src0->type != GGML_TYPE_F32 || src1->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_F32 ||
        ne02 != 1 || ne03 != 1 || ne12 != 1 || ne13 != 1 || ne01 % 16 != 0 || ne11 < 64 || ne00 < 16) {
        return false;
    }

    const int64_t K = ne00;
    const int64_t T = ne11;
    const int64_t nstrip = ne01/16;
    const int64_t c0 = 16*((params->ith*nstrip)/params->nth);
    const int64_t c1 = 16*(((params->ith + 1)*nstrip)/params->nth);

    float wp[GGML_DSC_F32_KC*GGML_DSC_F32_NC] __attribute__((aligned(32)));

    for (int64_t n0 = c0; n0 < c1; n0 += GGML_DSC_F32_NC) {
        const int64_t nc = MIN(GGML_DSC_F32_NC, c1 - n0);
        for (int64_t k0 = 0; k0 < K; k0 += GGML_DSC_F32_KC) {
            const int kc = (int) MIN(GGML_DSC_F32_KC, K - k0);
            // wp[kk][n] = src0 row n0 + n, element k0 + kk
            for (int64_t n = 0; n < nc; n++) {
                const float * r = (const float *) ((const char *) src0->data + (n0 + n)*nb01) + k0;
                for (int kk = 0; kk < kc; kk++) {
                    wp[kk*GGML_DSC_F32_NC + n] = r[kk];
                }
            }
            for (int64_t t = 0; t < T; t += DSC_F32_TILE_MR) {
                const int rm = (int) MIN(DSC_F32_TILE_MR, T - t);
                const float * a = (const float *) ((const char *) src1->data + t*nb11) + k0;
                float * c = (float *) ((char *) dst->data + t*nb1) + n0;
                for (int64_t n = 0; n < nc; n += 16) {
                    switch (rm) {
                        case 6: dsc_f32_tile(6, c + n, nb1/sizeof(float), a, nb11/sizeof(float), 1, wp + n, GGML_DSC_F32_NC, kc, k0 == 0); break;
                        case 5: dsc_f32_tile(5, c + n, nb1/sizeof(float), a, nb11/sizeof(float), 1, wp + n, GGML_DSC_F32_NC, kc, k0 == 0); break;
                        case 4: dsc_f32_tile(4, c + n, nb1/sizeof(float), a, nb11/sizeof(float), 1, wp + n, GGML_DSC_F32_NC, kc, k0 == 0); break;
                        case 3: dsc_f32_tile(3, c + n, nb1/sizeof(float), a, nb11/sizeof(float), 1, wp + n, GGML_DSC_F32_NC, kc, k0 == 0); break;
                        case 2: dsc_f32_tile(2, c + n, nb1/sizeof(float), a, nb11/sizeof(float), 1, wp + n, GGML_DSC_F32_NC, kc, k0 == 0); break;
                        default: dsc_f32_tile(1, c + n, nb1/sizeof(float), a, nb11/sizeof(float), 1, wp + n, GGML_DSC_F32_NC, kc, k0 == 0); break;
                    }
                }
            }
        }
    }
    return true;
}
#else
bool ggml_dsc_mul_mat_f32(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    GGML_UNUSED(params);
    GGML_UNUSED(dst);
    return false;
}
#endif
