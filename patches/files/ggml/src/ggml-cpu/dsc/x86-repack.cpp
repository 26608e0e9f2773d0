// deepseek-cpu: the repacked q4_0 / q4_K / q6_K / MXFP4 GEMVs and GEMMs for x86 (AVX2, AVX-512 VNNI) on the
// layouts make_block_q4_0x8 / make_block_mxfp4x8 / make_block_q4_Kx8 write on AVX2 builds (4-byte
// interleave) and on block_q6_Kx8u. Called from the hooks at the top of ggml_gemv/gemm_q4_0_8x8_q8_0,
// _mxfp4_8x8_q8_0 and _q4_K_8x8_q8_K (arch/x86/repack.cpp) and from dsc/repack-dsc.cpp.
#define GGML_COMMON_IMPL_CPP
#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"
#include "ggml-backend-impl.h"

#include "ggml-impl.h"
#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "simd-mappings.h"
#include "traits.h"

#include <cmath>
#include <cstring>
#include <cassert>

#include "../repack.h"
#include "dsc-transpose.h"
#include "dsc-tuning.h"
#include "dsc-x86-blocks.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif


#if defined(__AVX2__)
// deepseek-cpu: q4_0 8x8 kernels for the layout make_block_q4_0x8 writes on AVX2 builds: 4-byte
// interleave, unsigned nibbles. qs[32 * j + 4 * c + i] holds column c's q[4j + i] in the low nibble and
// q[16 + 4j + i] in the high nibble (j, i = 0..3), q in [0, 15] standing for q - 8.
// One 256-bit load is then 8 columns x 4 k: against a 4-byte activation broadcast, maddubs (u8 x s8)
// gives two int16 per column, and one madd per 32-wide block gives one int32 per column, already in
// column order - no hadd and no final permute (the 8-byte interleave needed both). The eight products
// of a block are summed in int16 (|sum| <= 16 * 15 * 128 < 2^15), and the -8 offset is applied once
// per block as 8 * sum(activations). The integer block sums are those of the stock kernels and the
// float steps the same (isum * (d_w * d_a), accumulated block by block), so results are bit-identical.

// GCC reassociates the int16 sums of a block into one chain per row that starts after all of the
// block's products, which keeps 28 products live and spills them: 69 instead of 97 GMAC/s here. An
// empty asm that "changes" the sums after each k-group keeps them accumulating in registers.
#if defined(__GNUC__)
#define GGML_DSC_KEEP4(a, b, c, d) __asm__("" : "+x"(a), "+x"(b), "+x"(c), "+x"(d))
#define GGML_DSC_KEEP8(a, b, c, d, e, f, g, h) __asm__("" : "+x"(a), "+x"(b), "+x"(c), "+x"(d), "+x"(e), "+x"(f), "+x"(g), "+x"(h))
#else
#define GGML_DSC_KEEP4(a, b, c, d)
#define GGML_DSC_KEEP8(a, b, c, d, e, f, g, h)
#endif

// The two 4-bit types of this layout. q4_0: nibble q stands for q - 8, f16 column scales. MXFP4: the
// nibble indexes llama.cpp's e2m1 table (kvalues_mxfp4, doubled values -12 .. 12, whose scale is half
// the e8m0 one), looked up +12 so the weight is unsigned for maddubs / vpdpbusd; e8m0 column scales.
// OFF * sum(activations) is the offset each block's sum drops. SPLIT16: eight maddubs pairs of
// MXFP4's 0 .. 24 can reach 8 * 2 * 24 * 127 = 48768, past int16, so its AVX2 sums widen every four.
struct ggml_dsc_w4_q4_0 {
    using block = block_q4_0x8;
    static constexpr int  OFF     = 8;
    static constexpr bool SPLIT16 = false;
    static inline __m256i val(__m256i nib) { return nib; }
    static inline __m256  scales(const block & b) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) b.d)); }
#if defined(__AVX512F__) && defined(__AVX512BW__)
    static inline __m512i val(__m512i nib) { return nib; }
#endif
};

struct ggml_dsc_w4_mxfp4 {
    using block = block_mxfp4x8;
    static constexpr int  OFF     = 12;
    static constexpr bool SPLIT16 = true;
    static inline __m256i lut() {
        return _mm256_add_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) kvalues_mxfp4)), _mm256_set1_epi8(OFF));
    }
    static inline __m256i val(__m256i nib) { return _mm256_shuffle_epi8(lut(), nib); }
    // GGML_E8M0_TO_FP32_HALF of 8 exponents: 2^(e-128), as float bits (e-1) << 23, or the denormals
    // 0x00200000 << e for e < 2
    static inline __m256 e8m0_half(__m128i e8) {
        const __m256i e    = _mm256_cvtepu8_epi32(e8);
        const __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
        const __m256i den  = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
        return _mm256_castsi256_ps(_mm256_blendv_epi8(norm, den, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
    }
    static inline __m256  scales(const block & b) { return e8m0_half(_mm_loadl_epi64((const __m128i *) b.e)); }
#if defined(__AVX512F__) && defined(__AVX512BW__)
    static inline __m512i val(__m512i nib) {
        return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm256_castsi256_si128(lut())), nib);
    }
#endif
};

// The GEMMs' per-block activation prologue for the 4 rows of one block_q8_0x4, stored as rows m0 .. m0+3
// of a k-chunk's buffers (R rows each): the 4-byte broadcasts (k-group 2j: low nibbles of weight load j,
// 2j+1: high), OFF * sum(activations) for the unsigned-weight offset, and the activation scales.
template <int OFF, int R>
static inline void ggml_dsc_q4_0_prep_rows(const block_q8_0x4 & a, int m0, __m256i (&act)[8][R], __m256i (&off)[R], __m256 (&rsc)[R]) {
    const __m256i ones_u8 = _mm256_set1_epi8(1);
    const __m256i ones16  = _mm256_set1_epi16(1);
    for (int j = 0; j < 4; j++) {
        for (int m = 0; m < 4; m++) {
            const int o = 32 * (j >> 1) + 8 * m + 4 * (j & 1); // row m, k 4j
            act[2 * j][m0 + m]     = ggml_dsc_bcast4(a.qs + o);
            act[2 * j + 1][m0 + m] = ggml_dsc_bcast4(a.qs + 64 + o);
        }
    }
    // per 32-byte load, row m holds bytes 8m .. 8m+7 -> after maddubs + madd, int32 lanes 2m, 2m+1
    __m256i t = _mm256_setzero_si256();
    for (int g = 0; g < 4; g++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *) (a.qs + 32 * g));
        t = _mm256_add_epi32(t, _mm256_madd_epi16(_mm256_maddubs_epi16(ones_u8, v), ones16));
    }
    t = _mm256_hadd_epi32(t, t); // lane 0: r0 r1 r0 r1, lane 1: r2 r3 r2 r3
    const __m128i lo = _mm256_castsi256_si128(t), hi = _mm256_extracti128_si256(t, 1);
    off[m0 + 0] = _mm256_set1_epi32(OFF * _mm_cvtsi128_si32(lo));
    off[m0 + 1] = _mm256_set1_epi32(OFF * _mm_extract_epi32(lo, 1));
    off[m0 + 2] = _mm256_set1_epi32(OFF * _mm_cvtsi128_si32(hi));
    off[m0 + 3] = _mm256_set1_epi32(OFF * _mm_extract_epi32(hi, 1));
    for (int m = 0; m < 4; m++) {
        rsc[m0 + m] = _mm256_set1_ps(GGML_CPU_FP16_TO_FP32(a.d[m]));
    }
}

