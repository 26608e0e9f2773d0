// deepseek-cpu: MUL_MAT_ID's expert GEMMs (gathered tinyBLAS, the q5_0 / q8_0 broadcast GEMM and its
// AVX-512 VNNI tile) and, through the same GEMM, plain q5_0 / q8_0 MUL_MAT with many rows. Called from
// ggml-cpu.c: ggml_compute_forward_mul_mat_id (ggml_dsc_mul_mat_id_*), ggml_graph_plan
// (ggml_dsc_mul_mat_id_wsize) and, through dsc/mul-mat-routes.c, ggml_compute_forward_mul_mat.

#include "ggml-cpu-impl.h"
#include "ggml-cpu.h"
#include "ops.h"
#include "quants.h"
#include "simd-mappings.h"
#include "llamafile/sgemm.h"
#include "dsc-transpose.h"
#include "dsc/dsc-mul-mat.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

// deepseek-cpu: MUL_MAT_ID for the block types tinyBLAS multiplies (q8_0, q5_0, q4_0, iq4_nl) when an
// expert sees several tokens. The generic path above computes one dot product per (weight row,
// token) pair, so every q5_0 weight block is unpacked again for each token routed to the expert;
// in a Q4_K_M DeepSeek-V2 the expert down-projections are q5_0/q8_0 (1408 is not a multiple of
// 256), and during prefill that was ~28% of the time. Here a chunk of the expert's tokens is
// gathered into a contiguous q8_0 matrix and multiplied by a chunk of weight rows with tinyBLAS
// (4 weight rows x up to 4 tokens per tile: each weight block is unpacked once per 4 tokens),
// then the results are scattered to the tokens' output rows. Single-token experts (decode) keep
// the generic path.
#if defined(GGML_USE_LLAMAFILE) && (defined(__AVX2__) || defined(__AVX512F__))
#define DSC_MMID_SGEMM 1
// GGML_DSC_MMID_SGEMM_COLS tokens x GGML_DSC_MMID_SGEMM_ROWS weight rows per chunk (dsc/dsc-tuning.h)

static bool dsc_mmid_sgemm_type(enum ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_IQ4_NL:
            return true;
        default:
            return false;
    }
}

#if defined(__AVX2__)
// deepseek-cpu: q5_0 and q8_0 experts through a broadcast GEMM instead of tinyBLAS. On AVX2 (16
// registers) tinyBLAS's tile is 4 weight rows x 2 tokens and every (row, token) pair needs its own
// horizontal reduction, so a q5_0 block cost ~13 vector ops per 32 multiply-adds. Here a chunk's
// weight rows are first re-laid out, 8 rows at a time, already unpacked to bytes (q5_0 as q + 16 in
// [0, 31], q8_0 as is) with f32 scales, 4 bytes of each row per 32-byte vector: maddubs against a
// token's 4 broadcast activation bytes leaves each row's pair sums in its own int32 lane after one
// madd, so the rows' sums come out in order with no horizontal step. (q8_0: 2 bytes of
// each row per 16 bytes, widened to int16 and madd'ed with a token's broadcast int16 pair.) The re-layout is paid once per
// chunk (up to 128 rows) and shared by all of the chunk's tokens (up to 64).
#define DSC_MMID_G8_BYTES  (8*sizeof(float) + 256) // per 8 rows and block: scales, then the bytes
// GGML_DSC_MMID_G8_MAX_NB, GGML_DSC_MMID_G8_KC (q5_0 blocks per k-chunk): dsc/dsc-tuning.h
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define DSC_MMID_G8_VNNI 1
#else
#define DSC_MMID_G8_VNNI 0
#endif


static bool dsc_mmid_g8_type(enum ggml_type type, int64_t ne00) {
    return (type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q8_0) && ne00 / 32 <= GGML_DSC_MMID_G8_MAX_NB;
}

// 32 bytes, byte e = 0xFF where bit e of x is set
static inline __m256i dsc_bits_to_bytes(uint32_t x) {
    // byte e takes byte e/8 of x, then everything except bit e%8 is forced on
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i rest = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    const __m256i v = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int) x), pick), rest);
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}

