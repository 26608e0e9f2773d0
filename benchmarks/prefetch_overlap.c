// Does prefetching the next weights during a compute phase make reading them faster afterwards?
// Models a decoded token's layer: stream 48 MB (the experts), run a register-only compute phase of
// COMPUTE_US microseconds (single-token attention) with or without prefetching the next MB megabytes
// (attn_v_b, attn_output, the router), then read those megabytes. 2 threads (OMP_NUM_THREADS=2).
//   gcc -O2 -march=native -fopenmp benchmarks/prefetch_overlap.c -o /tmp/prefetch_overlap
//   OMP_NUM_THREADS=2 /tmp/prefetch_overlap MB HINT COMPUTE_US     (HINT: 0 t0, 1 t1, 2 t2)
// On the AVX-512 Zen 4 guest, 3 MB after 160 us: 69.4 us cold, 32.7 us prefetched. In the engine the
// consumers did get faster, but the real attention kernel (which reads K/V from L2) slowed by more.
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9*t.tv_nsec; }

static __m256i sum_range(const char * q, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a;
    for (size_t i = 0; i < n; i += 64) {
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *) (q + i)));
        b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *) (q + i + 32)));
    }
    return _mm256_add_epi64(a, b);
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MB HINT COMPUTE_US\n", argv[0]);
        return 2;
    }
    const size_t big = (size_t) 1 << 30, nb = (size_t) atoi(argv[1]) << 20;
    const int hint = atoi(argv[2]);
    const double comp_us = atof(argv[3]);
    const int nlay = 16;
    char * A = aligned_alloc(64, big);
    char * B = aligned_alloc(64, nb*nlay);
    memset(A, 1, big);
    memset(B, 2, nb*nlay);
    for (int mode = 0; mode < 2; mode++) {
        double tread = 0, tcomp = 0;
        long long chk = 0;
        for (int rep = 0; rep < 3; rep++) {
            for (int L = 0; L < nlay; L++) {
                char * b = B + L*nb;
                char * a = A + ((size_t) (rep*nlay + L)*(48 << 20)) % (big - (48 << 20));
                #pragma omp parallel reduction(+:chk)
                {
                    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
                    __m256i s = sum_range(a + (size_t) id*((48 << 20)/nt), (48 << 20)/nt);
                    #pragma omp barrier
                    const double t0 = now();
                    __m256 x = _mm256_set1_ps(1.0f), y = x, z = x, w = x;
                    const size_t ch = nb/nt;
                    const char * pb = b + id*ch;
                    size_t off = 0;
                    while (now() - t0 < comp_us*1e-6) {
                        for (int k = 0; k < 64; k++) {
                            x = _mm256_fmadd_ps(x, y, z);
                            w = _mm256_fmadd_ps(w, z, y);
                        }
                        for (int k = 0; mode == 1 && k < 16 && off < ch; k++, off += 64) {
                            if (hint == 1) _mm_prefetch(pb + off, _MM_HINT_T1);
                            else if (hint == 2) _mm_prefetch(pb + off, _MM_HINT_T2);
                            else _mm_prefetch(pb + off, _MM_HINT_T0);
                        }
                    }
                    #pragma omp barrier
                    const double t1 = now();
                    s = _mm256_add_epi64(s, sum_range(pb, ch));
                    #pragma omp barrier
                    const double t2 = now();
                    if (id == 0) {
                        tcomp += t1 - t0;
                        tread += t2 - t1;
                    }
                    chk += _mm256_extract_epi64(s, 0) + (long long) _mm256_cvtss_f32(_mm256_add_ps(x, w));
                }
            }
        }
        const double n = 3.0*nlay;
        printf("%s: read %d MB after compute: %.1f us (%.1f GB/s), compute %.1f us (check %lld)\n",
               mode ? "prefetched" : "cold      ", (int) (nb >> 20), 1e6*tread/n, nb/(tread/n)/1e9, 1e6*tcomp/n, chk & 1);
    }
    return 0;
}