template <typename W, int NS>
static void gemv_w4_8x4u_q8_0_avx2_ns(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
    const int nb = n / QK8_0;

    using block_x8 = typename W::block;
    const block_x8     * b_ptr_start = (const block_x8     *) vx;
    const block_q8_0   * a_ptr_start = (const block_q8_0   *) vy;

    const __m256i m4b     = _mm256_set1_epi8(0x0F);
    const __m256i ones_u8 = _mm256_set1_epi8(1);
    const __m256i ones16  = _mm256_set1_epi16(1);

    // per block of the row: -OFF * sum(activations) and the activation scale, as vectors, so the column
    // loop reads them as memory operands instead of broadcasting them again for every column group
    __m256i off[GGML_DSC_Q4_0_KCV];
    __m256  rsc[GGML_DSC_Q4_0_KCV];

    for (int y = 0; y < nr; y++) {
        const block_q8_0 * a_ptr = a_ptr_start + (int64_t) y * nb;

        for (int b0 = 0; b0 < nb; b0 += GGML_DSC_Q4_0_KCV) {
            const int kc = MIN(nb - b0, GGML_DSC_Q4_0_KCV);

            for (int bb = 0; bb < kc; bb++) {
                const __m256i a   = _mm256_loadu_si256((const __m256i *) a_ptr[b0 + bb].qs);
                const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones_u8, a), ones16);
                __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
                t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
                t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
                off[bb] = _mm256_set1_epi32(-W::OFF * _mm_cvtsi128_si32(t));
                rsc[bb] = _mm256_set1_ps(GGML_CPU_FP16_TO_FP32(a_ptr[b0 + bb].d));
            }

            // block bb of one column group (b) into acc. With one k-chunk (rows of up to 4096 values:
            // every DeepSeek-V2 weight) a group's blocks run on into the next group's, so the prefetch
            // runs ahead of the stream; 2 lines per 144-byte block touch every line.
            auto block = [&](const block_x8 & b, int bb, __m256 acc) {
                const int8_t * q = a_ptr[b0 + bb].qs;
                _mm_prefetch((const char *) &b + GGML_DSC_GEMV_PREFETCH, _MM_HINT_T0);
                _mm_prefetch((const char *) &b + GGML_DSC_GEMV_PREFETCH + 64, _MM_HINT_T0);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
                // one 256-bit vpdpbusd per maddubs + int16 add pair (and no widening madd), low and
                // high nibbles in two chains, the low one starting at the offset: the same integer
                __m256i slo = off[bb];
                __m256i shi = _mm256_setzero_si256();
                for (int j = 0; j < 4; j++) {
                    const __m256i w  = _mm256_loadu_si256((const __m256i *) (b.qs + 32 * j));
                    const __m256i lo = W::val(_mm256_and_si256(w, m4b));                       // k 4j .. 4j+3
                    const __m256i hi = W::val(_mm256_and_si256(_mm256_srli_epi16(w, 4), m4b)); // k 16+4j .. 16+4j+3
                    slo = _mm256_dpbusd_epi32(slo, lo, ggml_dsc_bcast4(q + 4 * j));
                    shi = _mm256_dpbusd_epi32(shi, hi, ggml_dsc_bcast4(q + 16 + 4 * j));
                }
                const __m256i isum = _mm256_add_epi32(slo, shi);
#else
                // q4_0: |8 maddubs pairs| <= 8 * 2 * 15 * 127 = 30480, one int16 sum; MXFP4 (SPLIT16): low and
                // high nibbles in two sums of four pairs, <= 24384 each
                __m256i sum = _mm256_setzero_si256();
                __m256i shi = _mm256_setzero_si256();
                for (int j = 0; j < 4; j++) {
                    const __m256i w  = _mm256_loadu_si256((const __m256i *) (b.qs + 32 * j));
                    const __m256i lo = W::val(_mm256_and_si256(w, m4b));                       // k 4j .. 4j+3
                    const __m256i hi = W::val(_mm256_and_si256(_mm256_srli_epi16(w, 4), m4b)); // k 16+4j .. 16+4j+3
                    sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(lo, ggml_dsc_bcast4(q + 4 * j)));
                    if constexpr (W::SPLIT16) {
                        shi = _mm256_add_epi16(shi, _mm256_maddubs_epi16(hi, ggml_dsc_bcast4(q + 16 + 4 * j)));
                    } else {
                        sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(hi, ggml_dsc_bcast4(q + 16 + 4 * j)));
                    }
                }
                __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(sum, ones16), off[bb]);
                if constexpr (W::SPLIT16) {
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(shi, ones16));
                }
#endif
                const __m256 col_scale = W::scales(b);
                return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(col_scale, rsc[bb]), acc);
            };

            // NS column groups at a time (GGML_DSC_GEMV_STREAMS or 1), one from each of that many even parts of the
            // call's groups, so each thread reads that many regions of memory at once: one stream per core
            // waits on memory latency, and with more lines in flight the arithmetic also overlaps more of
            // the wait (benchmarks/gemv_stream.cpp, AMX Xeon, 2 threads from DRAM: 30-32 -> 35-37 GB/s).
            // Each group's sums are the same as one at a time.
            const int ng  = nc / 8;
            const int per = (ng + NS - 1) / NS; // groups per stream; only the last streams can run short
            for (int x = 0; x < per; x++) {
                const block_x8 *     p[NS];
                float *              d[NS];
                __m256               acc[NS];
                int ns = 0;
                for (int t = 0; t < NS && x + t * per < ng; t++, ns++) {
                    p[t]   = b_ptr_start + (int64_t) (x + t * per) * nb + b0;
                    d[t]   = s + (int64_t) y * bs + (x + t * per) * 8;
                    acc[t] = b0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(d[t]);
                }
                if (ns == NS) {
                    // a constant trip count, so the NS accumulators stay in registers (the last pass may be short)
                    for (int bb = 0; bb < kc; bb++) {
#pragma GCC unroll 4
                        for (int t = 0; t < NS; t++) {
                            acc[t] = block(p[t][bb], bb, acc[t]);
                        }
                    }
                } else {
                    for (int bb = 0; bb < kc; bb++) {
                        for (int t = 0; t < ns; t++) {
                            acc[t] = block(p[t][bb], bb, acc[t]);
                        }
                    }
                }
                for (int t = 0; t < ns; t++) {
                    _mm256_storeu_ps(d[t], acc[t]);
                }
            }
        }
    }
}

// GGML_DSC_GEMV_STREAMS or one stream, as ggml_dsc_gemv_streams() says (dsc/gemv-streams.c)
template <typename W>
static void gemv_w4_8x4u_q8_0_avx2(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
    if (ggml_dsc_gemv_streams() == 1) {
        gemv_w4_8x4u_q8_0_avx2_ns<W, 1>(n, s, bs, vx, vy, nr, nc);
    } else {
        gemv_w4_8x4u_q8_0_avx2_ns<W, GGML_DSC_GEMV_STREAMS>(n, s, bs, vx, vy, nr, nc);
    }
}