// rows [0, m) of q5_0/q8_0 (row_bytes apart) -> groups of 8 rows; the last group repeats the last row.
// Per group and block: the 8 scales in row order, then 8 vectors, vector c holding k 4c..4c+3 of rows
// 0..7 (an 8 x 8 transpose of the rows' 4-byte groups); q8_0: k 2c, 2c+1 and 2c+16, 2c+17 (below),
// except on AVX-512 VNNI builds, where q8_0 takes q5_0's layout as q + 128 (unsigned, for vpdpbusd).
static void dsc_mmid_g8_relayout(enum ggml_type type, const char * rows, size_t row_bytes, int64_t m, int64_t nb, uint8_t * out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i b4 = _mm256_set1_epi8(0x10);
    for (int64_t g = 0; g < (m + 7) / 8; g++) {
        const char * row[8];
        for (int r = 0; r < 8; r++) {
            row[r] = rows + MIN(g*8 + r, m - 1)*row_bytes;
        }
        for (int64_t b = 0; b < nb; b++) {
            uint8_t * dst = out + (g*nb + b)*DSC_MMID_G8_BYTES;
            __m256i v[8];
            float d[8];
            for (int r = 0; r < 8; r++) {
                if (type == GGML_TYPE_Q5_0) {
                    const block_q5_0 * x = (const block_q5_0 *) row[r] + b;
                    uint32_t qh;
                    memcpy(&qh, x->qh, sizeof(qh));
                    const __m128i qs = _mm_loadu_si128((const __m128i *) x->qs);
                    // elements 0-15: low nibbles, 16-31: high nibbles; bit e of qh is element e's fifth bit
                    const __m256i lo4 = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), m4);
                    v[r] = _mm256_or_si256(lo4, _mm256_and_si256(dsc_bits_to_bytes(qh), b4));
                    d[r] = GGML_CPU_FP16_TO_FP32(x->d);
                } else {
                    const block_q8_0 * x = (const block_q8_0 *) row[r] + b;
                    v[r] = _mm256_loadu_si256((const __m256i *) x->qs);
                    if (DSC_MMID_G8_VNNI) {
                        v[r] = _mm256_xor_si256(v[r], _mm256_set1_epi8((char) 0x80)); // q + 128 in [1, 255]
                    }
                    d[r] = GGML_CPU_FP16_TO_FP32(x->d);
                }
            }
            memcpy(dst, d, sizeof(d));
            if (type == GGML_TYPE_Q8_0 && !DSC_MMID_G8_VNNI) {
                // q8_0: vector c holds k 2c, 2c+1 of rows 0..7 (low 16 bytes) and k 2c+16, 2c+17 (high): an
                // 8 x 8 transpose of 16-bit pairs in each 128-bit lane, widened to int16 by the GEMM
                const __m256i t0 = _mm256_unpacklo_epi16(v[0], v[1]), t1 = _mm256_unpackhi_epi16(v[0], v[1]);
                const __m256i t2 = _mm256_unpacklo_epi16(v[2], v[3]), t3 = _mm256_unpackhi_epi16(v[2], v[3]);
                const __m256i t4 = _mm256_unpacklo_epi16(v[4], v[5]), t5 = _mm256_unpackhi_epi16(v[4], v[5]);
                const __m256i t6 = _mm256_unpacklo_epi16(v[6], v[7]), t7 = _mm256_unpackhi_epi16(v[6], v[7]);
                const __m256i u0 = _mm256_unpacklo_epi32(t0, t2), u1 = _mm256_unpackhi_epi32(t0, t2);
                const __m256i u2 = _mm256_unpacklo_epi32(t1, t3), u3 = _mm256_unpackhi_epi32(t1, t3);
                const __m256i u4 = _mm256_unpacklo_epi32(t4, t6), u5 = _mm256_unpackhi_epi32(t4, t6);
                const __m256i u6 = _mm256_unpacklo_epi32(t5, t7), u7 = _mm256_unpackhi_epi32(t5, t7);
                __m256i * o = (__m256i *) (dst + 8*sizeof(float));
                _mm256_storeu_si256(o + 0, _mm256_unpacklo_epi64(u0, u4));
                _mm256_storeu_si256(o + 1, _mm256_unpackhi_epi64(u0, u4));
                _mm256_storeu_si256(o + 2, _mm256_unpacklo_epi64(u1, u5));
                _mm256_storeu_si256(o + 3, _mm256_unpackhi_epi64(u1, u5));
                _mm256_storeu_si256(o + 4, _mm256_unpacklo_epi64(u2, u6));
                _mm256_storeu_si256(o + 5, _mm256_unpackhi_epi64(u2, u6));
                _mm256_storeu_si256(o + 6, _mm256_unpacklo_epi64(u3, u7));
                _mm256_storeu_si256(o + 7, _mm256_unpackhi_epi64(u3, u7));
                continue;
            }
            dsc_store_transpose8x8_epi32((__m256i *) (dst + 8*sizeof(float)), v);
        }
    }
}

// 4 activation bytes broadcast straight from memory: vbroadcastss is a load-pipe uop, where GCC turns
// _mm256_set1_epi32 of a loaded value into a GPR move plus a shuffle on the vector pipes
static inline __m256i dsc_bcast4m(const void * p) {
    return _mm256_castps_si256(_mm256_broadcast_ss((const float *) p));
}

// GCC reassociates a tile's integer sums into chains that start after all of their products, which
// keeps the products live and spills them; an empty asm that "changes" a sum after each step keeps
// it accumulating in a register
#if defined(__GNUC__)
#define DSC_MMID_G8_KEEP(x) __asm__("" : "+x"(x))
#else
#define DSC_MMID_G8_KEEP(x)
#endif

// the nt tokens' float sums for one group: token t's at Cr[t] + c0, mr of the 8 lanes. Each token has
// its own output row (MUL_MAT_ID: the token's slot of dst), so the sums need no copy afterwards.
static inline __attribute__((always_inline)) void dsc_mmid_g8_load_acc(__m256 * acc, int nt, float * const * Cr, int64_t c0, int mr, bool first) {
    for (int t = 0; t < nt; t++) {
        if (first) {
            acc[t] = _mm256_setzero_ps();
        } else if (mr == 8) {
            acc[t] = _mm256_loadu_ps(Cr[t] + c0);
        } else {
            float r[8] = { 0 };
            memcpy(r, Cr[t] + c0, mr*sizeof(float));
            acc[t] = _mm256_loadu_ps(r);
        }
    }
}

