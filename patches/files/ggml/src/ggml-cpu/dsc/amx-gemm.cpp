// deepseek-cpu: Intel AMX (AMX-INT8 tiles) for prompt-sized products of the repack buffer's q4_0 and q4_K
// weights: dense MUL_MAT and the experts' MUL_MAT_ID, many tokens at a time. One token (decode) and small
// batches keep the AVX-512 VNNI GEMVs and GEMMs of dsc/x86-repack.cpp. Entry points: dsc-amx.h.
//
// The products are exact integer sums as in the VNNI kernels, and every float step is theirs, in their
// order, so the results are bit-identical to them (test-repack-ops checks it):
//
// q4_0 x q8_0. A 32-value block carries a weight scale per column and an activation scale per token, so
// the integer sums cannot run past a block. Per block one TDPBSSD multiplies 16 tokens x 32 k (the q8_0
// quants) by 32 k x 16 columns (the nibbles minus 8, unpacked once per call into the tile layout), the
// 16 x 16 int32 tile is stored, and AVX-512 adds each row as the VNNI GEMM does: acc = fma(float(isum),
// d_w * d_a, acc), block by block. That per-block store and scaling, not the tile multiply, bound it.
//
// q4_K x q8_K. Within a 256-value super-block the 8 sub-block scales are 6-bit integers. Splitting each
// into 8 * hi + lo (3 bits each) and folding lo and hi into two copies of the weights (q * lo, q * hi <=
// 105 fit a byte) makes isum = sum(a * q * lo) + 8 * sum(a * q * hi): two int32 tiles that accumulate over
// the whole super-block in TDPBSSDs of 64 k, stored once per super-block. isum is the integer the VNNI
// kernel forms with vpmulld per sub-block; the mins term is its own (madd of the q8_K sub-block sums), and
// the two FMAs per super-block are its own.
//
// Layouts (per call, in the work buffer): activations are quantized with the stock quantizers
// (quantize_row_q8_0 / _q8_K, as the VNNI paths get them) and laid out per 16-token tile, k-group by
// k-group, as the A tiles load them (16 rows x 32 or 64 bytes), with the scales beside them. Weights are
// unpacked per thread, one panel of columns at a time, into B tiles (VNNI layout: 4 k of 16 columns per
// 64-byte row). Tokens of an expert are gathered into its own tiles.
//
// Tiles: C 0-3 (int32 16 x 16), A 4-5 (two token tiles), B 6-7. The configuration is loaded on every
// thread at the start of each op (a thread that has not loaded it faults on the first tile instruction)
// and released at the end.

#define GGML_COMMON_IMPL_CPP
#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"
#include "ggml-backend-impl.h"

#include "ggml-impl.h"
#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "simd-mappings.h"
#include "quants.h"

#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <algorithm>
#include <vector>
#include <atomic>

#include "../repack.h"
#include "dsc-amx.h"
#include "dsc-tuning.h"

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__linux__)
#define DSC_AMX 1
#include <immintrin.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "dsc-q4k-scales.h"
#endif

#if defined(DSC_AMX)
// nullptr when AMX runs on this CPU under this kernel, else why not
static const char * dsc_amx_unavailable(void) {
    static const char * why = []() -> const char * {
        unsigned a, b, c, d;
        if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) { // OSXSAVE: XGETBV works
            return "the OS does not enable XSAVE";
        }
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) {
            return "the CPU lacks AMX-TILE/AMX-INT8";
        }
        uint32_t xcr0_lo, xcr0_hi;
        __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
        if ((xcr0_lo & (3u << 17)) != (3u << 17)) {
            return "the kernel does not enable the tile state (XCR0)";
        }
        // Linux hands out the 8 KB tile state only to processes that ask (5.16+); without it the first
        // tile instruction is a SIGILL
        const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
        if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
            return "the kernel refused the tile state (arch_prctl ARCH_REQ_XCOMP_PERM; Linux 5.16+ needed)";
        }
        return nullptr;
    }();
    return why;
}

// DEEPSEEK_CPU_AMX=0, or ggml_dsc_amx_set_enabled(false)
static std::atomic<bool> dsc_amx_off{ [] {
    const char * env = getenv("DEEPSEEK_CPU_AMX");
    return env != nullptr && env[0] == '0';
}() };
#endif

bool ggml_dsc_amx_enabled(void) {
#if defined(DSC_AMX)
    return !dsc_amx_off.load(std::memory_order_relaxed) && dsc_amx_unavailable() == nullptr;
#else
    return false;
#endif
}

const char * ggml_dsc_amx_status(void) {
#if defined(DSC_AMX)
    if (const char * why = dsc_amx_unavailable()) {
        return why;
    }
    return dsc_amx_off.load() ? "off (DEEPSEEK_CPU_AMX=0)" : "on";
#else
    return "not in this build (its CPU variant has no AMX-INT8)";
#endif
}

bool ggml_dsc_amx_set_enabled(bool on) {
#if defined(DSC_AMX)
    dsc_amx_off.store(!on);
#else
    GGML_UNUSED(on);
#endif
    return ggml_dsc_amx_enabled();
}

