// Streaming read bandwidth with N threads (AVX2 loads): the decode roofline is this divided
// by the bytes a decoded token reads (V2-Lite Q4_0: 1.445 GB; see
// `python benchmarks/bytes_per_token.py MODEL.gguf`).
//
//   gcc -O2 -mavx2 -fopenmp benchmarks/membw.c -o /tmp/membw && /tmp/membw 2
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char ** argv) {
    const int nt = argc > 1 ? atoi(argv[1]) : 2;
    const size_t n = (size_t) 2 << 30;  // 2 GiB, far beyond the caches
    char * p = aligned_alloc(64, n);
    memset(p, 1, n);
    int sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        const double t0 = omp_get_wtime();
#pragma omp parallel num_threads(nt) reduction(+ : sink)
        {
            const int t = omp_get_thread_num();
            const size_t chunk = n / nt;
            const __m256i * q = (const __m256i *) (p + t * chunk);
            __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
            for (size_t i = 0; i < chunk / 32; i += 4) {
                a = _mm256_xor_si256(a, _mm256_load_si256(q + i));
                b = _mm256_xor_si256(b, _mm256_load_si256(q + i + 1));
                c = _mm256_xor_si256(c, _mm256_load_si256(q + i + 2));
                d = _mm256_xor_si256(d, _mm256_load_si256(q + i + 3));
            }
            sink += _mm256_extract_epi32(_mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d)), 0);
        }
        const double dt = omp_get_wtime() - t0;
        printf("%d threads: %.1f GB/s\n", nt, n / dt / 1e9);
    }
    free(p);
    return sink == 12345 ? 1 : 0;
}
