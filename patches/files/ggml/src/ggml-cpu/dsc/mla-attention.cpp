// deepseek-cpu: flash attention for one query token whose query heads share K/V heads (MLA's absorbed
// decode), x86 AVX2 + FMA (AVX-512 tiles where built). Called from ggml_compute_forward_flash_attn_ext_f16
// (ops.cpp); its partials are combined by ops.cpp's ggml_flash_attn_ext_reduce_partials.

#include "ggml-cpu-impl.h"
#include "simd-mappings.h"
#include "vec.h"
#include "ops.h"
#include "dsc/fa-exp.h"
#include "dsc/dsc-ops.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__)
// deepseek-cpu: flash attention for one query token whose heads share K/V heads (MQA/GQA): MLA's
// absorbed decode (16 or 128 heads of width 576 over one latent K/V head), f32 q, f16 or f32 K/V.
// The stock decode path calls its per-head kernel once per query head, so each head reads and
// converts the whole cache again and rounds q to f16 for vec_dot_f16. Here the key range (from the
// first to the last key the mask leaves finite, so the cache's padding costs nothing) is cut into
// blocks that threads take as they ask; for every block a thread computes its head group's scores
// with each K row loaded (and converted) once per 4 heads and 3 rows, runs the online softmax per
// head, and adds P V into the head's partial output with each V row converted once per 4 heads.
// The partials (max, sum, unnormalized output per head and thread) are combined by
// ggml_flash_attn_ext_reduce_partials, as the stock split-KV path does. Products are in f32 (q is not
// rounded), so with an f32 cache the result is as exact as the KQ / softmax / KQV ops it replaces.
// GGML_DSC_MQA_KB keys per block; GGML_DSC_MQA_HG heads per group: the group's block of scores stays in L1;
// GGML_DSC_MQA_RUNS: the keys are cut into this many runs (or 2 x threads, if more) (all in dsc/dsc-tuning.h)

template <typename T> static inline __m256 dsc_mqa_load8(const T * p);
template <> inline __m256 dsc_mqa_load8<ggml_fp16_t>(const ggml_fp16_t * p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p));
}
template <> inline __m256 dsc_mqa_load8<float>(const float * p) {
    return _mm256_loadu_ps(p);
}

static inline float dsc_mqa_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// S[h*GGML_DSC_MQA_KB + r] = q_h . K_r for NR (<= 4) key rows and NH (<= 4) heads
template <typename T, int NR, int NH>
static inline void dsc_mqa_scores(const T * const * kr, const float * const * qh, int64_t DK, float * S) {
    __m256 acc[NR][NH];
    for (int r = 0; r < NR; r++) {
        for (int h = 0; h < NH; h++) {
            acc[r][h] = _mm256_setzero_ps();
        }
    }
    for (int64_t d = 0; d < DK; d += 8) {
        __m256 kv[NR];
        for (int r = 0; r < NR; r++) {
            kv[r] = dsc_mqa_load8(kr[r] + d);
        }
        for (int h = 0; h < NH; h++) {
            __m256 qv = _mm256_loadu_ps(qh[h] + d);
#if defined(__GNUC__)
            if constexpr (std::is_same<T, ggml_fp16_t>::value) {
                // Left alone, the compiler folds this load into each of the NR FMAs (3 x 4 tiles leave
                // exactly one spare register): 15 loads per 12 FMAs, and two 256-bit loads per cycle
                // then bound the tile. Held in a register it is 7 per 12 (1.09x for the kernel with an
                // f16 cache; with an f32 one the folded form was as fast, so it stays).
                __asm__("" : "+x"(qv));
            }
#endif
            for (int r = 0; r < NR; r++) {
                acc[r][h] = _mm256_fmadd_ps(kv[r], qv, acc[r][h]);
            }
        }
    }
    for (int r = 0; r < NR; r++) {
        for (int h = 0; h < NH; h++) {
            S[h*GGML_DSC_MQA_KB + r] = dsc_mqa_hsum(acc[r][h]);
        }
    }
}