#if defined(DSC_AMX)

namespace {

constexpr int64_t TILE_M = 16; // tokens per A tile

// the weight types this path takes, with the repacked layout they arrive in
struct amx_kind {
    bool     q4_K;        // else q4_0
    int64_t  blk;         // values per weight block (32, 256)
    size_t   a_group;     // bytes per A-tile row: k per TDP (32 q4_0, 64 q4_K)
    int      b_rows;      // rows of a B tile (K / 4)
    size_t   a_tile(int64_t nblk) const {          // one 16-token tile: A then the scales
        return q4_K ? (size_t) nblk * (4 * 1024 + 64 + 256) : (size_t) nblk * (512 + 64);
    }
    size_t   b_coltile(int64_t nblk) const {       // one 16-column tile of a weight panel
        return q4_K ? (size_t) nblk * (8192 + 64 + 64 + 256) : (size_t) nblk * (512 + 64);
    }
    size_t   q8_row(int64_t nblk) const {
        return q4_K ? (size_t) nblk * sizeof(block_q8_K) : (size_t) nblk * sizeof(block_q8_0);
    }
};

constexpr amx_kind KIND_Q4_0 = { false, QK4_0, 32, 8 };
constexpr amx_kind KIND_Q4_K = { true, QK_K, 64, 16 };

// columns per work item (one weight panel unpacked by one thread, kept in L2 for all its tokens)
int64_t amx_panel_cols(const amx_kind & k, int64_t K) {
    return k.q4_K ? (K <= 4096 ? 64 : 32) : (K <= 4096 ? 128 : 64);
}

inline size_t pad64(size_t n) { return (n + 63) & ~(size_t) 63; }
inline uint8_t * align64(void * p) { return (uint8_t *) (((uintptr_t) p + 63) & ~(uintptr_t) 63); }

// which of our kinds this op's weight is, or nullptr
const amx_kind * amx_kind_of(const ggml_tensor * op, int64_t nb_cols, int64_t inter_size) {
    if (!ggml_dsc_amx_enabled() || nb_cols != 8 || inter_size != 8) {
        return nullptr;
    }
    const ggml_tensor * src0 = op->src[0];
    const ggml_tensor * src1 = op->src[1];
    const amx_kind * k = src0->type == GGML_TYPE_Q4_0 ? &KIND_Q4_0 : src0->type == GGML_TYPE_Q4_K ? &KIND_Q4_K : nullptr;
    if (k == nullptr || src1->type != GGML_TYPE_F32 || src1->nb[0] != sizeof(float) || op->nb[0] != sizeof(float) ||
        src0->ne[0] % k->blk != 0 || src0->ne[1] % 16 != 0 || src0->ne[3] != 1 || src1->ne[3] != 1) {
        return nullptr;
    }
    if (op->op == GGML_OP_MUL_MAT) {
        // 2D weights, one plane of tokens
        return src0->ne[2] == 1 && src1->ne[2] == 1 && src1->ne[1] >= GGML_DSC_AMX_MIN_TOKENS ? k : nullptr;
    }
    if (op->op == GGML_OP_MUL_MAT_ID) {
        const ggml_tensor * ids = op->src[2];
        return ids->ne[1] >= GGML_DSC_AMX_MIN_TOKENS && ids->ne[0] <= 64 ? k : nullptr;
    }
    return nullptr;
}

// the work buffer, in this order: [MUL_MAT_ID bookkeeping] [token tiles] [per-thread scratch]
struct amx_plan {
    int64_t nblk;        // weight blocks per row
    int64_t ntiles;      // token tiles (an upper bound for MUL_MAT_ID)
    size_t  ids_bytes;   // MUL_MAT_ID: counts, tile bases, used experts, the slots' (i1, i2)
    size_t  q8_bytes;    // one quantized src1 row
    size_t  tile_bytes;  // one token tile
    size_t  thread_bytes;
    size_t  total;
};

amx_plan amx_plan_of(const amx_kind & k, const ggml_tensor * op, int n_threads) {
    const ggml_tensor * src0 = op->src[0];
    amx_plan p = {};
    p.nblk = src0->ne[0] / k.blk;
    p.q8_bytes = k.q8_row(p.nblk);
    if (op->op == GGML_OP_MUL_MAT) {
        p.ntiles = (op->src[1]->ne[1] + TILE_M - 1) / TILE_M;
    } else {
        const ggml_tensor * ids = op->src[2];
        const int64_t n_as  = src0->ne[2];
        const int64_t slots = ids->ne[0] * ids->ne[1];
        // every used expert's last tile may be partial
        p.ntiles = slots / TILE_M + std::min(n_as, slots) + 1;
        p.ids_bytes = pad64(sizeof(int64_t) * (3 * n_as + 2)) + pad64(sizeof(int32_t) * 2 * p.ntiles * TILE_M) +
                      pad64(p.q8_bytes * op->src[1]->ne[1] * op->src[1]->ne[2]);
    }
    p.tile_bytes   = pad64(k.a_tile(p.nblk));
    const int64_t P = amx_panel_cols(k, src0->ne[0]);
    p.thread_bytes = pad64(k.q8_row(p.nblk)) + pad64((size_t) (P / 16) * k.b_coltile(p.nblk)) + pad64(sizeof(float) * 32 * 32);
    p.total        = 64 + p.ids_bytes + (size_t) p.ntiles * p.tile_bytes + (size_t) n_threads * p.thread_bytes;
    return p;
}

// ---- tiles ----

struct tile_config {
    uint8_t  palette_id;
    uint8_t  start_row;
    uint8_t  reserved[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
};

// mr0 / mr1: rows of the two token tiles (1..16)
void amx_configure(const amx_kind & k, int mr0, int mr1) {
    alignas(64) tile_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette_id = 1;
    for (int t = 0; t < 4; t++) {
        cfg.rows[t]  = (uint8_t) (t < 2 ? mr0 : mr1);
        cfg.colsb[t] = 64;
    }
    cfg.rows[4] = (uint8_t) mr0; cfg.colsb[4] = (uint16_t) k.a_group;
    cfg.rows[5] = (uint8_t) mr1; cfg.colsb[5] = (uint16_t) k.a_group;
    for (int t = 6; t < 8; t++) {
        cfg.rows[t]  = (uint8_t) k.b_rows;
        cfg.colsb[t] = 64;
    }
    // the configuration is read from memory: the stores above must happen (llama.cpp #20824 crashed
    // on a configuration the compiler had optimized away)
    __asm__ volatile("" : : "m"(cfg) : "memory");
    _tile_loadconfig(&cfg);
}

// the tile rows of the current configuration, so that it is loaded again only when they change
struct tile_state {
    int mr0 = 0, mr1 = 0;
    void ensure(const amx_kind & k, int a, int b) {
        if (a != mr0 || b != mr1) {
            amx_configure(k, a, b);
            mr0 = a;
            mr1 = b;
        }
    }
};

inline __m512i load2x256(const void * lo, const void * hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) lo)),
                              _mm256_loadu_si256((const __m256i *) hi), 1);
}