static inline __attribute__((always_inline)) void dsc_mmid_g8_store_acc(const __m256 * acc, int nt, float * const * Cr, int64_t c0, int mr) {
    for (int t = 0; t < nt; t++) {
        if (mr == 8) {
            _mm256_storeu_ps(Cr[t] + c0, acc[t]);
        } else {
            float r[8];
            _mm256_storeu_ps(r, acc[t]);
            memcpy(Cr[t] + c0, r, mr*sizeof(float));
        }
    }
}

// q5_0, one group of 8 rows x nt (<= 4) tokens over kc blocks of a k-chunk; act[b][c][t] is token
// t's broadcast k-group c of block b, off16/da token t's 16 * sum(a) and scale at [t*nb + b]. The
// bytes are q + 16, so the sum is sum((q + 16) a) - 16 sum(a); four pairs of products of <= 31 by
// |a| <= 127 stay below 2^15 in int16, so each half block is widened once.
static inline __attribute__((always_inline)) void dsc_mmid_g8_q5_tile(const uint8_t * Wg, int64_t kc, __m256i (*act)[8][4],
        const int32_t * off16, const float * da, int64_t nb, int nt, float * const * Cr, int64_t c0, int mr, bool first) {
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256 acc[4];
    dsc_mmid_g8_load_acc(acc, nt, Cr, c0, mr, first);
    for (int64_t b = 0; b < kc; b++) {
        const uint8_t * blk = Wg + b*DSC_MMID_G8_BYTES;
        __m256i isum[4];
        for (int h = 0; h < 2; h++) {
            __m256i s[4];
            for (int c = 0; c < 4; c++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *) (blk + 8*sizeof(float) + 32*(4*h + c)));
                for (int t = 0; t < nt; t++) {
                    const __m256i p = _mm256_maddubs_epi16(w, act[b][4*h + c][t]);
                    s[t] = c == 0 ? p : _mm256_add_epi16(s[t], p);
                    DSC_MMID_G8_KEEP(s[t]);
                }
            }
            for (int t = 0; t < nt; t++) {
                const __m256i p = _mm256_madd_epi16(s[t], ones16);
                isum[t] = h == 0 ? p : _mm256_add_epi32(isum[t], p);
            }
        }
        const __m256 dw = _mm256_loadu_ps((const float *) blk);
        for (int t = 0; t < nt; t++) {
            const __m256i q = _mm256_sub_epi32(isum[t], dsc_bcast4m(&off16[t*nb + b]));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_mul_ps(dw, _mm256_broadcast_ss(&da[t*nb + b])), acc[t]);
        }
    }
    dsc_mmid_g8_store_acc(acc, nt, Cr, c0, mr);
}

// q8_0, one group of 8 rows x nt (<= 8) tokens over all nb blocks (A16: the tokens' activations as
// int16, 32 per block, nb blocks apart). Signed x signed in int16: each 16 bytes of the block (k 2c, 2c+1
// of the 8 rows) widen once for all nt tokens, and a madd against a token's broadcast pair leaves each
// row's two products in its own int32 lane. madd + add pairs issue ~2 per cycle on Zen 3, where the
// byte path's sign + maddubs + madd + add ran 0.81: ~9% more per tile for the same integer sums.
static inline __attribute__((always_inline)) void dsc_mmid_g8_q8_tile(const uint8_t * Wg, int64_t nb, const int16_t * A16,
        const float * da, int nt, float * const * Cr, int64_t c0, int mr) {
    __m256 acc[8];
    dsc_mmid_g8_load_acc(acc, nt, Cr, c0, mr, true);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = Wg + b*DSC_MMID_G8_BYTES;
        __m256i isum[8];
        for (int t = 0; t < nt; t++) {
            isum[t] = _mm256_setzero_si256();
        }
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) {
            // pair c (k 2c, 2c+1) is in vector c & 7: its low half for c < 8, its high half for c >= 8
            const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) (blk + 8*sizeof(float) + 32*(c & 7) + 16*(c >> 3))));
            for (int t = 0; t < nt; t++) {
                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(w, dsc_bcast4m(A16 + (t*nb + b)*32 + 2*c)));
                DSC_MMID_G8_KEEP(isum[t]);
            }
        }
        const __m256 dw = _mm256_loadu_ps((const float *) blk);
        for (int t = 0; t < nt; t++) {
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, _mm256_broadcast_ss(&da[t*nb + b])), acc[t]);
        }
    }
    dsc_mmid_g8_store_acc(acc, nt, Cr, c0, mr);
}

// the GEMM's per-block activation terms for nb_total q8_0 blocks: their scales as f32 (da) and, for
// q5_0 weights, 16 * their sums (off16), for q8_0 weights their values as int16 (a16, 32 per block);
// on AVX-512 VNNI builds 128 * their sums for q8_0 weights (off16; stored as q + 128)
static void dsc_mmid_g8_prep(enum ggml_type type, const block_q8_0 * B, int64_t nb_total, int32_t * off16, int16_t * a16, float * da) {
    const __m256i ones8  = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int64_t j = 0; j < nb_total; j++) {
        da[j] = GGML_CPU_FP16_TO_FP32(B[j].d);
        if (type == GGML_TYPE_Q5_0 || DSC_MMID_G8_VNNI) {
            const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, _mm256_loadu_si256((const __m256i *) B[j].qs)), ones16);
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
            off16[j] = (type == GGML_TYPE_Q5_0 ? 16 : 128)*_mm_cvtsi128_si32(t);
        } else {
            _mm256_storeu_si256((__m256i *) (a16 + 32*j),      _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) B[j].qs)));
            _mm256_storeu_si256((__m256i *) (a16 + 32*j + 16), _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) (B[j].qs + 16))));
        }
    }
}

