// deepseek-cpu: copies of ours: the strided source of ggml_compute_forward_dup_bytes (2- and 4-byte
// elements, through a tile) and CONCAT along rows as two copies per row. Called from ops.cpp.

#include "ggml-cpu-impl.h"
#include "dsc/dsc-ops.h"

#include <cstring>

#if defined(__AVX2__)
// deepseek-cpu: in-lane 8x8 transpose of 16-bit elements (each 128-bit lane holds an 8x8 block)
static inline void dsc_transpose8x8_epi16_lanes(const __m256i * x, __m256i * u) {
    const __m256i s0 = _mm256_unpacklo_epi16(x[0], x[1]), s1 = _mm256_unpackhi_epi16(x[0], x[1]);
    const __m256i s2 = _mm256_unpacklo_epi16(x[2], x[3]), s3 = _mm256_unpackhi_epi16(x[2], x[3]);
    const __m256i s4 = _mm256_unpacklo_epi16(x[4], x[5]), s5 = _mm256_unpackhi_epi16(x[4], x[5]);
    const __m256i s6 = _mm256_unpacklo_epi16(x[6], x[7]), s7 = _mm256_unpackhi_epi16(x[6], x[7]);
    const __m256i t0 = _mm256_unpacklo_epi32(s0, s2), t1 = _mm256_unpackhi_epi32(s0, s2);
    const __m256i t2 = _mm256_unpacklo_epi32(s1, s3), t3 = _mm256_unpackhi_epi32(s1, s3);
    const __m256i t4 = _mm256_unpacklo_epi32(s4, s6), t5 = _mm256_unpackhi_epi32(s4, s6);
    const __m256i t6 = _mm256_unpacklo_epi32(s5, s7), t7 = _mm256_unpackhi_epi32(s5, s7);
    u[0] = _mm256_unpacklo_epi64(t0, t4); u[1] = _mm256_unpackhi_epi64(t0, t4);
    u[2] = _mm256_unpacklo_epi64(t1, t5); u[3] = _mm256_unpackhi_epi64(t1, t5);
    u[4] = _mm256_unpacklo_epi64(t2, t6); u[5] = _mm256_unpackhi_epi64(t2, t6);
    u[6] = _mm256_unpacklo_epi64(t3, t7); u[7] = _mm256_unpackhi_epi64(t3, t7);
}

// 16x16 block of 16-bit elements: source rows `src_stride` bytes apart, destination rows `dst_stride` elements apart
static inline void dsc_transpose16x16_u16(const char * src, size_t src_stride, uint16_t * dst, int64_t dst_stride) {
    __m256i a[16], u[8], v[8];
    for (int i = 0; i < 16; i++) {
        a[i] = _mm256_loadu_si256((const __m256i *) (src + i*src_stride));
    }
    dsc_transpose8x8_epi16_lanes(a, u);
    dsc_transpose8x8_epi16_lanes(a + 8, v);
    for (int j = 0; j < 8; j++) {
        _mm256_storeu_si256((__m256i *) (dst + j*dst_stride),       _mm256_permute2x128_si256(u[j], v[j], 0x20));
        _mm256_storeu_si256((__m256i *) (dst + (8 + j)*dst_stride), _mm256_permute2x128_si256(u[j], v[j], 0x31));
    }
}
#endif