inline __m512 cvtph16(const ggml_half * lo, const ggml_half * hi) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *) lo)),
                                                   _mm_loadu_si128((const __m128i *) hi), 1));
}

// ---- activations: one q8 row into its slot of a token tile ----

void amx_put_row_q4_0(int64_t nblk, const block_q8_0 * q, uint8_t * tile, int slot) {
    int8_t * a  = (int8_t *) tile;
    float *  da = (float *) (tile + nblk * 512);
    for (int64_t b = 0; b < nblk; b++) {
        memcpy(a + (b * TILE_M + slot) * 32, q[b].qs, 32);
        da[b * TILE_M + slot] = GGML_CPU_FP16_TO_FP32(q[b].d);
    }
}

void amx_put_row_q4_K(int64_t nblk, const block_q8_K * q, uint8_t * tile, int slot) {
    int8_t *  a    = (int8_t *) tile;
    float *   d    = (float *) (tile + nblk * 4096);
    int32_t * ssum = (int32_t *) (tile + nblk * (4096 + 64));
    for (int64_t sb = 0; sb < nblk; sb++) {
        for (int p = 0; p < 4; p++) {
            // A tile of sub-blocks 2p, 2p + 1: a token's row is their 64 quants
            memcpy(a + ((sb * 4 + p) * TILE_M + slot) * 64, q[sb].qs + 64 * p, 64);
            // as the VNNI kernel packs them: sub-block sums of 2p (low 16 bits) and 2p + 1 (high)
            const int16_t * bs = q[sb].bsums + 4 * p;
            const int s0 = bs[0] + bs[1], s1 = bs[2] + bs[3];
            ssum[(sb * 4 + p) * TILE_M + slot] = (int32_t) ((uint32_t) (uint16_t) s0 | ((uint32_t) (uint16_t) s1 << 16));
        }
        d[sb * TILE_M + slot] = q[sb].d;
    }
}

// src1 row x quantized as the VNNI path gets it (q8_K or q8_0 blocks)
void amx_quantize_row(const amx_kind & k, int64_t K, const float * x, void * q) {
    if (k.q4_K) {
        quantize_row_q8_K(x, q, K);
    } else {
        quantize_row_q8_0(x, q, K);
    }
}

// a quantized row into slot `slot` of `tile`
void amx_put_row(const amx_kind & k, int64_t K, const void * q, uint8_t * tile, int slot) {
    if (k.q4_K) {
        amx_put_row_q4_K(K / QK_K, (const block_q8_K *) q, tile, slot);
    } else {
        amx_put_row_q4_0(K / QK8_0, (const block_q8_0 *) q, tile, slot);
    }
}

// ---- weights: one 16-column tile (column groups g0, g0 + 1 of 8) into B tiles ----