// Cr[j][c0 + i] = row i of the re-laid-out weights (m rows) . token j of B (n q8_0 rows of nb blocks);
// off16, a16 and da: B's terms from dsc_mmid_g8_prep. q5_0 runs 4-token tiles over k-chunks whose
// broadcast activations are built once and shared by all groups (a memory operand of maddubs instead
// of a broadcast instruction per product); q8_0 runs 8-token tiles over the whole row, broadcasting
// each token's int16 pairs from a16.
#if DSC_MMID_G8_VNNI
// AVX-512 VNNI: two 8-row groups (16 rows) x nt (<= 8) tokens per tile over all nb blocks. A 512-bit
// vector holds vector c of both groups' blocks (k 4c..4c+3 of 16 rows, unsigned bytes: q5_0's q + 16,
// q8_0's q + 128 from the re-layout), and vpdpbusd against a token's 4 activation bytes, broadcast
// from its q8_0 row, adds a row's four products into its int32 lane. Each block's sum starts at
// -off (16 or 128 times the sum of the token's activations in the block), so it is the AVX2 tiles'
// integer, and the float step is theirs: results are bit-identical to them.
static inline __attribute__((always_inline)) void dsc_mmid_g8_vnni_tile(const uint8_t * W0, const uint8_t * W1, int64_t nb,
        const block_q8_0 * Bt, const int32_t * off, const float * da, int nt, float * const * Cr, int64_t c0, __mmask16 mask) {
    __m512 acc[8];
    for (int t = 0; t < nt; t++) {
        acc[t] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk0 = W0 + b*DSC_MMID_G8_BYTES;
        const uint8_t * blk1 = W1 ? W1 + b*DSC_MMID_G8_BYTES : NULL;
        __m512i s1[8], s2[8];
        for (int t = 0; t < nt; t++) {
            s1[t] = _mm512_set1_epi32(-off[t*nb + b]);
            s2[t] = _mm512_setzero_si512();
        }
        for (int c = 0; c < 4; c++) {
            __m512i w[2];
            for (int h = 0; h < 2; h++) {
                const __m256i lo = _mm256_loadu_si256((const __m256i *) (blk0 + 8*sizeof(float) + 32*(4*h + c)));
                w[h] = blk1 ? _mm512_inserti64x4(_mm512_zextsi256_si512(lo), _mm256_loadu_si256((const __m256i *) (blk1 + 8*sizeof(float) + 32*(4*h + c))), 1)
                            : _mm512_zextsi256_si512(lo);
            }
            for (int t = 0; t < nt; t++) {
                int32_t a0, a1;
                memcpy(&a0, Bt[t*nb + b].qs + 4*c, sizeof(a0));
                memcpy(&a1, Bt[t*nb + b].qs + 16 + 4*c, sizeof(a1));
                s1[t] = _mm512_dpbusd_epi32(s1[t], w[0], _mm512_set1_epi32(a0));
                s2[t] = _mm512_dpbusd_epi32(s2[t], w[1], _mm512_set1_epi32(a1));
            }
        }
        const __m256 d0 = _mm256_loadu_ps((const float *) blk0);
        const __m512 dw = _mm512_insertf32x8(_mm512_castps256_ps512(d0), blk1 ? _mm256_loadu_ps((const float *) blk1) : _mm256_setzero_ps(), 1);
        for (int t = 0; t < nt; t++) {
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s1[t], s2[t])), _mm512_mul_ps(dw, _mm512_set1_ps(da[t*nb + b])), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) {
        _mm512_mask_storeu_ps(Cr[t] + c0, mask, acc[t]);
    }
}
#endif