#if defined(__AVX512F__)
// deepseek-cpu: the same tiles on 512-bit vectors (AVX-512F builds, K and V widths multiples of 16 and
// 32): each FMA covers 16 dimensions, so a tile takes half the FMAs and half the conversions of the
// 256-bit one. The dot products are summed in another order (16 partial sums, not 8), so results
// differ from the 256-bit tiles in the last bits; like them, they are the same on every run.
template <typename T> static inline __m512 dsc_mqa_load16(const T * p);
template <> inline __m512 dsc_mqa_load16<ggml_fp16_t>(const ggml_fp16_t * p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) p));
}
template <> inline __m512 dsc_mqa_load16<float>(const float * p) {
    return _mm512_loadu_ps(p);
}

// S[h*GGML_DSC_MQA_KB + r] = q_h . K_r for NR (<= 4) key rows and NH (<= 4) heads
template <typename T, int NR, int NH>
static inline void dsc_mqa_scores512(const T * const * kr, const float * const * qh, int64_t DK, float * S,
                                     const char * pf = nullptr, size_t pf_bytes = 0) {
    __m512 acc[NR][NH];
    for (int r = 0; r < NR; r++) {
        for (int h = 0; h < NH; h++) {
            acc[r][h] = _mm512_setzero_ps();
        }
    }
    for (int64_t d = 0; d < DK; d += 16) {
        // the next rows' bytes, two lines per step: spread out, the prefetches do not queue up on the
        // line fill buffers as a burst of them did (a third of the kernel's time at 4096 keys)
        if (pf && (size_t) (8*d) < pf_bytes) {
            _mm_prefetch(pf + 8*d, _MM_HINT_T1);
            _mm_prefetch(pf + 8*d + 64, _MM_HINT_T1);
        }
        __m512 kv[NR];
        for (int r = 0; r < NR; r++) {
            kv[r] = dsc_mqa_load16(kr[r] + d);
        }
        for (int h = 0; h < NH; h++) {
            __m512 qv = _mm512_loadu_ps(qh[h] + d);
#if defined(__GNUC__)
            __asm__("" : "+v"(qv)); // one load per head and step, not one per FMA (see dsc_mqa_scores)
#endif
            for (int r = 0; r < NR; r++) {
                acc[r][h] = _mm512_fmadd_ps(kv[r], qv, acc[r][h]);
            }
        }
    }
    for (int r = 0; r < NR; r++) {
        for (int h = 0; h < NH; h++) {
            S[h*GGML_DSC_MQA_KB + r] = _mm512_reduce_add_ps(acc[r][h]);
        }
    }
}

// O_h[c .. c+32) += sum_r P[h*GGML_DSC_MQA_KB + r] * V_r[c .. c+32) for NH (<= 8) heads
template <typename T, int NH>
static inline void dsc_mqa_accum32(const T * const * vr, int nr, const float * P, float * const * O, int64_t c) {
    __m512 acc[NH][2];
    for (int h = 0; h < NH; h++) {
        acc[h][0] = _mm512_loadu_ps(O[h] + c);
        acc[h][1] = _mm512_loadu_ps(O[h] + c + 16);
    }
    for (int r = 0; r < nr; r++) {
        const __m512 v0 = dsc_mqa_load16(vr[r] + c);
        const __m512 v1 = dsc_mqa_load16(vr[r] + c + 16);
        for (int h = 0; h < NH; h++) {
            const __m512 p = _mm512_set1_ps(P[h*GGML_DSC_MQA_KB + r]);
            acc[h][0] = _mm512_fmadd_ps(v0, p, acc[h][0]);
            acc[h][1] = _mm512_fmadd_ps(v1, p, acc[h][1]);
        }
    }
    for (int h = 0; h < NH; h++) {
        _mm512_storeu_ps(O[h] + c,      acc[h][0]);
        _mm512_storeu_ps(O[h] + c + 16, acc[h][1]);
    }
}
#endif