void amx_unpack_q4_0(int64_t nblk, const block_q4_0x8 * g0, const block_q4_0x8 * g1, uint8_t * out) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i e8 = _mm512_set1_epi8(8);
    float * dw = (float *) (out + nblk * 512);
    for (int64_t b = 0; b < nblk; b++) {
        uint8_t * o = out + b * 512;
        // row j: k 4j .. 4j+3 (low nibbles of the 4-byte interleave), row 4 + j: k 16 + 4j .. (high)
        for (int j = 0; j < 4; j++) {
            const __m512i v = load2x256(g0[b].qs + 32 * j, g1[b].qs + 32 * j);
            _mm512_store_si512(o + 64 * j,       _mm512_sub_epi8(_mm512_and_si512(v, m4), e8));
            _mm512_store_si512(o + 64 * (4 + j), _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), e8));
        }
        _mm512_store_ps(dw + b * 16, cvtph16(g0[b].d, g1[b].d));
    }
}

void amx_unpack_q4_K(int64_t nblk, const block_q4_Kx8 * g0, const block_q4_Kx8 * g1, uint8_t * out) {
    const __m512i m4  = _mm512_set1_epi8(0x0F);
    const __m512i m3w = _mm512_set1_epi16(7);
    for (int64_t sb = 0; sb < nblk; sb++) {
        const block_q4_Kx8 & w0 = g0[sb];
        const block_q4_Kx8 & w1 = g1[sb];
        uint8_t * o = out + sb * 8576;
        __m128i dec0[8], dec1[8];
        ggml_dsc_q4_K_decode_scales(w0.scales, dec0);
        ggml_dsc_q4_K_decode_scales(w1.scales, dec1);
        for (int p = 0; p < 4; p++) {
            // per column c (dword c of a B row), both its words: the 3-bit halves of sub-block 2p + h's scale
            __m512i lo_s[2], hi_s[2];
            for (int h = 0; h < 2; h++) {
                const __m512i sc = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(dec0[2 * p + h], dec1[2 * p + h]));
                const __m512i s2 = _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16));
                lo_s[h] = _mm512_and_si512(s2, m3w);
                hi_s[h] = _mm512_and_si512(_mm512_srli_epi16(s2, 3), m3w);
            }
            uint8_t * blo = o + 1024 * p;
            uint8_t * bhi = o + 4096 + 1024 * p;
            for (int t = 0; t < 8; t++) {
                // 16 columns x k 4t .. 4t+3 of sub-blocks 2p (low nibbles) and 2p + 1 (high); a word holds
                // two quants of one column, q * s < 128 for each, so one 16-bit multiply scales both
                const __m512i v  = load2x256(w0.qs + 256 * p + 32 * t, w1.qs + 256 * p + 32 * t);
                const __m512i ql = _mm512_and_si512(v, m4);
                const __m512i qh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                _mm512_store_si512(blo + 64 * t,       _mm512_mullo_epi16(ql, lo_s[0]));
                _mm512_store_si512(bhi + 64 * t,       _mm512_mullo_epi16(ql, hi_s[0]));
                _mm512_store_si512(blo + 64 * (8 + t), _mm512_mullo_epi16(qh, lo_s[1]));
                _mm512_store_si512(bhi + 64 * (8 + t), _mm512_mullo_epi16(qh, hi_s[1]));
            }
        }
        _mm512_store_ps((float *) (o + 8192), cvtph16(w0.d, w1.d));
        _mm512_store_ps((float *) (o + 8256), cvtph16(w0.dmin, w1.dmin));
        for (int p = 0; p < 4; p++) {
            // the mins of sub-blocks 2p, 2p + 1 as int16 pairs per column (the VNNI kernel's mins_p)
            _mm512_store_si512(o + 8320 + 64 * p, _mm512_cvtepu8_epi16(_mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_unpackhi_epi8(dec0[2 * p], dec0[2 * p + 1])),
                    _mm_unpackhi_epi8(dec1[2 * p], dec1[2 * p + 1]), 1)));
        }
    }
}

// ---- kernels: TM token tiles x TN column tiles over all of K, sums into acc[TM * 16][TN * 16] ----