static void dsc_mmid_g8_gemm(enum ggml_type type, const uint8_t * W, int64_t m, int64_t nb,
                             const block_q8_0 * B, int64_t n, float * const * Cr, int64_t c0, const int32_t * off16,
                             const int16_t * a16, const float * da) {
#if DSC_MMID_G8_VNNI
    GGML_UNUSED(a16);
    const int64_t ng = (m + 7) / 8;
    for (int64_t j0 = 0; j0 < n; j0 += 8) {
        const int nt = (int) MIN(8, n - j0);
        const block_q8_0 * Bt = B + j0*nb;
        const int32_t * o = off16 + j0*nb;
        const float * d = da + j0*nb;
        float * const * Ct = Cr + j0;
        for (int64_t g = 0; g < ng; g += 2) {
            const uint8_t * W0 = W + g*nb*DSC_MMID_G8_BYTES;
            const uint8_t * W1 = g + 1 < ng ? W + (g + 1)*nb*DSC_MMID_G8_BYTES : NULL;
            const int mr0 = (int) MIN(8, m - g*8);
            const int mr1 = W1 ? (int) MIN(8, m - (g + 1)*8) : 0;
            const __mmask16 mask = (__mmask16) (((1u << mr0) - 1) | (((1u << mr1) - 1) << 8));
            const int64_t ct0 = c0 + g*8;
            switch (nt) { // constant tile sizes, so each tile's sums stay in registers
                case 8:  dsc_mmid_g8_vnni_tile(W0, W1, nb, Bt, o, d, 8, Ct, ct0, mask); break;
                case 7:  dsc_mmid_g8_vnni_tile(W0, W1, nb, Bt, o, d, 7, Ct, ct0, mask); break;
                case 6:  dsc_mmid_g8_vnni_tile(W0, W1, nb, Bt, o, d, 6, Ct, ct0, mask); break;
                case 5:  dsc_mmid_g8_vnni_tile(W0, W1, nb, Bt, o, d, 5, Ct, ct0, mask); break;
                case 4:  dsc_mmid_g8_vnni_tile(W0, W1, nb, Bt, o, d, 4, Ct, ct0, mask); break;
                case 3:  dsc_mmid_g8_vnni_tile(W0, W1, nb, Bt, o, d, 3, Ct, ct0, mask); break;
                case 2:  dsc_mmid_g8_vnni_tile(W0, W1, nb, Bt, o, d, 2, Ct, ct0, mask); break;
                default: dsc_mmid_g8_vnni_tile(W0, W1, nb, Bt, o, d, 1, Ct, ct0, mask); break;
            }
        }
    }
    return;
#endif

    const bool q5 = type == GGML_TYPE_Q5_0;


    if (!q5) {
        for (int64_t j0 = 0; j0 < n; j0 += 8) {
            const int nt = (int) MIN(8, n - j0);
            for (int64_t g = 0; g < (m + 7) / 8; g++) {
                const uint8_t * Wg = W + g*nb*DSC_MMID_G8_BYTES;
                const int16_t * At = a16 + j0*nb*32;
                const float * d = da + j0*nb;
                float * const * Ct = Cr + j0;
                const int64_t ct0 = c0 + g*8;
                const int mr = (int) MIN(8, m - g*8);
                switch (nt) { // constant tile sizes, so each tile's sums stay in registers
                    case 8:  dsc_mmid_g8_q8_tile(Wg, nb, At, d, 8, Ct, ct0, mr); break;
                    case 7:  dsc_mmid_g8_q8_tile(Wg, nb, At, d, 7, Ct, ct0, mr); break;
                    case 6:  dsc_mmid_g8_q8_tile(Wg, nb, At, d, 6, Ct, ct0, mr); break;
                    case 5:  dsc_mmid_g8_q8_tile(Wg, nb, At, d, 5, Ct, ct0, mr); break;
                    case 4:  dsc_mmid_g8_q8_tile(Wg, nb, At, d, 4, Ct, ct0, mr); break;
                    case 3:  dsc_mmid_g8_q8_tile(Wg, nb, At, d, 3, Ct, ct0, mr); break;
                    case 2:  dsc_mmid_g8_q8_tile(Wg, nb, At, d, 2, Ct, ct0, mr); break;
                    default: dsc_mmid_g8_q8_tile(Wg, nb, At, d, 1, Ct, ct0, mr); break;
                }
            }
        }
        return;
    }

    __m256i act[GGML_DSC_MMID_G8_KC][8][4];
    for (int64_t j0 = 0; j0 < n; j0 += 4) {
        const int nt = (int) MIN(4, n - j0);
        for (int64_t k0 = 0; k0 < nb; k0 += GGML_DSC_MMID_G8_KC) {
            const int64_t kc = MIN(GGML_DSC_MMID_G8_KC, nb - k0);
            for (int64_t b = 0; b < kc; b++) {
                for (int t = 0; t < nt; t++) {
                    for (int c = 0; c < 8; c++) {
                        act[b][c][t] = dsc_bcast4m(B[(j0 + t)*nb + k0 + b].qs + 4*c);
                    }
                }
            }
            for (int64_t g = 0; g < (m + 7) / 8; g++) {
                const uint8_t * Wg = W + (g*nb + k0)*DSC_MMID_G8_BYTES;
                const int32_t * o = off16 + j0*nb + k0;
                const float * d = da + j0*nb + k0;
                float * const * Ct = Cr + j0;
                const int64_t ct0 = c0 + g*8;
                const int mr = (int) MIN(8, m - g*8);
                const bool first = k0 == 0;
                switch (nt) {
                    case 4:  dsc_mmid_g8_q5_tile(Wg, kc, act, o, d, nb, 4, Ct, ct0, mr, first); break;
                    case 3:  dsc_mmid_g8_q5_tile(Wg, kc, act, o, d, nb, 3, Ct, ct0, mr, first); break;
                    case 2:  dsc_mmid_g8_q5_tile(Wg, kc, act, o, d, nb, 2, Ct, ct0, mr, first); break;
                    default: dsc_mmid_g8_q5_tile(Wg, kc, act, o, d, nb, 1, Ct, ct0, mr, first); break;
                }
            }
        }
    }
}
#endif