// pf: where the next block's keys start; the first head quad prefetches them into L2 as it goes (one
// block of keys per 4 heads' worth of FMAs), so the next block is not read from DRAM at FMA pace
template <typename T, int NH>
static inline void dsc_mqa_scores_rows(const T * const * kr, int nr, const float * const * qh, int64_t DK, float * S,
                                       const char * pf, size_t row_bytes) {
    // 3 rows x 4 heads: 12 accumulators cover the FMA latency (2 x 4 ran ~25% slower). With AVX-512VL
    // the compiler has 32 vector registers, enough for 4 x 4 (16 accumulators, 4 keys, the query).
#if defined(__AVX512VL__)
    constexpr int TR = 4;
#else
    constexpr int TR = 3;
#endif
#if defined(__AVX512F__)
    if (DK % 16 == 0) {
        int r = 0;
        for (; r + 4 <= nr; r += 4) {
            dsc_mqa_scores512<T, 4, NH>(kr + r, qh, DK, S + r, pf ? pf + r*row_bytes : nullptr, 4*row_bytes);
        }
        switch (nr - r) {
            case 3: dsc_mqa_scores512<T, 3, NH>(kr + r, qh, DK, S + r); break;
            case 2: dsc_mqa_scores512<T, 2, NH>(kr + r, qh, DK, S + r); break;
            case 1: dsc_mqa_scores512<T, 1, NH>(kr + r, qh, DK, S + r); break;
        }
        return;
    }
#endif
    int r = 0;
    for (; r + TR <= nr; r += TR) {
        dsc_mqa_scores<T, TR, NH>(kr + r, qh, DK, S + r);
        if (pf) {
            for (size_t o = 0; o < TR*row_bytes; o += 64) {
                _mm_prefetch(pf + r*row_bytes + o, _MM_HINT_T1);
            }
        }
    }
    if (nr - r == 3) {
        dsc_mqa_scores<T, 3, NH>(kr + r, qh, DK, S + r);
    } else if (nr - r == 2) {
        dsc_mqa_scores<T, 2, NH>(kr + r, qh, DK, S + r);
    } else if (nr - r == 1) {
        dsc_mqa_scores<T, 1, NH>(kr + r, qh, DK, S + r);
    }
}

// O_h[c .. c+16) += sum_r P[h*GGML_DSC_MQA_KB + r] * V_r[c .. c+16) for NH (<= 8) heads
template <typename T, int NH>
static inline void dsc_mqa_accum16(const T * const * vr, int nr, const float * P, float * const * O, int64_t c) {
    __m256 acc[NH][2];
    for (int h = 0; h < NH; h++) {
        acc[h][0] = _mm256_loadu_ps(O[h] + c);
        acc[h][1] = _mm256_loadu_ps(O[h] + c + 8);
    }
    for (int r = 0; r < nr; r++) {
        const __m256 v0 = dsc_mqa_load8(vr[r] + c);
        const __m256 v1 = dsc_mqa_load8(vr[r] + c + 8);
        for (int h = 0; h < NH; h++) {
            const __m256 p = _mm256_broadcast_ss(P + h*GGML_DSC_MQA_KB + r);
            acc[h][0] = _mm256_fmadd_ps(v0, p, acc[h][0]);
            acc[h][1] = _mm256_fmadd_ps(v1, p, acc[h][1]);
        }
    }
    for (int h = 0; h < NH; h++) {
        _mm256_storeu_ps(O[h] + c,     acc[h][0]);
        _mm256_storeu_ps(O[h] + c + 8, acc[h][1]);
    }
}

template <typename T>
static void dsc_mqa_block_scores(const T * const * kr, int nr, const float * const * qh, int nh, int64_t DK, float * S,
                                 const char * pf, size_t row_bytes) {
    for (int h0 = 0; h0 < nh; h0 += 4) {
        const char * p = h0 == 0 ? pf : nullptr;
        switch (MIN(4, nh - h0)) {
            case 4: dsc_mqa_scores_rows<T, 4>(kr, nr, qh + h0, DK, S + h0*GGML_DSC_MQA_KB, p, row_bytes); break;
            case 3: dsc_mqa_scores_rows<T, 3>(kr, nr, qh + h0, DK, S + h0*GGML_DSC_MQA_KB, p, row_bytes); break;
            case 2: dsc_mqa_scores_rows<T, 2>(kr, nr, qh + h0, DK, S + h0*GGML_DSC_MQA_KB, p, row_bytes); break;
            case 1: dsc_mqa_scores_rows<T, 1>(kr, nr, qh + h0, DK, S + h0*GGML_DSC_MQA_KB, p, row_bytes); break;
        }
    }
}

