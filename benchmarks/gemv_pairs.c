// Why patch 0056 takes long q5_0 rows two at a time, and why its pair loop prefetches.
// One q8_0 column times q5_0 rows of N values, each row's result one fmadd chain over its blocks in
// the reference's order (bit-identical to ggml_vec_dot_q5_0_q8_0's AVX2 path): one row per pass,
// two rows per pass, and two rows per pass with the next pair's span prefetched. Prints ns per block
// per thread and GB/s, checks that the three give the same bits.
//   gcc -O2 -march=native -fopenmp benchmarks/gemv_pairs.c -o /tmp/gemv_pairs     (AVX-512 BW/VL/VNNI)
//   OMP_NUM_THREADS=1 /tmp/gemv_pairs 0.5 1408       # weights in L2
//   OMP_NUM_THREADS=2 /tmp/gemv_pairs 200 1408       # weights from DRAM
// On the AVX-512 Zen 4 guest (N = 1408), three runs each: from L2 0.91-1.08 / 0.82-1.14 / 0.82-1.02 ns
// per block; from DRAM on two threads 31-40 / ~10 / 45-47 GB/s: without the prefetch the hardware
// streamer does not follow the two interleaved streams.
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } block_q5_0;
typedef struct { uint16_t d; int8_t qs[32]; } block_q8_0;
enum { MAX_BLOCKS = 512 };

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9*t.tv_nsec; }

static inline float hsum8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

// q + 16 where the fifth bit is set: byte j is element j, qh's bit j its fifth bit
static inline __m256i unsigned_q5(const block_q5_0 * x) {
    const __m256i qs  = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) x->qs));
    const __m256i nib = _mm256_and_si256(_mm256_srlv_epi32(qs, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(15));
    uint32_t qh;
    memcpy(&qh, x->qh, 4);
    return _mm256_mask_add_epi8(nib, (__mmask32) qh, nib, _mm256_set1_epi8(16));
}

// mode 0: one row per pass; 1: two rows per pass; 2: two rows per pass, next pair prefetched
static void gemv(int mode, int n, int nr, float * s, const char * vx, size_t bx, const block_q8_0 * y) {
    const int nb = n / 32;
    __m256i noff[MAX_BLOCKS];
    float dy[MAX_BLOCKS];
    for (int ib = 0; ib < nb; ++ib) {
        const __m256i qy = _mm256_loadu_si256((const __m256i *) y[ib].qs);
        noff[ib] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(16), qy), _mm256_set1_epi16(1)));
        dy[ib] = _cvtsh_ss(y[ib].d);
    }
    int r = 0;
    for (; mode > 0 && r + 1 < nr; r += 2) {
        const block_q5_0 * x0 = (const block_q5_0 *) (vx + r*bx);
        const block_q5_0 * x1 = (const block_q5_0 *) (vx + (r + 1)*bx);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        for (int ib = 0; ib < nb; ++ib) {
            if (mode == 2) {
                _mm_prefetch((const char *) x0 + 2*bx + 2*sizeof(block_q5_0)*ib, _MM_HINT_T0);
            }
            const __m256i qy = _mm256_loadu_si256((const __m256i *) y[ib].qs);
            const __m256 d0 = _mm256_set1_ps(_cvtsh_ss(x0[ib].d) * dy[ib]);
            const __m256 d1 = _mm256_set1_ps(_cvtsh_ss(x1[ib].d) * dy[ib]);
            a0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(noff[ib], unsigned_q5(x0 + ib), qy)), a0);
            a1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(noff[ib], unsigned_q5(x1 + ib), qy)), a1);
        }
        s[r] = hsum8(a0);
        s[r + 1] = hsum8(a1);
    }
    for (; r < nr; ++r) {
        const block_q5_0 * x = (const block_q5_0 *) (vx + r*bx);
        __m256 a = _mm256_setzero_ps();
        for (int ib = 0; ib < nb; ++ib) {
            const __m256i qy = _mm256_loadu_si256((const __m256i *) y[ib].qs);
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[ib].d) * dy[ib]);
            a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(noff[ib], unsigned_q5(x + ib), qy)), a);
        }
        s[r] = hsum8(a);
    }
}

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MEGABYTES N (N a multiple of 32, at most %d)\n", argv[0], 32*MAX_BLOCKS);
        return 2;
    }
    const size_t ws = (size_t) (atof(argv[1]) * 1048576);
    const int n = atoi(argv[2]);
    if (n <= 0 || n % 32 || n / 32 > MAX_BLOCKS) {
        fprintf(stderr, "N must be a positive multiple of 32, at most %d\n", 32*MAX_BLOCKS);
        return 2;
    }
    const size_t bx = n / 32 * sizeof(block_q5_0);
    const int nr = ws / bx > 2 ? (int) (ws / bx) : 2;
    char * w = malloc(nr * bx);
    for (size_t i = 0; i < nr * bx; ++i) {
        w[i] = (char) rand();
    }
    for (int r = 0; r < nr; ++r) {
        for (int b = 0; b < n / 32; ++b) {
            const uint16_t d = 0x2000 + (rand() & 0x3ff);  // finite, normal scales
            memcpy(w + r*bx + b*sizeof(block_q5_0), &d, 2);
        }
    }
    block_q8_0 y[MAX_BLOCKS];
    for (int b = 0; b < n / 32; ++b) {
        y[b].d = 0x2000 + (rand() & 0x3ff);
        for (int j = 0; j < 32; ++j) {
            y[b].qs[j] = (int8_t) (rand() % 255 - 127);
        }
    }
    float * s[3];
    for (int m = 0; m < 3; ++m) {
        s[m] = malloc(nr * sizeof(float));
        gemv(m, n, nr, s[m], w, bx, y);
    }
    const int same = !memcmp(s[0], s[1], nr * sizeof(float)) && !memcmp(s[0], s[2], nr * sizeof(float));
    printf("%d rows of %d: results %s\n", nr, n, same ? "bit-identical" : "DIFFER");
    const int reps = ws < (8 << 20) ? 2000 : 10;
    const char * names[3] = { "one row per pass      ", "two rows per pass     ", "two rows + prefetch   " };
    for (int k = 0; k < 3; ++k) {
        for (int m = 0; m < 3; ++m) {
            const double t = now();
            int nt = 1;
            #pragma omp parallel
            {
                nt = omp_get_num_threads();
                const int id = omp_get_thread_num();
                const int r0 = (int) ((long) nr * id / nt), r1 = (int) ((long) nr * (id + 1) / nt);
                for (int rep = 0; rep < reps; ++rep) {
                    gemv(m, n, r1 - r0, s[m] + r0, w + r0*bx, bx, y);
                    #pragma omp barrier
                }
            }
            const double dt = now() - t;
            printf("%s %6.2f GB/s  %5.2f ns per block per thread\n", names[m], (double) nr*bx*reps/dt/1e9,
                   nt*dt*1e9/((double) nr*(n/32)*reps));
        }
    }
    return same ? 0 : 1;
}