#if defined(__AVX2__)
// deepseek-cpu: plain q5_0/q8_0 weights times >= 16 rows through the same GEMM (a Q4_K_M DeepSeek-V2's
// dense layer-0 ffn_down is q8_0, 10944 not being a multiple of 256), instead of tinyBLAS's 4x2 tiles
// with a horizontal reduction per (row, token) pair. Each thread takes a slice of the weight rows and
// re-lays them out in chunks of <= 128 KB (so a chunk stays in L2 while every token goes by); the
// activations' terms are prepared once per call. src1 is already quantized to q8_0 rows in wdata.
bool ggml_dsc_mul_mat_g8(const struct ggml_compute_params * params, struct ggml_tensor * dst, const void * wdata) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS

    if (params->use_ref || !dsc_mmid_g8_type(src0->type, ne00) || src1->type != GGML_TYPE_F32 || ne11 < 16 ||
        ne02 != 1 || ne03 != 1 || ne12 != 1 || ne13 != 1 || nb01 != ggml_row_size(src0->type, ne00)) {
        return false;
    }

    const int     ith = params->ith;
    const int     nth = params->nth;
    const int64_t nb  = ne00 / 32;
    const int64_t r0  = (ith * ne01 / nth + 7) / 8 * 8;
    const int64_t r1  = MIN(((ith + 1) * ne01 / nth + 7) / 8 * 8, ne01);
    if (r0 >= r1) {
        return true;
    }
    const int64_t rows = MAX(8, MIN(GGML_DSC_MMID_SGEMM_ROWS, 128*1024 / (nb * DSC_MMID_G8_BYTES) * 8));

    const block_q8_0 * B = (const block_q8_0 *) wdata;
    uint8_t * w8  = (uint8_t *) malloc(rows/8 * nb * DSC_MMID_G8_BYTES);
    int32_t * off = (int32_t *) malloc(ne11 * nb * sizeof(int32_t));
    float   * da  = (float *)   malloc(ne11 * nb * sizeof(float));
    float  ** Cr  = (float **)  malloc(ne11 * sizeof(float *));
    // q8_0's activations as int16 (the int16 tile; VNNI builds use the sums in off instead)
    const bool need_a16 = src0->type == GGML_TYPE_Q8_0 && !DSC_MMID_G8_VNNI;
    int16_t * a16 = need_a16 ? (int16_t *) malloc(ne11 * nb * 32 * sizeof(int16_t)) : NULL;
    GGML_ASSERT(w8 && off && da && Cr && (a16 || !need_a16));
    for (int64_t j = 0; j < ne11; j++) {
        Cr[j] = (float *) ((char *) dst->data + j*nb1);
    }
    dsc_mmid_g8_prep(src0->type, B, ne11*nb, off, a16, da);
    for (int64_t i0 = r0; i0 < r1; i0 += rows) {
        const int64_t m = MIN(rows, r1 - i0);
        dsc_mmid_g8_relayout(src0->type, (const char *) src0->data + i0*nb01, nb01, m, nb, w8);
        dsc_mmid_g8_gemm(src0->type, w8, m, nb, B, ne11, Cr, i0, off, a16, da);
    }
    free(a16);
    free(Cr);
    free(da);
    free(off);
    free(w8);
    return true;
}
#endif


// A thread's scratch starts with this note of the tokens its gathered rows (and, for the g8 GEMM, their
// activation terms) belong to: chunks are numbered row chunk first, so a thread's next chunk usually
// has the same tokens and reuses them instead of gathering (and preparing) them again.
struct dsc_mmid_gathered {
    const struct mmid_row_mapping * rows; // NULL: nothing yet in this op
    int64_t ir1_start, ir1_end;
};

static size_t dsc_mmid_sgemm_thread_size(const struct ggml_tensor * dst) {
    const struct ggml_tensor * src0 = dst->src[0];
    if (!dsc_mmid_sgemm_type(src0->type) || ggml_get_type_traits_cpu(src0->type)->vec_dot_type != GGML_TYPE_Q8_0) {
        return 0;
    }
    size_t size = CACHE_LINE_SIZE + GGML_PAD(GGML_DSC_MMID_SGEMM_COLS * ggml_row_size(GGML_TYPE_Q8_0, src0->ne[0]), CACHE_LINE_SIZE) +
                  GGML_PAD(GGML_DSC_MMID_SGEMM_ROWS * GGML_DSC_MMID_SGEMM_COLS * sizeof(float), CACHE_LINE_SIZE);
#if defined(__AVX2__)
    if (dsc_mmid_g8_type(src0->type, src0->ne[0])) {
        const int64_t nb = src0->ne[0] / 32;
        size += GGML_PAD(GGML_DSC_MMID_SGEMM_ROWS/8 * nb * DSC_MMID_G8_BYTES, CACHE_LINE_SIZE) +
                GGML_PAD(GGML_DSC_MMID_SGEMM_COLS * nb * sizeof(int32_t), CACHE_LINE_SIZE) +
                GGML_PAD(GGML_DSC_MMID_SGEMM_COLS * nb * sizeof(float), CACHE_LINE_SIZE) +
                (DSC_MMID_G8_VNNI ? 0 : GGML_PAD(GGML_DSC_MMID_SGEMM_COLS * nb * 32 * sizeof(int16_t), CACHE_LINE_SIZE));
    }
#endif
    return size;
}