// src0 not contiguous in its first dimension, dst contiguous: this thread's rows [ir0, ir1) of every
// plane to dst_ptr + id on (ggml_compute_forward_dup_bytes' locals); false for other element sizes
bool ggml_dsc_dup_bytes_strided(const ggml_tensor * src0, char * dst_ptr, size_t id, const int ir0, const int ir1,
                                const size_t type_size) {
    GGML_TENSOR_LOCALS(int64_t, ne0, src0, ne)
    GGML_TENSOR_LOCALS(size_t,  nb0, src0, nb)
    const size_t rs = ne00 * type_size;

    // deepseek-cpu: strided source (e.g. ggml_cont(ggml_transpose(v)) of an MLA KV cache on every
    // decoded token): copy 2- and 4-byte elements with typed loads instead of a memcpy call per
    // element, through a 16 x 64-byte tile: the source is read in runs of 16 elements and each
    // destination row gets whole 64-byte pieces, so neither side loads a cache line more than
    // once per tile (destination rows of a transposed cache are often a multiple of 4 KiB apart,
    // where walking them an element at a time thrashes one L1 set).
    auto copy_strided = [&](auto tag) {
        using T = decltype(tag);
        constexpr int64_t RB = 16;                 // destination rows per tile
        constexpr int64_t CB = 64 / sizeof(T);     // destination columns per tile (one cache line)
        T tile[RB][CB];
        for (int64_t i03 = 0; i03 < ne03; i03++) {
            for (int64_t i02 = 0; i02 < ne02; i02++) {
                T * dst_plane = (T *) (dst_ptr + id) + ir0 * ne00;
                const char * src_plane = (const char *) src0->data + i02*nb02 + i03*nb03;
                for (int64_t r0 = ir0; r0 < ir1; r0 += RB) {
                    const int64_t nr_t = MIN(RB, ir1 - r0);
                    int64_t c_first = 0;
#if defined(__AVX2__)
                    // f16 with the 16 rows contiguous in the source (a transposed view): 16x16 blocks in registers
                    if constexpr (sizeof(T) == 2) {
                        if (nr_t == 16 && nb01 == 2) {
                            for (; c_first + 16 <= ne00; c_first += 16) {
                                dsc_transpose16x16_u16(src_plane + c_first*nb00 + r0*nb01, nb00,
                                                       dst_plane + (r0 - ir0)*ne00 + c_first, ne00);
                            }
                        }
                    }
#endif
                    for (int64_t c0 = c_first; c0 < ne00; c0 += CB) {
                        const int64_t nc_t = MIN(CB, ne00 - c0);
                        for (int64_t c = 0; c < nc_t; c++) {
                            const char * s = src_plane + (c0 + c)*nb00 + r0*nb01;
                            for (int64_t r = 0; r < nr_t; r++) {
                                memcpy(&tile[r][c], s + r*nb01, sizeof(T));
                            }
                        }
                        for (int64_t r = 0; r < nr_t; r++) {
                            memcpy(dst_plane + (r0 - ir0 + r)*ne00 + c0, tile[r], nc_t*sizeof(T));
                        }
                    }
                }
                id += rs * ne01;
            }
        }
    };
    if (type_size == 2) {
        copy_strided(uint16_t{});
    } else if (type_size == 4) {
        copy_strided(uint32_t{});
    } else {
        return false;
    }
    return true;
}

// CONCAT of f32 rows along dim 0, when all three are contiguous in it
bool ggml_dsc_concat_f32_rows(const ggml_compute_params * params, ggml_tensor * dst, const int32_t dim) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];

    const int ith = params->ith;
    const int nth = params->nth;

    GGML_TENSOR_BINARY_OP_LOCALS

    // deepseek-cpu: joining rows (dim 0) whose elements are contiguous is two copies per row; the
    // element loop below branches and recomputes both addresses for every float (MLA prefill joins
    // every cached key's no-rope and rope parts this way, ~1% of a 512-token prefill). Rows are
    // split over the threads as a flat range.
    if (dim == 0 && nb00 == sizeof(float) && nb10 == sizeof(float) && nb0 == sizeof(float)) {
        const int64_t nr  = ne1*ne2*ne3;
        const int64_t ir0 = nr*ith/nth;
        const int64_t ir1 = nr*(ith + 1)/nth;
        for (int64_t ir = ir0; ir < ir1; ir++) {
            const int64_t i3 = ir/(ne1*ne2);
            const int64_t i2 = (ir - i3*ne1*ne2)/ne1;
            const int64_t i1 = ir - i3*ne1*ne2 - i2*ne1;
            char * y = (char *) dst->data + i1*nb1 + i2*nb2 + i3*nb3;
            memcpy(y,                       (const char *) src0->data + i1*nb01 + i2*nb02 + i3*nb03, ne00*sizeof(float));
            memcpy(y + ne00*sizeof(float),  (const char *) src1->data + i1*nb11 + i2*nb12 + i3*nb13, ne10*sizeof(float));
        }
        return true;
    }
    return false;
}