// GEMM, 4 activation rows (block_q8_0x4: row m's k 8g .. 8g+7 at qs[32g + 8m]) x 8 columns.
// Every 4-byte activation group meets every column group. Broadcasting it in the inner loop costs a
// shuffle-pipe uop per maddubs, and the FP pipes are what bounds this loop, so the 4 rows' groups of
// GGML_DSC_Q4_0_KC blocks are broadcast once into a buffer that maddubs reads as memory operands. The
// k range is walked in chunks of that many blocks so the buffer stays in L1; partial sums wait in dst.
// Each weight block is unpacked once for the 4 rows.
// rows: the 4 activation rows' output rows (vy: their block_q8_0x4 row group)
// MXFP4 (SPLIT16) widens each row's int16 sum after the first two weight loads.
template <typename W>
static void gemm_w4_8x4u_q8_0_avx2(int n, float * const * rows, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nc) {
    const int nb = n / QK8_0;

    using block_x8 = typename W::block;
    const block_x8     * b_ptr_start = (const block_x8     *) vx;
    const block_q8_0x4 * a_ptr_start = (const block_q8_0x4 *) vy;

    const __m256i m4b     = _mm256_set1_epi8(0x0F);
    const __m256i ones16  = _mm256_set1_epi16(1);

    __m256i act[GGML_DSC_Q4_0_KC][8][4]; // [block][k-group: 2j = low nibbles of load j, 2j+1 = high][row]
    __m256i off[GGML_DSC_Q4_0_KC][4];    // 8 * sum(activations) per row
    __m256  rsc[GGML_DSC_Q4_0_KC][4];    // activation scale per row

    {
        const block_q8_0x4 * a_ptr = a_ptr_start;

        for (int b0 = 0; b0 < nb; b0 += GGML_DSC_Q4_0_KC) {
            const int kc = MIN(nb - b0, GGML_DSC_Q4_0_KC);

            for (int bb = 0; bb < kc; bb++) {
                ggml_dsc_q4_0_prep_rows<W::OFF, 4>(a_ptr[b0 + bb], 0, act[bb], off[bb], rsc[bb]);
            }

            for (int x = 0; x < nc / 8; x++) {
                const block_x8 *     b_ptr = b_ptr_start + (int64_t) x * nb + b0;
                float * dst0 = rows[0] + x * 8;
                float * dst1 = rows[1] + x * 8;
                float * dst2 = rows[2] + x * 8;
                float * dst3 = rows[3] + x * 8;

                __m256 acc0, acc1, acc2, acc3;
                if (b0 == 0) {
                    acc0 = acc1 = acc2 = acc3 = _mm256_setzero_ps();
                } else {
                    acc0 = _mm256_loadu_ps(dst0);
                    acc1 = _mm256_loadu_ps(dst1);
                    acc2 = _mm256_loadu_ps(dst2);
                    acc3 = _mm256_loadu_ps(dst3);
                }

                for (int bb = 0; bb < kc; bb++) {
                    const __m256i (*e)[4] = act[bb];
                    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
                    __m256i t0 = s0, t1 = s0, t2 = s0, t3 = s0; // SPLIT16: loads 0-1 widened
                    for (int j = 0; j < 4; j++) {
                        if (W::SPLIT16 && j == 2) {
                            t0 = _mm256_madd_epi16(s0, ones16); t1 = _mm256_madd_epi16(s1, ones16);
                            t2 = _mm256_madd_epi16(s2, ones16); t3 = _mm256_madd_epi16(s3, ones16);
                            s0 = s1 = s2 = s3 = _mm256_setzero_si256();
                        }
                        const __m256i w  = _mm256_loadu_si256((const __m256i *) (b_ptr[bb].qs + 32 * j));
                        const __m256i lo = W::val(_mm256_and_si256(w, m4b));
                        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(lo, e[2 * j][0]));
                        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(lo, e[2 * j][1]));
                        s2 = _mm256_add_epi16(s2, _mm256_maddubs_epi16(lo, e[2 * j][2]));
                        s3 = _mm256_add_epi16(s3, _mm256_maddubs_epi16(lo, e[2 * j][3]));
                        GGML_DSC_KEEP4(s0, s1, s2, s3);
                        const __m256i hi = W::val(_mm256_and_si256(_mm256_srli_epi16(w, 4), m4b));
                        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(hi, e[2 * j + 1][0]));
                        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(hi, e[2 * j + 1][1]));
                        s2 = _mm256_add_epi16(s2, _mm256_maddubs_epi16(hi, e[2 * j + 1][2]));
                        s3 = _mm256_add_epi16(s3, _mm256_maddubs_epi16(hi, e[2 * j + 1][3]));
                        GGML_DSC_KEEP4(s0, s1, s2, s3);
                    }
                    const __m256 col_scale = W::scales(b_ptr[bb]);
                    __m256i i0 = _mm256_madd_epi16(s0, ones16), i1 = _mm256_madd_epi16(s1, ones16);
                    __m256i i2 = _mm256_madd_epi16(s2, ones16), i3 = _mm256_madd_epi16(s3, ones16);
                    if constexpr (W::SPLIT16) {
                        i0 = _mm256_add_epi32(i0, t0); i1 = _mm256_add_epi32(i1, t1);
                        i2 = _mm256_add_epi32(i2, t2); i3 = _mm256_add_epi32(i3, t3);
                    }
                    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(i0, off[bb][0])), _mm256_mul_ps(col_scale, rsc[bb][0]), acc0);
                    acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(i1, off[bb][1])), _mm256_mul_ps(col_scale, rsc[bb][1]), acc1);
                    acc2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(i2, off[bb][2])), _mm256_mul_ps(col_scale, rsc[bb][2]), acc2);
                    acc3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(i3, off[bb][3])), _mm256_mul_ps(col_scale, rsc[bb][3]), acc3);
                }

                _mm256_storeu_ps(dst0, acc0);
                _mm256_storeu_ps(dst1, acc1);
                _mm256_storeu_ps(dst2, acc2);
                _mm256_storeu_ps(dst3, acc3);
            }
        }
    }
}

// GEMM, 8 activation rows (two block_q8_0x4 row groups) x 8 columns: the 4-row GEMM with each weight
// block unpacked (and its scales converted) once for eight rows instead of four, ~7% fewer vector uops
// per multiply-add. Eight int16 sums and eight float accumulators do not all fit in 16 registers next
// to the weights, so GCC keeps some accumulators on the stack (loads and stores, not vector-pipe uops).
// The broadcast buffer holds half as many blocks (GGML_DSC_Q4_0_KC8), so it stays at 16 KB. Per row the
// integer and float steps are the 4-row GEMM's, so results are bit-identical to it.
static void gemm_q4_0_8x4u_q8_0_avx2_r8(int n, float * const * rows, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nc) {
    const int nb = n / QK8_0;

    const block_q4_0x8 * b_ptr_start = (const block_q4_0x8 *) vx;
    const block_q8_0x4 * a_ptr_start = (const block_q8_0x4 *) vy;

    const __m256i m4b     = _mm256_set1_epi8(0x0F);
    const __m256i ones16  = _mm256_set1_epi16(1);

    __m256i act[GGML_DSC_Q4_0_KC8][8][8]; // [block][k-group][row]
    __m256i off[GGML_DSC_Q4_0_KC8][8];
    __m256  rsc[GGML_DSC_Q4_0_KC8][8];

    {
        for (int b0 = 0; b0 < nb; b0 += GGML_DSC_Q4_0_KC8) {
            const int kc = MIN(nb - b0, GGML_DSC_Q4_0_KC8);

            for (int h = 0; h < 2; h++) {
                const block_q8_0x4 * a_ptr = a_ptr_start + (int64_t) h * nb;
                for (int bb = 0; bb < kc; bb++) {
                    ggml_dsc_q4_0_prep_rows<ggml_dsc_w4_q4_0::OFF, 8>(a_ptr[b0 + bb], 4 * h, act[bb], off[bb], rsc[bb]);
                }
            }

            for (int x = 0; x < nc / 8; x++) {
                const block_q4_0x8 * b_ptr = b_ptr_start + (int64_t) x * nb + b0;

                __m256 acc[8];
                for (int r = 0; r < 8; r++) {
                    acc[r] = b0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(rows[r] + x * 8);
                }

                for (int bb = 0; bb < kc; bb++) {
                    const __m256i (*e)[8] = act[bb];
                    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
                    for (int j = 0; j < 4; j++) {
                        const __m256i w  = _mm256_loadu_si256((const __m256i *) (b_ptr[bb].qs + 32 * j));
                        const __m256i lo = _mm256_and_si256(w, m4b);
                        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(lo, e[2 * j][0]));
                        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(lo, e[2 * j][1]));
                        s2 = _mm256_add_epi16(s2, _mm256_maddubs_epi16(lo, e[2 * j][2]));
                        s3 = _mm256_add_epi16(s3, _mm256_maddubs_epi16(lo, e[2 * j][3]));
                        s4 = _mm256_add_epi16(s4, _mm256_maddubs_epi16(lo, e[2 * j][4]));
                        s5 = _mm256_add_epi16(s5, _mm256_maddubs_epi16(lo, e[2 * j][5]));
                        s6 = _mm256_add_epi16(s6, _mm256_maddubs_epi16(lo, e[2 * j][6]));
                        s7 = _mm256_add_epi16(s7, _mm256_maddubs_epi16(lo, e[2 * j][7]));
                        GGML_DSC_KEEP8(s0, s1, s2, s3, s4, s5, s6, s7);
                        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4b);
                        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(hi, e[2 * j + 1][0]));
                        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(hi, e[2 * j + 1][1]));
                        s2 = _mm256_add_epi16(s2, _mm256_maddubs_epi16(hi, e[2 * j + 1][2]));
                        s3 = _mm256_add_epi16(s3, _mm256_maddubs_epi16(hi, e[2 * j + 1][3]));
                        s4 = _mm256_add_epi16(s4, _mm256_maddubs_epi16(hi, e[2 * j + 1][4]));
                        s5 = _mm256_add_epi16(s5, _mm256_maddubs_epi16(hi, e[2 * j + 1][5]));
                        s6 = _mm256_add_epi16(s6, _mm256_maddubs_epi16(hi, e[2 * j + 1][6]));
                        s7 = _mm256_add_epi16(s7, _mm256_maddubs_epi16(hi, e[2 * j + 1][7]));
                        GGML_DSC_KEEP8(s0, s1, s2, s3, s4, s5, s6, s7);
                    }
                    const __m256 col_scale = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) b_ptr[bb].d));
                    const __m256i sr[8] = { s0, s1, s2, s3, s4, s5, s6, s7 };
                    for (int r = 0; r < 8; r++) {
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_madd_epi16(sr[r], ones16), off[bb][r])), _mm256_mul_ps(col_scale, rsc[bb][r]), acc[r]);
                    }
                }

                for (int r = 0; r < 8; r++) {
                    _mm256_storeu_ps(rows[r] + x * 8, acc[r]);
                }
            }
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// deepseek-cpu: the q4_0 GEMM for AVX-512 VNNI, on the same layout. A 512-bit vector holds load j of
// two column groups (16 columns x 4 k), and vpdpbusd (u8 x s8, four products summed into each int32
// lane) replaces maddubs + the int16 add + the widening madd; a row's 4-byte activation groups enter as
// broadcasts straight from block_q8_0x4, so there is no broadcast buffer. Each block's int32 sum starts
// at -8 * sum(activations) (the unsigned-nibble offset), so it is exactly the AVX2 GEMM's isum, and the
// float steps are its own (isum -> float, times d_w * d_a, one FMA per block in k order): results are
// bit-identical to it. A last odd column group runs with the upper half zero and is stored as 8.
// Decode keeps the AVX2 GEMV: a 512-bit one measured 1.6x faster with the weights in L2 but 2x slower
// streaming them from memory on the Zen 4 here, where the AVX2 GEMV is already near the bandwidth.
// 32 bytes at lo in the low half, 32 at hi (or zeros, hi == nullptr) in the high half: one 512-bit
// vector of two 8-column groups
static inline __m512i ggml_dsc_load2x256(const void * lo, const void * hi) {
    const __m256i l = _mm256_loadu_si256((const __m256i *) lo);
    if (hi == nullptr) {
        return _mm512_zextsi256_si512(l);
    }
    return _mm512_inserti64x4(_mm512_zextsi256_si512(l), _mm256_loadu_si256((const __m256i *) hi), 1);
}