template <int TM, int TN>
void amx_kernel_q4_0(int64_t nblk, const uint8_t * a0, const uint8_t * a1, const uint8_t * b0, const uint8_t * b1, float (*acc)[32]) {
    alignas(64) int32_t cb[4][16][16];
    const float * da0 = (const float *) (a0 + nblk * 512);
    const float * da1 = TM > 1 ? (const float *) (a1 + nblk * 512) : nullptr;
    const float * dw0 = (const float *) (b0 + nblk * 512);
    const float * dw1 = TN > 1 ? (const float *) (b1 + nblk * 512) : nullptr;
    for (int r = 0; r < TM * 16; r++) {
        for (int c = 0; c < TN * 16; c += 16) {
            _mm512_store_ps(&acc[r][c], _mm512_setzero_ps());
        }
    }
    for (int64_t b = 0; b < nblk; b++) {
        // C0 / C1: token tile 0 x column tiles 0 / 1; C2 / C3: token tile 1
        _tile_zero(0);
        if constexpr (TN > 1) _tile_zero(1);
        if constexpr (TM > 1) _tile_zero(2);
        if constexpr (TM > 1 && TN > 1) _tile_zero(3);
        _tile_loadd(4, a0 + b * 512, 32);
        _tile_loadd(6, b0 + b * 512, 64);
        _tile_dpbssd(0, 4, 6);
        if constexpr (TN > 1) {
            _tile_loadd(7, b1 + b * 512, 64);
            _tile_dpbssd(1, 4, 7);
        }
        if constexpr (TM > 1) {
            _tile_loadd(5, a1 + b * 512, 32);
            _tile_dpbssd(2, 5, 6);
            if constexpr (TN > 1) _tile_dpbssd(3, 5, 7);
        }
        _tile_stored(0, cb[0], 64);
        if constexpr (TN > 1) _tile_stored(1, cb[1], 64);
        if constexpr (TM > 1) _tile_stored(2, cb[2], 64);
        if constexpr (TM > 1 && TN > 1) _tile_stored(3, cb[3], 64);

        const __m512 w0 = _mm512_load_ps(dw0 + b * 16);
        const __m512 w1 = TN > 1 ? _mm512_load_ps(dw1 + b * 16) : w0;
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) {
            // the VNNI GEMM's float step: acc + float(isum) * (d_w * d_a)
            const __m512 s0 = _mm512_set1_ps(da0[b * 16 + r]);
            _mm512_store_ps(&acc[r][0], _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb[0][r])), _mm512_mul_ps(w0, s0), _mm512_load_ps(&acc[r][0])));
            if constexpr (TN > 1) {
                _mm512_store_ps(&acc[r][16], _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb[1][r])), _mm512_mul_ps(w1, s0), _mm512_load_ps(&acc[r][16])));
            }
            if constexpr (TM > 1) {
                const __m512 s1 = _mm512_set1_ps(da1[b * 16 + r]);
                _mm512_store_ps(&acc[16 + r][0], _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb[2][r])), _mm512_mul_ps(w0, s1), _mm512_load_ps(&acc[16 + r][0])));
                if constexpr (TN > 1) {
                    _mm512_store_ps(&acc[16 + r][16], _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb[3][r])), _mm512_mul_ps(w1, s1), _mm512_load_ps(&acc[16 + r][16])));
                }
            }
        }
    }
}

// q4_K: TM token tiles x one column tile; C 2m / 2m + 1: token tile m's sums against q * lo / q * hi
template <int TM>
void amx_kernel_q4_K(int64_t nsb, const uint8_t * a0, const uint8_t * a1, const uint8_t * bt, float (*acc)[32]) {
    alignas(64) int32_t cb[4][16][16];
    const uint8_t * at[2] = { a0, a1 };
    for (int r = 0; r < TM * 16; r++) {
        _mm512_store_ps(&acc[r][0], _mm512_setzero_ps());
    }
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t * w = bt + sb * 8576;
        _tile_zero(0);
        _tile_zero(1);
        if constexpr (TM > 1) {
            _tile_zero(2);
            _tile_zero(3);
        }
        for (int p = 0; p < 4; p++) {
            _tile_loadd(4, a0 + (sb * 4 + p) * 1024, 64);
            _tile_loadd(6, w + 1024 * p, 64);
            _tile_dpbssd(0, 4, 6);
            _tile_loadd(7, w + 4096 + 1024 * p, 64);
            _tile_dpbssd(1, 4, 7);
            if constexpr (TM > 1) {
                _tile_loadd(5, a1 + (sb * 4 + p) * 1024, 64);
                _tile_dpbssd(2, 5, 6);
                _tile_dpbssd(3, 5, 7);
            }
        }
        _tile_stored(0, cb[0], 64);
        _tile_stored(1, cb[1], 64);
        if constexpr (TM > 1) {
            _tile_stored(2, cb[2], 64);
            _tile_stored(3, cb[3], 64);
        }

        const __m512  col_d    = _mm512_load_ps((const float *) (w + 8192));
        const __m512  col_dmin = _mm512_load_ps((const float *) (w + 8256));
        const __m512i mins0 = _mm512_load_si512(w + 8320), mins1 = _mm512_load_si512(w + 8384);
        const __m512i mins2 = _mm512_load_si512(w + 8448), mins3 = _mm512_load_si512(w + 8512);
        for (int m = 0; m < TM; m++) {
            const uint8_t * a    = at[m];
            const float *   rd   = (const float *) (a + nsb * 4096) + sb * 16;
            const int32_t * ssum = (const int32_t *) (a + nsb * (4096 + 64)) + sb * 64;
#pragma GCC unroll 16
            for (int r = 0; r < 16; r++) {
                const __m512i isum = _mm512_add_epi32(_mm512_load_si512(cb[2 * m][r]), _mm512_slli_epi32(_mm512_load_si512(cb[2 * m + 1][r]), 3));
                const __m512i im = _mm512_add_epi32(
                        _mm512_add_epi32(_mm512_madd_epi16(mins0, _mm512_set1_epi32(ssum[r])),
                                         _mm512_madd_epi16(mins1, _mm512_set1_epi32(ssum[16 + r]))),
                        _mm512_add_epi32(_mm512_madd_epi16(mins2, _mm512_set1_epi32(ssum[32 + r])),
                                         _mm512_madd_epi16(mins3, _mm512_set1_epi32(ssum[48 + r]))));
                const __m512 row_d = _mm512_set1_ps(rd[r]);
                __m512 v = _mm512_load_ps(&acc[16 * m + r][0]);
                v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(col_d, row_d), v);
                v = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(col_dmin, row_d), v);
                _mm512_store_ps(&acc[16 * m + r][0], v);
            }
        }
    }
}