// V column chunks outside, head quads inside: a chunk of the block's V rows is read from L1 by every quad.
// With AVX-512VL's 32 vector registers, eight heads at a time: 16 accumulator chains instead of 8, so
// the FMA latency no longer has to be covered exactly, and each V row is converted once per 8 heads.
template <typename T>
static void dsc_mqa_block_accum(const T * const * vr, int nr, const float * S, float * const * O, int nh, int64_t DV) {
#if defined(__AVX512VL__)
    constexpr int HQ = 8;
#else
    constexpr int HQ = 4;
#endif
#if defined(__AVX512F__)
    if (DV % 32 == 0) {
        for (int64_t c = 0; c < DV; c += 32) {
            for (int h0 = 0; h0 < nh; h0 += 8) {
                switch (MIN(8, nh - h0)) {
                    case 8: dsc_mqa_accum32<T, 8>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                    case 7: dsc_mqa_accum32<T, 7>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                    case 6: dsc_mqa_accum32<T, 6>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                    case 5: dsc_mqa_accum32<T, 5>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                    case 4: dsc_mqa_accum32<T, 4>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                    case 3: dsc_mqa_accum32<T, 3>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                    case 2: dsc_mqa_accum32<T, 2>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                    case 1: dsc_mqa_accum32<T, 1>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                }
            }
        }
        return;
    }
#endif
    for (int64_t c = 0; c < DV; c += 16) {
        for (int h0 = 0; h0 < nh; h0 += HQ) {
            switch (MIN(HQ, nh - h0)) {
#if defined(__AVX512VL__)
                case 8: dsc_mqa_accum16<T, 8>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                case 7: dsc_mqa_accum16<T, 7>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                case 6: dsc_mqa_accum16<T, 6>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                case 5: dsc_mqa_accum16<T, 5>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
#endif
                case 4: dsc_mqa_accum16<T, 4>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                case 3: dsc_mqa_accum16<T, 3>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                case 2: dsc_mqa_accum16<T, 2>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
                case 1: dsc_mqa_accum16<T, 1>(vr, nr, S + h0*GGML_DSC_MQA_KB, O + h0, c); break;
            }
        }
    }
}

// the shapes ggml_dsc_flash_attn_ext_mqa_decode handles
static bool ggml_dsc_flash_attn_ext_mqa_decode_ok(const ggml_compute_params * params, const ggml_tensor * dst) {
    const ggml_tensor * q    = dst->src[0];
    const ggml_tensor * k    = dst->src[1];
    const ggml_tensor * v    = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
    const float * fa_params  = (const float *) dst->op_params;
    static const int env = [] {
        const char * e = getenv("DEEPSEEK_CPU_MQA_FA");
        return e && *e ? atoi(e) : 1;
    }();
    return env != 0 && !params->use_ref && q->type == GGML_TYPE_F32 && q->ne[1] == 1 && q->ne[3] == 1 &&
           (k->type == GGML_TYPE_F16 || k->type == GGML_TYPE_F32) && v->type == k->type &&
           k->ne[3] == 1 && v->ne[3] == 1 && k->ne[2] == v->ne[2] && q->ne[2] % k->ne[2] == 0 &&
           q->ne[2]/k->ne[2] >= 2 && k->ne[0] % 8 == 0 && v->ne[0] % 16 == 0 &&
           fa_params[1] == 0.0f && fa_params[2] == 0.0f &&
           (dst->src[4] == nullptr || (dst->src[4]->type == GGML_TYPE_F32 && dst->src[4]->ne[0] >= q->ne[2])) &&
           (mask == nullptr || (mask->type == GGML_TYPE_F16 && mask->ne[2] == 1 && mask->ne[3] == 1));
}