// the 8 f16 values at lo, then the 8 at hi (or zeros), as 16 floats
static inline __m512 ggml_dsc_cvtph16(const ggml_half * lo, const ggml_half * hi) {
    const __m128i l = _mm_loadu_si128((const __m128i *) lo);
    const __m128i h = hi ? _mm_loadu_si128((const __m128i *) hi) : _mm_setzero_si128();
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_zextsi128_si256(l), h, 1));
}

static inline __m512i ggml_dsc_bcast4_512(const int8_t * p) {
    int32_t v;
    memcpy(&v, p, sizeof(v));
    return _mm512_set1_epi32(v);
}

// R = 4 or 8 activation rows (one or two block_q8_0x4 row groups) x 16 columns per pass. Row m of a
// block_q8_0x4 has its k 4j .. 4j+3 at qs[32 (j / 2) + 8 m + 4 (j % 2)] (+64 for k 16 + 4j). Per row
// the steps do not depend on R, so 4- and 8-row passes give bit-identical rows.
// the 16 column scales of two 8-column groups (p1 == nullptr: zeros)
static inline __m512 ggml_dsc_col_scales16(const block_q4_0x8 * p0, const block_q4_0x8 * p1) {
    return ggml_dsc_cvtph16(p0->d, p1 ? p1->d : nullptr);
}

static inline __m512 ggml_dsc_col_scales16(const block_mxfp4x8 * p0, const block_mxfp4x8 * p1) {
    const __m256 lo = ggml_dsc_w4_mxfp4::scales(*p0);
    const __m256 hi = p1 ? ggml_dsc_w4_mxfp4::scales(*p1) : _mm256_setzero_ps();
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

template <typename W, int R>
static void gemm_w4_8x4u_q8_0_vnni512(int n, float * const * rows, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nc) {
    const int nb = n / QK8_0;
    const int ng = nc / 8;

    using block_x8 = typename W::block;
    const block_x8     * b_ptr_start = (const block_x8     *) vx;
    const block_q8_0x4 * a_ptr_start = (const block_q8_0x4 *) vy;

    const __m512i m4b = _mm512_set1_epi8(0x0F);

    int32_t off[GGML_DSC_Q4_0_KC][R];
    float   rsc[GGML_DSC_Q4_0_KC][R];

    for (int b0 = 0; b0 < nb; b0 += GGML_DSC_Q4_0_KC) {
        const int kc = MIN(nb - b0, GGML_DSC_Q4_0_KC);

        for (int h = 0; h < R / 4; h++) {
            const block_q8_0x4 * a_ptr = a_ptr_start + (int64_t) h * nb + b0;
            for (int bb = 0; bb < kc; bb++) {
                for (int m = 0; m < 4; m++) {
                    int32_t sum = 0;
                    for (int g = 0; g < 4; g++) {
                        for (int i = 0; i < 8; i++) {
                            sum += a_ptr[bb].qs[32 * g + 8 * m + i];
                        }
                    }
                    off[bb][4 * h + m] = -W::OFF * sum;
                    rsc[bb][4 * h + m] = GGML_CPU_FP16_TO_FP32(a_ptr[bb].d[m]);
                }
            }
        }

        for (int x = 0; x < ng; x += 2) {
            const bool two = x + 1 < ng;
            const block_x8 *     p0 = b_ptr_start + (int64_t) x * nb + b0;
            const block_x8 *     p1 = two ? p0 + nb : nullptr;
            const __mmask16 mask = two ? 0xFFFF : 0x00FF;

            __m512 acc[R];
            for (int r = 0; r < R; r++) {
                acc[r] = b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, rows[r] + x * 8);
            }

            for (int bb = 0; bb < kc; bb++) {
                __m512i sr[R];
                for (int r = 0; r < R; r++) {
                    sr[r] = _mm512_set1_epi32(off[bb][r]);
                }
                for (int j = 0; j < 4; j++) {
                    const __m512i w  = ggml_dsc_load2x256(p0[bb].qs + 32 * j, p1 ? p1[bb].qs + 32 * j : nullptr);
                    const __m512i lo = W::val(_mm512_and_si512(w, m4b));
                    const __m512i hi = W::val(_mm512_and_si512(_mm512_srli_epi16(w, 4), m4b));
                    const int o = 32 * (j >> 1) + 4 * (j & 1);
                    for (int r = 0; r < R; r++) {
                        const int8_t * q = a_ptr_start[(int64_t) (r / 4) * nb + b0 + bb].qs + o + 8 * (r % 4);
                        sr[r] = _mm512_dpbusd_epi32(sr[r], lo, ggml_dsc_bcast4_512(q));
                        sr[r] = _mm512_dpbusd_epi32(sr[r], hi, ggml_dsc_bcast4_512(q + 64));
                    }
                }
                const __m512 col_scale = ggml_dsc_col_scales16(p0 + bb, p1 ? p1 + bb : nullptr);
                for (int r = 0; r < R; r++) {
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sr[r]), _mm512_mul_ps(col_scale, _mm512_set1_ps(rsc[bb][r])), acc[r]);
                }
            }

            for (int r = 0; r < R; r++) {
                _mm512_mask_storeu_ps(rows[r] + x * 8, mask, acc[r]);
            }
        }
    }
}
#define GGML_DSC_VNNI512 1
#endif