// ---- one work item: a panel of columns [n0, n0 + ncols) of one weight matrix, for a run of token tiles ----

struct amx_tokens {
    const uint8_t * tiles;     // first token tile
    size_t          tile_bytes;
    int64_t         ntiles;
    int64_t         count;     // tokens (the last tile holds count - 16 (ntiles - 1))
    // output row of token slot s (tile * 16 + row)
    float * (*row)(const void * ctx, int64_t slot);
    const void *    ctx;
};

void amx_item(const amx_kind & k, int64_t nblk, const uint8_t * w, int64_t n0, int64_t ncols,
              const amx_tokens & tok, uint8_t * panel, float (*acc)[32], tile_state & ts) {
    const size_t  ct  = k.b_coltile(nblk);
    const int64_t nct = ncols / 16;
    const size_t  gstride = (size_t) nblk * (k.q4_K ? sizeof(block_q4_Kx8) : sizeof(block_q4_0x8));
    for (int64_t c = 0; c < nct; c++) {
        const uint8_t * g0 = w + (size_t) (n0 / 8 + 2 * c) * gstride;
        if (k.q4_K) {
            amx_unpack_q4_K(nblk, (const block_q4_Kx8 *) g0, (const block_q4_Kx8 *) (g0 + gstride), panel + c * ct);
        } else {
            amx_unpack_q4_0(nblk, (const block_q4_0x8 *) g0, (const block_q4_0x8 *) (g0 + gstride), panel + c * ct);
        }
    }
    for (int64_t t = 0; t < tok.ntiles; t += 2) {
        const int tm  = t + 1 < tok.ntiles ? 2 : 1;
        const int mr0 = (int) std::min<int64_t>(TILE_M, tok.count - TILE_M * t);
        const int mr1 = tm > 1 ? (int) std::min<int64_t>(TILE_M, tok.count - TILE_M * (t + 1)) : TILE_M;
        ts.ensure(k, mr0, mr1);
        const uint8_t * a0 = tok.tiles + (size_t) t * tok.tile_bytes;
        const uint8_t * a1 = a0 + tok.tile_bytes;
        const int tn = k.q4_K ? 1 : 2;
        for (int64_t c = 0; c < nct; c += tn) {
            const uint8_t * b0 = panel + c * ct;
            int cw = 16; // columns this call
            if (k.q4_K) {
                if (tm > 1) amx_kernel_q4_K<2>(nblk, a0, a1, b0, acc);
                else        amx_kernel_q4_K<1>(nblk, a0, a1, b0, acc);
            } else if (c + 1 < nct) {
                cw = 32;
                if (tm > 1) amx_kernel_q4_0<2, 2>(nblk, a0, a1, b0, b0 + ct, acc);
                else        amx_kernel_q4_0<1, 2>(nblk, a0, a1, b0, b0 + ct, acc);
            } else {
                if (tm > 1) amx_kernel_q4_0<2, 1>(nblk, a0, a1, b0, nullptr, acc);
                else        amx_kernel_q4_0<1, 1>(nblk, a0, a1, b0, nullptr, acc);
            }
            for (int m = 0; m < tm; m++) {
                const int mr = m == 0 ? mr0 : mr1;
                for (int r = 0; r < mr; r++) {
                    float * out = tok.row(tok.ctx, (t + m) * TILE_M + r) + n0 + 16 * c;
                    memcpy(out, acc[16 * m + r], cw * sizeof(float));
                }
            }
        }
    }
}

// ---- the ops ----

struct dense_rows {
    char * dst;
    size_t nb1;
};

float * dense_row(const void * ctx, int64_t slot) {
    const dense_rows * d = (const dense_rows *) ctx;
    return (float *) (d->dst + slot * d->nb1);
}

struct expert_rows {
    char *          dst;
    size_t          nb1, nb2;
    const int32_t * slots;   // (i1, i2) per slot of the expert's tiles
};

float * expert_row(const void * ctx, int64_t slot) {
    const expert_rows * e = (const expert_rows *) ctx;
    return (float *) (e->dst + e->slots[2 * slot] * e->nb1 + e->slots[2 * slot + 1] * e->nb2);
}