// rows [ir0_start, ir0_end) of the expert's weights times its tokens [ir1_start, ir1_end);
// false when tinyBLAS declines (the caller then runs the generic chunk)
static bool dsc_mmid_sgemm_chunk(
        const struct ggml_compute_params * params,
        struct ggml_tensor * dst,
        const char * src0_cur,
        const struct mmid_row_mapping * expert_rows,
        const int64_t ir0_start, const int64_t ir0_end,
        const int64_t ir1_start, const int64_t ir1_end,
        const void * wdata, const size_t row_size, const bool src1_cont,
        char * scratch) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS

    const int64_t m  = ir0_end - ir0_start;
    const int64_t nc = ir1_end - ir1_start;
    GGML_ASSERT(m <= GGML_DSC_MMID_SGEMM_ROWS && nc <= GGML_DSC_MMID_SGEMM_COLS);

    struct dsc_mmid_gathered * held = (struct dsc_mmid_gathered *) scratch;
    char  * b = scratch + CACHE_LINE_SIZE;
    float * c = (float *) (b + GGML_PAD(GGML_DSC_MMID_SGEMM_COLS * row_size, CACHE_LINE_SIZE));

    const bool fresh = held->rows != expert_rows || held->ir1_start != ir1_start || held->ir1_end != ir1_end;
    if (fresh) {
        // gather: the same src1 addressing as ggml_compute_forward_mul_mat_id_one_chunk
        for (int64_t j = 0; j < nc; ++j) {
            const struct mmid_row_mapping rm = expert_rows[ir1_start + j];
            const int64_t i11 = rm.i1 % ne11;
            const int64_t i12 = rm.i2;
            const char * src1_col = (const char *) wdata +
                (src1_cont || src1->type != GGML_TYPE_Q8_0
                ? (i11      + i12*ne11)*row_size
                : (i11*nb11 + i12*nb12));
            memcpy(b + j*row_size, src1_col, row_size);
        }
        held->rows      = expert_rows;
        held->ir1_start = ir1_start;
        held->ir1_end   = ir1_end;
    }

#if defined(__AVX2__)
    if (dsc_mmid_g8_type(src0->type, ne00)) {
        const int64_t nb = ne00 / 32;
        uint8_t * w8  = (uint8_t *) c + GGML_PAD(GGML_DSC_MMID_SGEMM_ROWS * GGML_DSC_MMID_SGEMM_COLS * sizeof(float), CACHE_LINE_SIZE);
        int32_t * off = (int32_t *) (w8 + GGML_PAD(GGML_DSC_MMID_SGEMM_ROWS/8 * nb * DSC_MMID_G8_BYTES, CACHE_LINE_SIZE));
        float   * da  = (float *) ((char *) off + GGML_PAD(GGML_DSC_MMID_SGEMM_COLS * nb * sizeof(int32_t), CACHE_LINE_SIZE));
        int16_t * a16 = (int16_t *) ((char *) da + GGML_PAD(GGML_DSC_MMID_SGEMM_COLS * nb * sizeof(float), CACHE_LINE_SIZE));
        float * Cr[GGML_DSC_MMID_SGEMM_COLS];
        for (int64_t j = 0; j < nc; ++j) {
            const struct mmid_row_mapping rm = expert_rows[ir1_start + j];
            Cr[j] = (float *) ((char *) dst->data + (rm.i1*nb1 + rm.i2*nb2));
        }
        dsc_mmid_g8_relayout(src0->type, src0_cur + ir0_start*nb01, nb01, m, nb, w8);
        if (fresh) {
            dsc_mmid_g8_prep(src0->type, (const block_q8_0 *) b, nc*nb, off, a16, da);
        }
        dsc_mmid_g8_gemm(src0->type, w8, m, nb, (const block_q8_0 *) b, nc, Cr, ir0_start, off, a16, da);
        return true;
    } else
#endif
    {
    // this thread does the whole chunk (tinyBLAS' q0 kernels split by ith/nth, no barriers)
    struct ggml_compute_params one = *params;
    one.ith = 0;
    one.nth = 1;
    if (!llamafile_sgemm(&one, m, nc, ne00/ggml_blck_size(src0->type),
                         src0_cur + ir0_start*nb01, nb01/ggml_type_size(src0->type),
                         b, row_size/ggml_type_size(GGML_TYPE_Q8_0),
                         c, m,
                         src0->type, GGML_TYPE_Q8_0, GGML_TYPE_F32)) {
        return false;
    }
    }

    for (int64_t j = 0; j < nc; ++j) {
        const struct mmid_row_mapping rm = expert_rows[ir1_start + j];
        float * dst_col = (float *) ((char *) dst->data + (rm.i1*nb1 + rm.i2*nb2));
        memcpy(dst_col + ir0_start, c + j*m, m*sizeof(float));
    }
    return true;
}