// deepseek-cpu: q6_K's 6-bit quants of 8 columns as q - 32 bytes, k 4t..4t+3 of the 8 columns per vector
// (an 8 x 8 transpose of the columns' dwords), with the per-column terms the GEMM needs
void ggml_dsc_make_q6_Kx8u(const block_q6_K * const * in, block_q6_Kx8u * out) {
    const __m256i m4    = _mm256_set1_epi8(0x0F);
    const __m256i m3    = _mm256_set1_epi8(0x03);
    const __m256i o32   = _mm256_set1_epi8(32);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256i v[8][8]; // [column][u]: elements 32 u .. 32 u + 31
    for (int c = 0; c < 8; c++) {
        const block_q6_K & x = *in[c];
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *) (x.ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *) (x.ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *) (x.qh + 32 * h));
            // elements 128 h + 32 i + l: low 4 bits from ql, high 2 from bits 2 i of qh[l]
            v[c][4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            v[c][4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            v[c][4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
            v[c][4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
        }
        int32_t corr = 0;
        for (int u = 0; u < 8; u++) {
            v[c][u] = _mm256_sub_epi8(v[c][u], o32);
            // sums of the two 16-value groups of this vector (groups 2 u, 2 u + 1)
            __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v[c][u]), ones16);
            s = _mm256_hadd_epi32(s, s);
            s = _mm256_hadd_epi32(s, s);
            corr += x.scales[2 * u] * _mm256_extract_epi32(s, 0) + x.scales[2 * u + 1] * _mm256_extract_epi32(s, 4);
        }
        out->d[c]    = GGML_CPU_FP16_TO_FP32(x.d);
        out->corr[c] = 128 * corr;
        for (int j = 0; j < 16; j++) {
            out->scales[8 * j + c] = x.scales[j];
        }
    }
    for (int u = 0; u < 8; u++) {
        const __m256i cols[8] = { v[0][u], v[1][u], v[2][u], v[3][u], v[4][u], v[5][u], v[6][u], v[7][u] };
        dsc_store_transpose8x8_epi32((__m256i *) (out->qs + 256 * u), cols);
    }
}

// deepseek-cpu: R activation rows (q8_K) x 8 columns of block_q6_Kx8u. A row's 4 bytes k 4t..4t+3,
// broadcast and offset by 128 to unsigned, meet vector t of q - 32 in one maddubs; products are
// <= 255 * 32, so two maddubs (8 products a lane) still fit int16, and the madd that widens them applies
// the group's scale. sum((a + 128)(q - 32)) - 128 sum(q - 32) is the exact integer q6_K . q8_K sum, the
// second term per column only (corr), so no per-row activation sums are needed.
template <int R>
static void gemm_q6_K_x8u_avx2(int n, float * const * out, const block_q6_Kx8u * W, const block_q8_K * const * a, int nc) {
    const int nb = n / QK_K;
    const __m128i rep2 = _mm_set_epi8(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m256i flip = _mm256_set1_epi8((char) 0x80);
    __m256i act[64][R];
    float   rd[R];
    for (int b = 0; b < nb; b++) {
        for (int m = 0; m < R; m++) {
            for (int t = 0; t < 64; t++) {
                act[t][m] = _mm256_xor_si256(ggml_dsc_bcast4(a[m][b].qs + 4 * t), flip);
            }
            rd[m] = a[m][b].d;
        }
        for (int x = 0; x < nc / 8; x++) {
            const block_q6_Kx8u & w = W[(int64_t) x * nb + b];
            __m256i isum[R];
            for (int m = 0; m < R; m++) {
                isum[m] = _mm256_setzero_si256();
            }
            for (int j = 0; j < 16; j++) {
                const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *) (w.scales + 8 * j)), rep2));
                for (int h = 0; h < 2; h++) {
                    const int t = 4 * j + 2 * h;
                    const __m256i w0 = _mm256_loadu_si256((const __m256i *) (w.qs + 32 * t));
                    const __m256i w1 = _mm256_loadu_si256((const __m256i *) (w.qs + 32 * t + 32));
                    for (int m = 0; m < R; m++) {
                        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(act[t][m], w0), _mm256_maddubs_epi16(act[t + 1][m], w1));
                        isum[m] = _mm256_add_epi32(isum[m], _mm256_madd_epi16(p, sc));
                    }
                }
            }
            const __m256  cd   = _mm256_loadu_ps(w.d);
            const __m256i corr = _mm256_loadu_si256((const __m256i *) w.corr);
            for (int m = 0; m < R; m++) {
                float * dst = out[m] + 8 * x;
                __m256 v = b == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(dst);
                v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[m], corr)), _mm256_mul_ps(cd, _mm256_set1_ps(rd[m])), v);
                _mm256_storeu_ps(dst, v);
            }
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// deepseek-cpu: the same product with AVX-512 VNNI: vectors t and t + 1 (adjacent in block_q6_Kx8u) in
// one 512-bit register, one dpbusd per pair instead of two maddubs, an add and a madd. The four
// vectors of scale group j add up exactly in int32 (16 products <= 255 * 32 each) before one multiply
// by the group's scale; the integer sums, and so the results, are the AVX2 kernel's bit for bit.
template <int R>
static void gemm_q6_K_x8u_vnni(int n, float * const * out, const block_q6_Kx8u * W, const block_q8_K * const * a, int nc) {
    const int nb = n / QK_K;
    const __m512i flip = _mm512_set1_epi8((char) 0x80);
    __m512i act[32][R];
    float   rd[R];
    for (int b = 0; b < nb; b++) {
        for (int m = 0; m < R; m++) {
            for (int p = 0; p < 32; p++) {
                const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(ggml_dsc_bcast4(a[m][b].qs + 8 * p)),
                                                     ggml_dsc_bcast4(a[m][b].qs + 8 * p + 4), 1);
                act[p][m] = _mm512_xor_si512(v, flip);
            }
            rd[m] = a[m][b].d;
        }
        for (int x = 0; x < nc / 8; x++) {
            const block_q6_Kx8u & w = W[(int64_t) x * nb + b];
            __m512i isum[R];
            for (int m = 0; m < R; m++) {
                isum[m] = _mm512_setzero_si512();
            }
            for (int j = 0; j < 16; j++) {
                const __m512i sc = _mm512_broadcast_i64x4(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) (w.scales + 8 * j))));
                const __m512i w0 = _mm512_loadu_si512((const void *) (w.qs + 128 * j));
                const __m512i w1 = _mm512_loadu_si512((const void *) (w.qs + 128 * j + 64));
                for (int m = 0; m < R; m++) {
                    const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), act[2 * j][m], w0),
                                                          act[2 * j + 1][m], w1);
                    isum[m] = _mm512_add_epi32(isum[m], _mm512_mullo_epi32(s, sc));
                }
            }
            const __m256  cd   = _mm256_loadu_ps(w.d);
            const __m256i corr = _mm256_loadu_si256((const __m256i *) w.corr);
            for (int m = 0; m < R; m++) {
                const __m256i s = _mm256_add_epi32(_mm512_castsi512_si256(isum[m]), _mm512_extracti64x4_epi64(isum[m], 1));
                float * dst = out[m] + 8 * x;
                __m256 v = b == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(dst);
                v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s, corr)), _mm256_mul_ps(cd, _mm256_set1_ps(rd[m])), v);
                _mm256_storeu_ps(dst, v);
            }
        }
    }
}
#define DSC_GEMM_Q6_K gemm_q6_K_x8u_vnni
#else
#define DSC_GEMM_Q6_K gemm_q6_K_x8u_avx2
#endif

void ggml_dsc_gemm_q6_K_x8u(int n, float * const * out, int nr, const block_q6_Kx8u * W, const block_q8_K * const * a, int nc) {
    int r = 0;
    for (; r + 8 <= nr; r += 8) {
        DSC_GEMM_Q6_K<8>(n, out + r, W, a + r, nc);
    }
    for (; r + 4 <= nr; r += 4) {
        DSC_GEMM_Q6_K<4>(n, out + r, W, a + r, nc);
    }
    for (; r < nr; r++) {
        DSC_GEMM_Q6_K<1>(n, out + r, W, a + r, nc);
    }
}

// deepseek-cpu: nr (a multiple of 4) activation rows, row r's output at rows[r]: eights, then a last four
template <typename W>
static void ggml_dsc_gemm_w4_rows(int n, float * const * rows, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
    const block_q8_0x4 * a = (const block_q8_0x4 *) vy;
    const int nb = n / QK8_0;
    int y = 0;
#if defined(GGML_DSC_VNNI512)
    for (; y + 8 <= nr; y += 8) {
        gemm_w4_8x4u_q8_0_vnni512<W, 8>(n, rows + y, vx, a + (int64_t) (y / 4) * nb, nc);
    }
    for (; y + 4 <= nr; y += 4) {
        gemm_w4_8x4u_q8_0_vnni512<W, 4>(n, rows + y, vx, a + (int64_t) (y / 4) * nb, nc);
    }
#else
    if constexpr (!W::SPLIT16) {  // the 8-row GEMM's int16 sums hold q4_0's eight pairs only
        for (; y + 8 <= nr; y += 8) {
            gemm_q4_0_8x4u_q8_0_avx2_r8(n, rows + y, vx, a + (int64_t) (y / 4) * nb, nc);
        }
    }
    for (; y + 4 <= nr; y += 4) {
        gemm_w4_8x4u_q8_0_avx2<W>(n, rows + y, vx, a + (int64_t) (y / 4) * nb, nc);
    }
#endif
}