void amx_mul_mat(const amx_kind & k, const ggml_compute_params * params, ggml_tensor * op) {
    const ggml_tensor * src0 = op->src[0];
    const ggml_tensor * src1 = op->src[1];
    const int ith = params->ith;
    const int nth = params->nth;
    const amx_plan p = amx_plan_of(k, op, nth);
    GGML_ASSERT(params->wsize >= p.total);

    uint8_t * base    = align64(params->wdata);
    uint8_t * tiles   = base + p.ids_bytes;
    uint8_t * scratch = tiles + (size_t) p.ntiles * p.tile_bytes + (size_t) ith * p.thread_bytes;
    void *    q8tmp   = scratch;
    uint8_t * panel   = scratch + pad64(k.q8_row(p.nblk));
    float (*acc)[32]  = (float (*)[32]) (panel + pad64((size_t) (amx_panel_cols(k, src0->ne[0]) / 16) * k.b_coltile(p.nblk)));

    const int64_t K = src0->ne[0], N = src0->ne[1], M = src1->ne[1];
    // a whole tile per thread, so that its lines fill in cache
    for (int64_t t = ith; t < p.ntiles; t += nth) {
        for (int64_t r = t * TILE_M; r < std::min(M, (t + 1) * TILE_M); r++) {
            amx_quantize_row(k, K, (const float *) ((const char *) src1->data + r * src1->nb[1]), q8tmp);
            amx_put_row(k, K, q8tmp, tiles + (size_t) t * p.tile_bytes, (int) (r % TILE_M));
        }
    }
    if (ith == 0) {
        ggml_threadpool_chunk_set(params->threadpool, nth);
    }
    ggml_barrier(params->threadpool);

    const int64_t P  = amx_panel_cols(k, K);
    const int64_t ni = (N + P - 1) / P;
    const dense_rows rows = { (char *) op->data, op->nb[1] };
    const amx_tokens tok  = { tiles, p.tile_bytes, p.ntiles, M, dense_row, &rows };
    tile_state ts;
    for (int64_t i = ith; i < ni; i = ggml_threadpool_chunk_add(params->threadpool, 1)) {
        amx_item(k, p.nblk, (const uint8_t *) src0->data, i * P, std::min(P, N - i * P), tok, panel, acc, ts);
    }
    if (ts.mr0 != 0) {
        _tile_release();
    }
}