template <typename T>
static void ggml_dsc_flash_attn_ext_mqa_decode(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * q    = dst->src[0];
    const ggml_tensor * k    = dst->src[1];
    const ggml_tensor * v    = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
    const ggml_tensor * sinks = dst->src[4];

    const int64_t DK   = k->ne[0];
    const int64_t DV   = v->ne[0];
    const int64_t n_kv = k->ne[1];
    const int64_t nhq  = q->ne[2];
    const int64_t rk   = nhq/k->ne[2]; // query heads per K/V head

    const int ith = params->ith;
    const int nth = params->nth;

    float scale = 1.0f;
    memcpy(&scale, (const float *) dst->op_params + 0, sizeof(float));

    // the keys the mask leaves finite, from the first to the last, in blocks of GGML_DSC_MQA_KB
    const ggml_fp16_t * mrow = mask ? (const ggml_fp16_t *) mask->data : nullptr;
    const ggml_fp16_t   ninf = GGML_CPU_FP32_TO_FP16(-INFINITY);
    int64_t lo = 0, hi = n_kv;
    if (mrow) {
        while (lo < hi && mrow[lo] == ninf) lo++;
        while (hi > lo && mrow[hi - 1] == ninf) hi--;
    }
    const int64_t nblk = (hi - lo + GGML_DSC_MQA_KB - 1)/GGML_DSC_MQA_KB;
    const int64_t gpk  = (rk + GGML_DSC_MQA_HG - 1)/GGML_DSC_MQA_HG;     // head groups per K/V head
    // the blocks are cut into nslot runs of consecutive blocks; each (head group, run) has its own
    // partial per head (max, sum, unnormalized output), in the stock split-KV layout
    // [q_head][run][M, S, VKQ], folded in block order and reduced in run order. Runs are handed out
    // as threads ask (a slower thread, a busy core of a shared machine, takes fewer), but which thread
    // runs one changes nothing: the result is the same on every run, and for any thread count up to
    // GGML_DSC_MQA_RUNS/2. (Folding blocks into per-thread partials as they were handed out made decoding
    // nondeterministic with 2 threads: logits differed by ~1e-6 after a few tokens, then grew.)
    const int64_t nslot = MAX((int64_t) 1, MIN(nblk, (int64_t) MAX(GGML_DSC_MQA_RUNS, 2*nth)));
    const int64_t nwork = k->ne[2]*gpk*nslot;                    // (head group, run) pairs
    const int64_t partial_size = 2 + DV;
    float * partials = (float *) params->wdata + nth*(DK + 2*DV + CACHE_LINE_SIZE_F32);

    if (ith == 0) {
        ggml_threadpool_chunk_set(params->threadpool, nth);
    }
    ggml_barrier(params->threadpool);

    float S[GGML_DSC_MQA_HG*GGML_DSC_MQA_KB];
    float mv[GGML_DSC_MQA_KB];
    const T * kr[GGML_DSC_MQA_KB];
    const T * vr[GGML_DSC_MQA_KB];

    for (int64_t w = ith; w < nwork; w = ggml_threadpool_chunk_add(params->threadpool, 1)) {
        const int64_t grp = w/nslot, slot = w%nslot;
        const int64_t g   = grp/gpk;                           // K/V head
        const int64_t h0  = g*rk + (grp%gpk)*GGML_DSC_MQA_HG;
        const int     nh  = (int) MIN((int64_t) GGML_DSC_MQA_HG, (g + 1)*rk - h0);
        const char * kbase = (const char *) k->data + g*k->nb[2];
        const char * vbase = (const char *) v->data + g*v->nb[2];

        const float * qh[GGML_DSC_MQA_HG];
        float *       O[GGML_DSC_MQA_HG];
        float *       MS[GGML_DSC_MQA_HG];
        for (int h = 0; h < nh; h++) {
            qh[h] = (const float *) ((const char *) q->data + (h0 + h)*q->nb[2]);
            MS[h] = partials + ((h0 + h)*nslot + slot)*partial_size;
            O[h]  = MS[h] + 2;
            MS[h][0] = -INFINITY;
            MS[h][1] = 0.0f;
            memset(O[h], 0, DV*sizeof(float));
        }

        const int64_t blk0 = slot*nblk/nslot, blk1 = (slot + 1)*nblk/nslot;
        for (int64_t blk = blk0; blk < blk1; blk++) {
            // the block's keys the mask leaves finite
            const int64_t j0 = lo + blk*GGML_DSC_MQA_KB, j1 = MIN(hi, j0 + GGML_DSC_MQA_KB);
            int nr = 0;
            for (int64_t j = j0; j < j1; j++) {
                const float m = mrow ? GGML_CPU_FP16_TO_FP32(mrow[j]) : 0.0f;
                if (m == -INFINITY) {
                    continue;
                }
                mv[nr] = m;
                kr[nr] = (const T *) (kbase + j*k->nb[1]);
                vr[nr] = (const T *) (vbase + j*v->nb[1]);
                nr++;
            }
            if (nr == 0) {
                continue;
            }

            // the run's next block
            const char * pf = blk + 1 < blk1 ? kbase + (j0 + GGML_DSC_MQA_KB)*k->nb[1] : nullptr;
            dsc_mqa_block_scores<T>(kr, nr, qh, nh, DK, S, pf, k->nb[1]);

            for (int h = 0; h < nh; h++) {
                float * s = S + h*GGML_DSC_MQA_KB;
                float mx = -INFINITY;
                for (int r = 0; r < nr; r++) {
                    s[r] = s[r]*scale + mv[r];
                    mx = MAX(mx, s[r]);
                }
                const float m_old = MS[h][0];
                if (mx > m_old) {
                    // m_old = -inf: nothing accumulated yet (O and the sum are 0)
                    if (m_old != -INFINITY) {
                        const float alpha = expf(m_old - mx);
                        ggml_vec_scale_f32((int) DV, O[h], alpha);
                        MS[h][1] *= alpha;
                    }
                    MS[h][0] = mx;
                }
                // up to the next multiple of 8 the scores are -inf (exp: 0), so one vector loop covers them
                for (int r = nr; r < ((nr + 7) & ~7); r++) {
                    s[r] = -INFINITY;
                }
                const __m256 m8 = _mm256_set1_ps(MS[h][0]);
                __m256 sum = _mm256_setzero_ps();
                for (int r = 0; r < nr; r += 8) {
                    const __m256 p = dsc_fa_exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(s + r), m8));
                    _mm256_storeu_ps(s + r, p);
                    sum = _mm256_add_ps(sum, p);
                }
                MS[h][1] += dsc_mqa_hsum(sum);
            }

            dsc_mqa_block_accum<T>(vr, nr, S, O, nh, DV);
        }

        // a sink (DeepSeek-V4): one more logit in each head's softmax, with no value, added to the first
        // run's partial as stock code adds it to its first chunk's; the reduction carries it over
        if (sinks && slot == 0) {
            for (int h = 0; h < nh; h++) {
                const float s = ((const float *) sinks->data)[h0 + h];
                if (s > MS[h][0]) {
                    const float ms = expf(MS[h][0] - s);   // 0 where nothing was accumulated
                    ggml_vec_scale_f32((int) DV, O[h], ms);
                    MS[h][1] = MS[h][1]*ms + 1.0f;
                    MS[h][0] = s;
                } else {
                    MS[h][1] += expf(s - MS[h][0]);
                }
            }
        }
    }

    ggml_barrier(params->threadpool);
    ggml_flash_attn_ext_reduce_partials(params, dst, nslot, 0);
}

// the shapes above, with an f16 or f32 cache: true when the op is done
bool ggml_dsc_flash_attn_ext_mqa(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * k = dst->src[1];
    if (ggml_dsc_flash_attn_ext_mqa_decode_ok(params, dst)) {
        if (k->type == GGML_TYPE_F16) {
            ggml_dsc_flash_attn_ext_mqa_decode<ggml_fp16_t>(params, dst);
        } else {
            ggml_dsc_flash_attn_ext_mqa_decode<float>(params, dst);
        }
        return true;
    }
    return false;
}
#else
bool ggml_dsc_flash_attn_ext_mqa(const ggml_compute_params * params, ggml_tensor * dst) {
    GGML_UNUSED(params);
    GGML_UNUSED(dst);
    return false;
}
#endif // __AVX2__ && __FMA__