void ggml_dsc_gemm_q4_0_rows(int n, float * const * rows, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
    ggml_dsc_gemm_w4_rows<ggml_dsc_w4_q4_0>(n, rows, vx, vy, nr, nc);
}
#endif // __AVX2__

#include "dsc-q4k-scales.h"


#if GGML_DSC_Q4_K_4U
// deepseek-cpu: GEMV (one activation row) for q4_K in the 4-byte interleave: each load of 8 columns x
// 4 k is unpacked into sub-blocks 2j (low nibbles) and 2j+1 (high), each meeting a 4-byte broadcast of
// the row in one maddubs. The integer sums are exact, and the float steps are the stock kernel's
// (isum x (d x d_a) and mins x (dmin x d_a) accumulated super-block by super-block, subtracted at the
// end), so results are those of the broadcast q4_K GEMV on the 8x8 layout.
template <int NS>
static void gemv_q4_K_8x4u_q8_K_avx2_ns(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
    const int nb = n / QK_K;

    const block_q4_Kx8 * b_ptr_start = (const block_q4_Kx8 *) vx;
    const block_q8_K   * a_ptr_start = (const block_q8_K   *) vy;

    const __m256i m4b  = _mm256_set1_epi8(0x0F);
    const __m128i rep2 = _mm_set_epi8(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);

    for (int y = 0; y < nr; y++) {
        const block_q8_K * a_ptr = a_ptr_start + (int64_t) y * nb;

        // super-block b of one column group (w) into acc and accm
        auto block = [&](const block_q4_Kx8 & w, int b, __m256 & acc, __m256 & accm) {
            const int8_t * a = a_ptr[b].qs;
            // 18 lines per 1152-byte block: its d, dmin and scales here, its qs 256 bytes per j below
            const char * pf = (const char *) &w + GGML_DSC_GEMV_PREFETCH;
            _mm_prefetch(pf, _MM_HINT_T0);
            _mm_prefetch(pf + 64, _MM_HINT_T0);

            __m128i dec[8];
            ggml_dsc_q4_K_decode_scales(w.scales, dec);

            const __m256i im = ggml_dsc_q4_K_row_mins(dec, a_ptr[b].bsums);

            __m256i isum = _mm256_setzero_si256();
            for (int j = 0; j < 4; j++) {
                const uint8_t * q = w.qs + 256 * j;
                for (int l = 0; l < 4; l++) {
                    _mm_prefetch((const char *) q + GGML_DSC_GEMV_PREFETCH + 64 * l, _MM_HINT_T0);
                }
                __m256i slo = _mm256_setzero_si256(), shi = _mm256_setzero_si256();
                for (int t = 0; t < 8; t++) {
                    const __m256i r = _mm256_loadu_si256((const __m256i *) (q + 32 * t));
                    slo = _mm256_add_epi16(slo, _mm256_maddubs_epi16(_mm256_and_si256(r, m4b), ggml_dsc_bcast4(a + 64 * j + 4 * t)));
                    shi = _mm256_add_epi16(shi, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(r, 4), m4b), ggml_dsc_bcast4(a + 64 * j + 32 + 4 * t)));
                }
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(slo, _mm256_cvtepu8_epi16(_mm_shuffle_epi8(dec[2 * j], rep2))));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(shi, _mm256_cvtepu8_epi16(_mm_shuffle_epi8(dec[2 * j + 1], rep2))));
            }

            const __m256 row_d = _mm256_set1_ps(a_ptr[b].d);
            acc  = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w.d)), row_d), acc);
            accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w.dmin)), row_d), accm);
        };

        // NS column groups at a time (GGML_DSC_GEMV_STREAMS or 1) from as many even parts of the groups, as in the
        // q4_0 GEMV above: that many memory streams per thread, each group's sums unchanged
        const int ng  = nc / 8;
        const int per = (ng + NS - 1) / NS;
        for (int x = 0; x < per; x++) {
            const block_q4_Kx8 * p[NS];
            __m256 acc[NS], accm[NS];
            int ns = 0;
            for (int t = 0; t < NS && x + t * per < ng; t++, ns++) {
                p[t]    = b_ptr_start + (int64_t) (x + t * per) * nb;
                acc[t]  = _mm256_setzero_ps();
                accm[t] = _mm256_setzero_ps();
            }
            for (int b = 0; b < nb; b++) {
                for (int t = 0; t < ns; t++) {
                    block(p[t][b], b, acc[t], accm[t]);
                }
            }
            for (int t = 0; t < ns; t++) {
                _mm256_storeu_ps(s + (int64_t) y * bs + (x + t * per) * 8, _mm256_sub_ps(acc[t], accm[t]));
            }
        }
    }
}

// GGML_DSC_GEMV_STREAMS or one stream, as ggml_dsc_gemv_streams() says (dsc/gemv-streams.c)
static void gemv_q4_K_8x4u_q8_K_avx2(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
    if (ggml_dsc_gemv_streams() == 1) {
        gemv_q4_K_8x4u_q8_K_avx2_ns<1>(n, s, bs, vx, vy, nr, nc);
    } else {
        gemv_q4_K_8x4u_q8_K_avx2_ns<GGML_DSC_GEMV_STREAMS>(n, s, bs, vx, vy, nr, nc);
    }
}
#endif