// the expert's chunks (rows x tokens) through dsc_mmid_sgemm_chunk, handed out by the expert's chunk
// counter; a chunk tinyBLAS declines runs ggml_compute_forward_mul_mat_id_one_chunk (ggml-cpu.c)
bool ggml_dsc_mul_mat_id_expert(
        const struct ggml_compute_params * params,
        struct ggml_tensor * dst,
        const int64_t cur_a, const int64_t cne1,
        const char * src0_cur,
        const struct mmid_row_mapping * matrix_rows,
        const struct mmid_row_mapping * expert_rows,
        const void * wdata, const size_t row_size, const bool src1_cont,
        char * dsc_scratch, const size_t dsc_scratch_size,
        void * current_chunk_ctr_p) {
    atomic_int * current_chunk_ctr = (atomic_int *) current_chunk_ctr_p;
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];
    const struct ggml_tensor * ids  = dst->src[2];
    const int64_t ne01 = src0->ne[1];
    const int ith = params->ith;

    if (dsc_scratch_size > 0 && cne1 >= 2) {
        const int64_t nchunk0 = (ne01 + GGML_DSC_MMID_SGEMM_ROWS - 1) / GGML_DSC_MMID_SGEMM_ROWS;
        const int64_t nchunk1 = (cne1 + GGML_DSC_MMID_SGEMM_COLS - 1) / GGML_DSC_MMID_SGEMM_COLS;
        // even chunks; rows in multiples of 4 (tinyBLAS' tile height)
        const int64_t dr0 = GGML_PAD((ne01 + nchunk0 - 1) / nchunk0, 4);
        const int64_t dr1 = (cne1 + nchunk1 - 1) / nchunk1;
        char * scratch = dsc_scratch + ith*dsc_scratch_size;

        int current_chunk = ith;
        while (current_chunk < nchunk0 * nchunk1) {
            const int64_t ir0_start = dr0 * (current_chunk % nchunk0);
            const int64_t ir0_end   = MIN(ir0_start + dr0, ne01);
            const int64_t ir1_start = dr1 * (current_chunk / nchunk0);
            const int64_t ir1_end   = MIN(ir1_start + dr1, cne1);
            if (ir0_start < ir0_end && ir1_start < ir1_end &&
                !dsc_mmid_sgemm_chunk(params, dst, src0_cur, expert_rows,
                                      ir0_start, ir0_end, ir1_start, ir1_end,
                                      wdata, row_size, src1_cont, scratch)) {
                ggml_compute_forward_mul_mat_id_one_chunk(
                    dst, src0, src1, ids, cur_a,
                    ir0_start, ir0_end, ir1_start, ir1_end,
                    src0_cur, matrix_rows, row_size, src1_cont, wdata, params->use_ref);
            }
            current_chunk = atomic_fetch_add_explicit(current_chunk_ctr, 1, memory_order_relaxed);
        }
        return true;
    }
    return false;
}
#endif // DSC_MMID_SGEMM

size_t ggml_dsc_mul_mat_id_thread_size(const struct ggml_tensor * dst) {
#ifdef DSC_MMID_SGEMM
    return dsc_mmid_sgemm_thread_size(dst);
#else
    GGML_UNUSED(dst);
    return 0;
#endif
}

void ggml_dsc_mul_mat_id_scratch_reset(char * dsc_scratch, size_t dsc_scratch_size, int ith) {
#ifdef DSC_MMID_SGEMM
    if (dsc_scratch_size > 0) {
        // this op's src1 is new: whatever this thread gathered before belongs to another op
        ((struct dsc_mmid_gathered *) (dsc_scratch + ith*dsc_scratch_size))->rows = NULL;
    }
#else
    GGML_UNUSED(dsc_scratch);
    GGML_UNUSED(dsc_scratch_size);
    GGML_UNUSED(ith);
#endif
}

size_t ggml_dsc_mul_mat_id_wsize(const struct ggml_tensor * node, int n_tasks) {
#ifdef DSC_MMID_SGEMM
    // per-thread gather/result buffers of the tinyBLAS MUL_MAT_ID path
    return CACHE_LINE_SIZE + n_tasks*dsc_mmid_sgemm_thread_size(node);
#else
    GGML_UNUSED(node);
    GGML_UNUSED(n_tasks);
    return 0;
#endif
}

#if !defined(DSC_MMID_SGEMM) || !defined(__AVX2__)
bool ggml_dsc_mul_mat_g8(const struct ggml_compute_params * params, struct ggml_tensor * dst, const void * wdata) {
    GGML_UNUSED(params);
    GGML_UNUSED(dst);
    GGML_UNUSED(wdata);
    return false;
}
#endif
#ifndef DSC_MMID_SGEMM
bool ggml_dsc_mul_mat_id_expert(
        const struct ggml_compute_params * params, struct ggml_tensor * dst, const int64_t cur_a, const int64_t cne1,
        const char * src0_cur, const struct mmid_row_mapping * matrix_rows, const struct mmid_row_mapping * expert_rows,
        const void * wdata, const size_t row_size, const bool src1_cont, char * dsc_scratch, const size_t dsc_scratch_size,
        void * current_chunk_ctr) {
    GGML_UNUSED(params); GGML_UNUSED(dst); GGML_UNUSED(cur_a); GGML_UNUSED(cne1); GGML_UNUSED(src0_cur);
    GGML_UNUSED(matrix_rows); GGML_UNUSED(expert_rows); GGML_UNUSED(wdata); GGML_UNUSED(row_size);
    GGML_UNUSED(src1_cont); GGML_UNUSED(dsc_scratch); GGML_UNUSED(dsc_scratch_size); GGML_UNUSED(current_chunk_ctr);
    return false;
}
#endif