void amx_mul_mat_id(const amx_kind & k, const ggml_compute_params * params, ggml_tensor * op) {
    const ggml_tensor * src0 = op->src[0];
    const ggml_tensor * src1 = op->src[1];
    const ggml_tensor * ids  = op->src[2];
    const int ith = params->ith;
    const int nth = params->nth;
    const amx_plan p = amx_plan_of(k, op, nth);
    GGML_ASSERT(params->wsize >= p.total);

    const int64_t n_as  = src0->ne[2];
    const int64_t n_ids = ids->ne[0];
    const int64_t n_tok = ids->ne[1];
    const int64_t K = src0->ne[0], N = src0->ne[1];

    uint8_t * base = align64(params->wdata);
    int64_t * counts    = (int64_t *) base;        // [n_as] tokens per expert
    int64_t * tile_base = counts + n_as;           // [n_as + 1] first token tile of each expert
    int64_t * used      = tile_base + n_as + 1;    // [n_as] the experts with tokens, then their count
    int32_t * slots     = (int32_t *) (base + pad64(sizeof(int64_t) * (3 * n_as + 2))); // (i1, i2) per tile row
    uint8_t * q8rows    = (uint8_t *) slots + pad64(sizeof(int32_t) * 2 * p.ntiles * TILE_M); // [i2][i11]
    uint8_t * tiles     = base + p.ids_bytes;
    uint8_t * scratch   = tiles + (size_t) p.ntiles * p.tile_bytes + (size_t) ith * p.thread_bytes;
    void *    q8tmp     = scratch;
    uint8_t * panel     = scratch + pad64(k.q8_row(p.nblk));
    float (*acc)[32]    = (float (*)[32]) (panel + pad64((size_t) (amx_panel_cols(k, K) / 16) * k.b_coltile(p.nblk)));

    const auto expert_of = [&](int64_t i1, int64_t i2) {
        return *(const int32_t *) ((const char *) ids->data + i1 * ids->nb[0] + i2 * ids->nb[1]);
    };
    if (ith == 0) {
        memset(counts, 0, sizeof(int64_t) * n_as);
        for (int64_t i2 = 0; i2 < n_tok; i2++) {
            for (int64_t i1 = 0; i1 < n_ids; i1++) {
                const int32_t e = expert_of(i1, i2);
                GGML_ASSERT(e >= 0 && e < n_as);
                counts[e]++;
            }
        }
        int64_t nused = 0;
        tile_base[0] = 0;
        for (int64_t e = 0; e < n_as; e++) {
            tile_base[e + 1] = tile_base[e] + (counts[e] + TILE_M - 1) / TILE_M;
            if (counts[e] > 0) {
                used[nused++] = e;
            }
        }
        used[n_as] = nused;
        GGML_ASSERT(tile_base[n_as] <= p.ntiles);
        // every slot of the experts' tiles: its token, or (-1, -1) in a last tile's unused rows
        for (int64_t s = 0; s < tile_base[n_as] * TILE_M; s++) {
            slots[2 * s] = slots[2 * s + 1] = -1;
        }
        std::vector<int64_t> fill(n_as, 0);
        for (int64_t i2 = 0; i2 < n_tok; i2++) {
            for (int64_t i1 = 0; i1 < n_ids; i1++) {
                const int32_t e = expert_of(i1, i2);
                const int64_t s = tile_base[e] * TILE_M + fill[e]++;
                slots[2 * s]     = (int32_t) i1;
                slots[2 * s + 1] = (int32_t) i2;

            }
        }
    }
    ggml_barrier(params->threadpool);

    // each src1 row quantized once; then each tile built by one thread from its tokens' rows, so that
    // its lines fill in cache (scattered 32-byte writes into a large buffer cost a line fill each)
    const int64_t n_rows = src1->ne[1];  // 1 (one row for all of a token's experts) or n_ids
    for (int64_t r = ith; r < n_tok * n_rows; r += nth) {
        amx_quantize_row(k, K, (const float *) ((const char *) src1->data + (r % n_rows) * src1->nb[1] + (r / n_rows) * src1->nb[2]),
                         q8rows + r * p.q8_bytes);
    }
    ggml_barrier(params->threadpool);
    for (int64_t t = ith; t < tile_base[n_as]; t += nth) {
        for (int r = 0; r < TILE_M; r++) {
            const int64_t s = t * TILE_M + r;
            if (slots[2 * s] >= 0) {
                const int64_t row = (int64_t) slots[2 * s + 1] * n_rows + slots[2 * s] % n_rows;
                amx_put_row(k, K, q8rows + row * p.q8_bytes, tiles + (size_t) t * p.tile_bytes, r);
            }
        }
    }
    if (ith == 0) {
        ggml_threadpool_chunk_set(params->threadpool, nth);
    }
    ggml_barrier(params->threadpool);

    const int64_t P   = amx_panel_cols(k, K);
    const int64_t npn = (N + P - 1) / P;
    const int64_t ni  = used[n_as] * npn;
    tile_state ts;
    for (int64_t i = ith; i < ni; i = ggml_threadpool_chunk_add(params->threadpool, 1)) {
        const int64_t e  = used[i / npn];
        const int64_t n0 = (i % npn) * P;
        const expert_rows rows = { (char *) op->data, op->nb[1], op->nb[2], slots + 2 * tile_base[e] * TILE_M };
        const amx_tokens  tok  = { tiles + (size_t) tile_base[e] * p.tile_bytes, p.tile_bytes,
                                   tile_base[e + 1] - tile_base[e], counts[e], expert_row, &rows };
        amx_item(k, p.nblk, (const uint8_t *) src0->data + e * src0->nb[2], n0, std::min(P, N - n0), tok, panel, acc, ts);
    }
    if (ts.mr0 != 0) {
        _tile_release();
    }
}

} // namespace

#endif // DSC_AMX

size_t ggml_dsc_amx_work_size(const struct ggml_tensor * op, int n_threads, int64_t nb_cols, int64_t inter_size) {
#if defined(DSC_AMX)
    const amx_kind * k = amx_kind_of(op, nb_cols, inter_size);
    if (k == nullptr) {
        return 0;
    }
    // no smaller than the stock layout, which runs if the op is computed in reference mode (use_ref)
    const ggml_tensor * src1 = op->src[1];
    size_t stock = ggml_row_size(k->q4_K ? GGML_TYPE_Q8_K : GGML_TYPE_Q8_0, ggml_nelements(src1));
    if (op->op == GGML_OP_MUL_MAT_ID) {
        stock = GGML_PAD(stock, sizeof(int64_t)) + sizeof(int64_t) * op->src[0]->ne[2] * (src1->ne[2] + 1);
    }
    return std::max(stock, amx_plan_of(*k, op, n_threads).total);
#else
    GGML_UNUSED(op); GGML_UNUSED(n_threads); GGML_UNUSED(nb_cols); GGML_UNUSED(inter_size);
    return 0;
#endif
}

bool ggml_dsc_amx_forward(const struct ggml_compute_params * params, struct ggml_tensor * op, int64_t nb_cols, int64_t inter_size) {
#if defined(DSC_AMX)
    const amx_kind * k = params->use_ref ? nullptr : amx_kind_of(op, nb_cols, inter_size);
    if (k == nullptr) {
        return false;
    }
    if (op->op == GGML_OP_MUL_MAT) {
        amx_mul_mat(*k, params, op);
    } else {
        amx_mul_mat_id(*k, params, op);
    }
    return true;
#else
    GGML_UNUSED(params); GGML_UNUSED(op); GGML_UNUSED(nb_cols); GGML_UNUSED(inter_size);
    return false;
#endif
}