#if GGML_DSC_Q4_K_4U
// deepseek-cpu: GEMM for q4_K in the 4-byte interleave (see make_block_q4_Kx8), R = 4 or 8 activation
// rows. Each 256-bit load holds 4 consecutive k of the 8 columns (low nibbles: sub-block 2j, high:
// 2j+1), so a row's 4 activation bytes, broadcast, meet it in one maddubs with no shuffle of either
// operand, and the products come out two int16 per column in column order. q4_K nibbles are unsigned,
// so no offset is needed; the 6-bit sub-block scales multiply the int16 sums in the madd that widens
// them (|16 products| <= 16 * 15 * 128 < 2^15), and the mins enter once per super-block as
// mins x (sub-block sums of the activations, from bsums). One int16 sum per row (the 8-byte interleave
// needed two) lets eight rows share each unpacked weight load: maddubs + add pairs issue at ~1.6 per
// cycle on Zen 3, and eight rows leave ~30 other vector uops per 64 pairs where four rows left ~60.
// The R rows' broadcasts of one super-block (R x 2 KB, L1) are made once and read by maddubs as
// memory operands; the partial sums of a super-block wait in dst. The integer sums are exact; the
// float steps differ from the stock kernel only in order (the mins are subtracted per super-block).
// rows: the R activation rows' output rows (vy: their R/4 block_q8_Kx4 row groups, nb apart).
template <int R>
static void gemm_q4_K_8x4u_q8_K_avx2(int n, float * const * rows, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nc) {
    static_assert(R == 4 || R == 8, "4 or 8 rows");
    const int nb = n / QK_K;

    const block_q4_Kx8 * b_ptr_start = (const block_q4_Kx8 *) vx;
    const block_q8_Kx4 * a_ptr_start = (const block_q8_Kx4 *) vy;

    const __m256i m4b  = _mm256_set1_epi8(0x0F);
    const __m128i rep2 = _mm_set_epi8(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0); // a column's scale over its two int16

    __m256i act[8][8][R]; // [sub-block][k-group t: k 4t .. 4t+3][row]
    int32_t ssum[R][4];   // [row][p]: sums of sub-blocks 2p (low 16 bits), 2p+1 (high)
    float   rd[R];

    {
        for (int b = 0; b < nb; b++) {
            for (int h = 0; h < R / 4; h++) {
                const block_q8_Kx4 & a = a_ptr_start[(int64_t) h * nb + b];
                for (int sub = 0; sub < 8; sub++) {
                    for (int t = 0; t < 8; t++) {
                        for (int m = 0; m < 4; m++) {
                            // block_q8_Kx4 interleaves the 4 rows 8 bytes at a time: row m's k 32 sub + 4t
                            act[sub][t][4 * h + m] = ggml_dsc_bcast4(a.qs + 128 * sub + 32 * (t >> 1) + 8 * m + 4 * (t & 1));
                        }
                    }
                }
                for (int m = 0; m < 4; m++) {
                    for (int p = 0; p < 4; p++) {
                        // bsums (16 per row) for sub-blocks 2p, 2p+1 of row m at 16p + 4m + {0,1}, {2,3}
                        const int16_t * bsm = a.bsums + 16 * p + 4 * m;
                        const int s0 = bsm[0] + bsm[1];
                        const int s1 = bsm[2] + bsm[3];
                        ssum[4 * h + m][p] = (int32_t) ((uint32_t) (uint16_t) s0 | ((uint32_t) (uint16_t) s1 << 16));
                    }
                    rd[4 * h + m] = a.d[m];
                }
            }

            for (int x = 0; x < nc / 8; x++) {
                const block_q4_Kx8 & w = b_ptr_start[(int64_t) x * nb + b];

                __m128i dec[8];
                ggml_dsc_q4_K_decode_scales(w.scales, dec);

                __m256i isum[R];
                for (int m = 0; m < R; m++) {
                    isum[m] = _mm256_setzero_si256();
                }
                for (int sub = 0; sub < 8; sub++) {
                    const uint8_t * q = w.qs + 256 * (sub >> 1);
                    const bool high = sub & 1;
                    const __m256i (*e)[R] = act[sub];
                    __m256i sm[R];
                    for (int m = 0; m < R; m++) {
                        sm[m] = _mm256_setzero_si256();
                    }
                    for (int t = 0; t < 8; t++) {
                        const __m256i r  = _mm256_loadu_si256((const __m256i *) (q + 32 * t));
                        const __m256i wv = _mm256_and_si256(high ? _mm256_srli_epi16(r, 4) : r, m4b);
                        for (int m = 0; m < R; m++) {
                            sm[m] = _mm256_add_epi16(sm[m], _mm256_maddubs_epi16(wv, e[t][m]));
                        }
                        GGML_DSC_KEEP4(sm[0], sm[1], sm[2], sm[3]);
                        if constexpr (R == 8) {
                            GGML_DSC_KEEP4(sm[4], sm[5], sm[6], sm[7]);
                        }
                    }
                    const __m256i sc = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(dec[sub], rep2));
                    for (int m = 0; m < R; m++) {
                        isum[m] = _mm256_add_epi32(isum[m], _mm256_madd_epi16(sm[m], sc));
                    }
                }

                const __m256 col_d    = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w.d));
                const __m256 col_dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w.dmin));
                // mins: int16 pairs (min of sub-block 2p, 2p+1) per column
                __m256i mins_p[4];
                for (int p = 0; p < 4; p++) {
                    mins_p[p] = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(dec[2 * p], dec[2 * p + 1]));
                }
                for (int m = 0; m < R; m++) {
                    const __m256i im = _mm256_add_epi32(
                            _mm256_add_epi32(_mm256_madd_epi16(mins_p[0], _mm256_set1_epi32(ssum[m][0])),
                                             _mm256_madd_epi16(mins_p[1], _mm256_set1_epi32(ssum[m][1]))),
                            _mm256_add_epi32(_mm256_madd_epi16(mins_p[2], _mm256_set1_epi32(ssum[m][2])),
                                             _mm256_madd_epi16(mins_p[3], _mm256_set1_epi32(ssum[m][3]))));
                    const __m256 row_d = _mm256_set1_ps(rd[m]);
                    float * dst = rows[m] + x * 8;
                    __m256 v = b == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(dst);
                    v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[m]), _mm256_mul_ps(col_d, row_d), v);
                    v = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(col_dmin, row_d), v);
                    _mm256_storeu_ps(dst, v);
                }
            }
        }
    }
}

#if defined(GGML_DSC_VNNI512)
// deepseek-cpu: the same GEMM for AVX-512 VNNI, 16 columns (two column groups) per pass, as for
// q4_0. Per sub-block, vpdpbusd sums a row's 32 products per column straight into int32 (eight of them,
// against broadcasts read from block_q8_Kx4), and one vpmulld applies the column's 6-bit scale: this
// replaces 8 maddubs + 8 int16 adds + the widening madd per row and 8 columns. The mins and the float
// steps are the AVX2 kernel's, and isum is the same integer, so results are bit-identical to it.
// One pass: R rows x 16 columns (TWO: column groups x and x + 1) of super-block b. The loops over
// sub-blocks and k-groups are unrolled (GCC: pragma), so the nibble half, the weight offsets and the
// activation offsets are constants and the accumulators stay in registers; with the loops rolled GCC
// computed each broadcast's address in scalar code and copied all R accumulators in and out of other
// registers on every k-group. Same instructions on the data, same order: bit-identical.
template <int R, bool TWO>
static inline void gemm_q4_K_8x4u_q8_K_vnni512_pass(const block_q4_Kx8 & w0, const block_q4_Kx8 & w1, const int8_t * const * aq,
                                                    const int32_t (*ssum)[4], const float * rd, float * const * rows, int x, bool first) {
    const __m512i m4b = _mm512_set1_epi8(0x0F);
    const __mmask16 mask = TWO ? 0xFFFF : 0x00FF;

    __m128i dec0[8], dec1[8];
    ggml_dsc_q4_K_decode_scales(w0.scales, dec0);
    if constexpr (TWO) {
        ggml_dsc_q4_K_decode_scales(w1.scales, dec1);
    } else {
        for (int i = 0; i < 8; i++) {
            dec1[i] = _mm_setzero_si128();
        }
    }

    __m512i isum[R];
#pragma GCC unroll 8
    for (int m = 0; m < R; m++) {
        isum[m] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int sub = 0; sub < 8; sub++) {
        const int qo = 256 * (sub >> 1);
        __m512i sm[R];
#pragma GCC unroll 8
        for (int m = 0; m < R; m++) {
            sm[m] = _mm512_setzero_si512();
        }
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            const __m512i r  = ggml_dsc_load2x256(w0.qs + qo + 32 * t, TWO ? w1.qs + qo + 32 * t : nullptr);
            const __m512i wv = _mm512_and_si512((sub & 1) ? _mm512_srli_epi16(r, 4) : r, m4b);
            const int ao = 128 * sub + 32 * (t >> 1) + 4 * (t & 1);
#pragma GCC unroll 8
            for (int m = 0; m < R; m++) {
                sm[m] = _mm512_dpbusd_epi32(sm[m], wv, ggml_dsc_bcast4_512(aq[m / 4] + ao + 8 * (m % 4)));
            }
        }
        // the 16 columns' scales of this sub-block (bytes 0-7 of dec: scales, 8-15: mins)
        const __m512i sc = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(dec0[sub], dec1[sub]));
#pragma GCC unroll 8
        for (int m = 0; m < R; m++) {
            isum[m] = _mm512_add_epi32(isum[m], _mm512_mullo_epi32(sm[m], sc));
        }
    }

    const __m512 col_d    = ggml_dsc_cvtph16(w0.d, TWO ? w1.d : nullptr);
    const __m512 col_dmin = ggml_dsc_cvtph16(w0.dmin, TWO ? w1.dmin : nullptr);
    __m512i mins_p[4];
    for (int p = 0; p < 4; p++) {
        mins_p[p] = _mm512_cvtepu8_epi16(_mm256_inserti128_si256(_mm256_zextsi128_si256(_mm_unpackhi_epi8(dec0[2 * p], dec0[2 * p + 1])),
                                                                 _mm_unpackhi_epi8(dec1[2 * p], dec1[2 * p + 1]), 1));
    }
#pragma GCC unroll 8
    for (int m = 0; m < R; m++) {
        const __m512i im = _mm512_add_epi32(
                _mm512_add_epi32(_mm512_madd_epi16(mins_p[0], _mm512_set1_epi32(ssum[m][0])),
                                 _mm512_madd_epi16(mins_p[1], _mm512_set1_epi32(ssum[m][1]))),
                _mm512_add_epi32(_mm512_madd_epi16(mins_p[2], _mm512_set1_epi32(ssum[m][2])),
                                 _mm512_madd_epi16(mins_p[3], _mm512_set1_epi32(ssum[m][3]))));
        const __m512 row_d = _mm512_set1_ps(rd[m]);
        float * dst = rows[m] + x * 8;
        __m512 v = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, dst);
        v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]), _mm512_mul_ps(col_d, row_d), v);
        v = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(col_dmin, row_d), v);
        _mm512_mask_storeu_ps(dst, mask, v);
    }
}

