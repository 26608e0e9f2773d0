// deepseek-cpu: DeepSeek-V4's manifold-constrained hyper-connections, vectorized (x86 AVX2 + FMA).
// Called first by ggml_compute_forward_dsv4_hc_post_f32 (ops.cpp); false leaves the op to stock code.

#include "ggml-cpu-impl.h"
#include "dsc/dsc-ops.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

// DSV4_HC_POST: for each token t and stream s, y[s] = post[s]*x + sum_j comb[s][j]*residual[j] (comb NULL:
// y[s] = post[s]*x + residual[s]). Stock code runs it one element at a time with three integer divisions
// each: 30 ms a call for a 420-token batch of V4-Flash (4096 x 4 streams), 5% of a prompt on Zen 4. Here
// one (token, stream) row at a time, 8 elements a vector, in the same order of operations as stock code
// compiled with contraction (x*post, then one fused multiply-add per stream).
bool ggml_dsc_dsv4_hc_post_f32(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * x        = dst->src[0];
    const ggml_tensor * residual = dst->src[1];
    const ggml_tensor * post     = dst->src[2];
    const ggml_tensor * comb     = dst->src[3];

    const int64_t n_embd   = x->ne[0];
    const int64_t n_tokens = x->ne[1];
    const int64_t hc       = residual->ne[1];
    constexpr int64_t HC_MAX = 16;
    if (params->use_ref || x->type != GGML_TYPE_F32 || residual->type != GGML_TYPE_F32 || post->type != GGML_TYPE_F32 ||
        dst->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float) || residual->nb[0] != sizeof(float) || dst->nb[0] != sizeof(float) ||
        n_embd % 8 != 0 || hc > HC_MAX || dst->ne[0] != n_embd || dst->ne[1] != hc || dst->ne[2] != n_tokens ||
        (comb && comb->type != GGML_TYPE_F32)) {
        return false;
    }

    const int64_t nrows = n_tokens*hc;
    const int64_t dr    = (nrows + params->nth - 1)/params->nth;
    const int64_t r0    = dr*params->ith;
    const int64_t r1    = MIN(r0 + dr, nrows);

    for (int64_t r = r0; r < r1; r++) {
        const int64_t t = r/hc, s = r%hc;
        const float * xr = (const float *) ((const char *) x->data + t*x->nb[1]);
        const float   p  = *(const float *) ((const char *) post->data + s*post->nb[0] + t*post->nb[1]);
        float * y = (float *) ((char *) dst->data + s*dst->nb[1] + t*dst->nb[2]);
        const float * res[HC_MAX];
        __m256 c[HC_MAX];
        const int64_t n_src = comb ? hc : 1;
        for (int64_t j = 0; j < n_src; j++) {
            const int64_t js = comb ? j : s;
            res[j] = (const float *) ((const char *) residual->data + js*residual->nb[1] + t*residual->nb[2]);
            c[j] = _mm256_set1_ps(comb ? *(const float *) ((const char *) comb->data + s*comb->nb[0] + j*comb->nb[1] + t*comb->nb[2]) : 1.0f);
        }
        const __m256 pv = _mm256_set1_ps(p);
        for (int64_t i = 0; i < n_embd; i += 8) {
            __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(xr + i), pv);
            if (comb) {
                for (int64_t j = 0; j < n_src; j++) {
                    acc = _mm256_fmadd_ps(_mm256_loadu_ps(res[j] + i), c[j], acc);
                }
            } else {
                acc = _mm256_add_ps(acc, _mm256_loadu_ps(res[0] + i));
            }
            _mm256_storeu_ps(y + i, acc);
        }
    }
    return true;
}
#else
bool ggml_dsc_dsv4_hc_post_f32(const ggml_compute_params * params, ggml_tensor * dst) {
    GGML_UNUSED(params);
    GGML_UNUSED(dst);
    return false;
}
#endif // __AVX2__ && __FMA__