template <int R>
static void gemm_q4_K_8x4u_q8_K_vnni512(int n, float * const * rows, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nc) {
    static_assert(R == 4 || R == 8, "4 or 8 rows");
    const int nb = n / QK_K;
    const int ng = nc / 8;

    const block_q4_Kx8 * b_ptr_start = (const block_q4_Kx8 *) vx;
    const block_q8_Kx4 * a_ptr_start = (const block_q8_Kx4 *) vy;

    int32_t ssum[R][4]; // as in the AVX2 kernel: [row][p] sums of sub-blocks 2p (low 16 bits), 2p+1 (high)
    float   rd[R];

    for (int b = 0; b < nb; b++) {
        const int8_t * aq[R / 4];
        for (int h = 0; h < R / 4; h++) {
            const block_q8_Kx4 & a = a_ptr_start[(int64_t) h * nb + b];
            aq[h] = a.qs;
            for (int m = 0; m < 4; m++) {
                for (int p = 0; p < 4; p++) {
                    const int16_t * bsm = a.bsums + 16 * p + 4 * m;
                    const int s0 = bsm[0] + bsm[1];
                    const int s1 = bsm[2] + bsm[3];
                    ssum[4 * h + m][p] = (int32_t) ((uint32_t) (uint16_t) s0 | ((uint32_t) (uint16_t) s1 << 16));
                }
                rd[4 * h + m] = a.d[m];
            }
        }

        int x = 0;
        for (; x + 1 < ng; x += 2) {
            gemm_q4_K_8x4u_q8_K_vnni512_pass<R, true>(b_ptr_start[(int64_t) x * nb + b], b_ptr_start[(int64_t) (x + 1) * nb + b],
                                                      aq, ssum, rd, rows, x, b == 0);
        }
        if (x < ng) {
            const block_q4_Kx8 & w0 = b_ptr_start[(int64_t) x * nb + b];
            gemm_q4_K_8x4u_q8_K_vnni512_pass<R, false>(w0, w0, aq, ssum, rd, rows, x, b == 0);
        }
    }
}
#endif

// deepseek-cpu: nr (a multiple of 4) activation rows, row r's output at rows[r]: eights, then a last four
void ggml_dsc_gemm_q4_K_rows(int n, float * const * rows, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
    const block_q8_Kx4 * a = (const block_q8_Kx4 *) vy;
    const int nb = n / QK_K;
    int y = 0;
#if defined(GGML_DSC_VNNI512)
    for (; y + 8 <= nr; y += 8) {
        gemm_q4_K_8x4u_q8_K_vnni512<8>(n, rows + y, vx, a + (int64_t) (y / 4) * nb, nc);
    }
    for (; y + 4 <= nr; y += 4) {
        gemm_q4_K_8x4u_q8_K_vnni512<4>(n, rows + y, vx, a + (int64_t) (y / 4) * nb, nc);
    }
#else
    for (; y + 8 <= nr; y += 8) {
        gemm_q4_K_8x4u_q8_K_avx2<8>(n, rows + y, vx, a + (int64_t) (y / 4) * nb, nc);
    }
    for (; y + 4 <= nr; y += 4) {
        gemm_q4_K_8x4u_q8_K_avx2<4>(n, rows + y, vx, a + (int64_t) (y / 4) * nb, nc);
    }
#endif
}
#endif

// deepseek-cpu: the entry points the stock q4_0 8x8 kernels call first (true: done here). AVX2 builds
// repack q4_0 to the 4-byte unsigned interleave, which only these kernels read.
bool ggml_dsc_gemv_q4_0_8x8_q8_0(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
#if defined(__AVX2__)
    gemv_w4_8x4u_q8_0_avx2<ggml_dsc_w4_q4_0>(n, s, bs, vx, vy, nr, nc);
    return true;
#else
    GGML_UNUSED(n); GGML_UNUSED(s); GGML_UNUSED(bs); GGML_UNUSED(vx); GGML_UNUSED(vy); GGML_UNUSED(nr); GGML_UNUSED(nc);
    return false;
#endif
}

#if defined(__AVX2__)
// rows in eights, then a last four (nr is a multiple of 4)
template <typename W>
static void ggml_dsc_gemm_w4(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
    for (int y = 0; y < nr; y += 8) {
        float * rows[8];
        for (int r = 0; r < 8 && y + r < nr; r++) {
            rows[r] = s + (size_t) (y + r) * bs;
        }
        ggml_dsc_gemm_w4_rows<W>(n, rows, vx, (const block_q8_0x4 *) vy + (int64_t) (y / 4) * (n / QK8_0), MIN(8, nr - y), nc);
    }
}
#endif

bool ggml_dsc_gemm_q4_0_8x8_q8_0(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
#if defined(__AVX2__)
    ggml_dsc_gemm_w4<ggml_dsc_w4_q4_0>(n, s, bs, vx, vy, nr, nc);
    return true;
#else
    GGML_UNUSED(n); GGML_UNUSED(s); GGML_UNUSED(bs); GGML_UNUSED(vx); GGML_UNUSED(vy); GGML_UNUSED(nr); GGML_UNUSED(nc);
    return false;
#endif
}


// deepseek-cpu: the entry points the stock q4_K 8x8 kernels call first (true: done here), for the 4-byte interleave
bool ggml_dsc_gemv_q4_K_8x8_q8_K(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
#if GGML_DSC_Q4_K_4U
    gemv_q4_K_8x4u_q8_K_avx2(n, s, bs, vx, vy, nr, nc);
    return true;
#else
    GGML_UNUSED(n); GGML_UNUSED(s); GGML_UNUSED(bs); GGML_UNUSED(vx); GGML_UNUSED(vy); GGML_UNUSED(nr); GGML_UNUSED(nc);
    return false;
#endif
}

bool ggml_dsc_gemm_q4_K_8x8_q8_K(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
#if GGML_DSC_Q4_K_4U

    // deepseek-cpu: rows in eights, then a last four (nr is a multiple of 4)
    for (int y = 0; y < nr; y += 8) {
        float * rows[8];
        for (int r = 0; r < 8 && y + r < nr; r++) {
            rows[r] = s + (size_t) (y + r) * bs;
        }
        ggml_dsc_gemm_q4_K_rows(n, rows, vx, (const block_q8_Kx4 *) vy + (int64_t) (y / 4) * (n / QK_K), MIN(8, nr - y), nc);
    }
    return true;
#else
    GGML_UNUSED(n); GGML_UNUSED(s); GGML_UNUSED(bs); GGML_UNUSED(vx); GGML_UNUSED(vy); GGML_UNUSED(nr); GGML_UNUSED(nc);
    return false;
#endif
}

// deepseek-cpu: the entry points the stock MXFP4 8x8 kernels call first (true: done here). AVX2 builds
// repack MXFP4 (DeepSeek-V4's routed experts) to q4_0's 4-byte interleave; the kernels are q4_0's with
// the nibbles looked up in the e2m1 table and e8m0 column scales. Their integer block sums are exact
// and the float steps those of llama.cpp's MXFP4 8x8 kernels (isum x (d_w x d_a), block by block).
bool ggml_dsc_gemv_mxfp4_8x8_q8_0(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
#if defined(__AVX2__)
    gemv_w4_8x4u_q8_0_avx2<ggml_dsc_w4_mxfp4>(n, s, bs, vx, vy, nr, nc);
    return true;
#else
    GGML_UNUSED(n); GGML_UNUSED(s); GGML_UNUSED(bs); GGML_UNUSED(vx); GGML_UNUSED(vy); GGML_UNUSED(nr); GGML_UNUSED(nc);
    return false;
#endif
}

bool ggml_dsc_gemm_mxfp4_8x8_q8_0(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
#if defined(__AVX2__)
    ggml_dsc_gemm_w4<ggml_dsc_w4_mxfp4>(n, s, bs, vx, vy, nr, nc);
    return true;
#else
    GGML_UNUSED(n); GGML_UNUSED(s); GGML_UNUSED(bs); GGML_UNUSED(vx); GGML_UNUSED(vy); GGML_UNUSED(nr); GGML_UNUSED(nc);
    return false;
#endif
}
