// Streaming read bandwidth with N threads (AVX2 loads): the decode roofline is this divided
// by the bytes a decoded token reads (V2-Lite Q4_0: 1.445 GB; see
// `python benchmarks/bytes_per_token.py MODEL.gguf`).
//
//   gcc -O2 -mavx2 -fopenmp benchmarks/membw.c -o /tmp/membw && /tmp/membw 2
//   /tmp/membw 2 4 2048      # each thread reads 4 streams at once, software prefetch 2048 bytes ahead
//
// STREAMS (default 1): each thread's share is cut into that many even parts, read side by side, 256
// bytes of each in turn. PREFETCH (default 0: none): bytes ahead of each stream to prefetch (T0).
// The memory is on transparent huge pages where the kernel allows it (madvise). On the AMX Xeon
// guest, 2 threads (patch 0063): one stream 29.6-29.8 GB/s, with a 2 KB prefetch 33.6, four streams
// 33.2-33.5, four with a 1 KB prefetch 33.6-34.4.
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char ** argv) {
    const int nt  = argc > 1 ? atoi(argv[1]) : 2;
    const int ns  = argc > 2 ? atoi(argv[2]) : 1;
    const int pfd = argc > 3 ? atoi(argv[3]) : 0;
    if (nt < 1 || ns < 1 || pfd < 0) {
        fprintf(stderr, "usage: %s [THREADS [STREAMS [PREFETCH_BYTES]]]\n", argv[0]);
        return 2;
    }
    const size_t n = (size_t) 2 << 30;  // 2 GiB, far beyond the caches
    const size_t chunk = n / nt;                 // a thread's share
    const size_t part  = chunk / ns / 256 * 256; // one stream's
    char * p = aligned_alloc(1 << 21, n);
    madvise(p, n, MADV_HUGEPAGE);
    memset(p, 1, n);
    int sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        const double t0 = omp_get_wtime();
#pragma omp parallel num_threads(nt) reduction(+ : sink)
        {
            const int t = omp_get_thread_num();
            __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
            for (size_t i = 0; i < part; i += 256) {
                for (int s = 0; s < ns; s++) {
                    const char * q = p + t * chunk + s * part + i;
                    if (pfd) {
                        for (int l = 0; l < 256; l += 64) {
                            _mm_prefetch(q + pfd + l, _MM_HINT_T0);
                        }
                    }
                    for (int l = 0; l < 256; l += 128) {
                        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *) (q + l)));
                        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *) (q + l + 32)));
                        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *) (q + l + 64)));
                        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *) (q + l + 96)));
                    }
                }
            }
            sink += _mm256_extract_epi32(_mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d)), 0);
        }
        const double dt = omp_get_wtime() - t0;
        printf("%d threads, %d stream%s each, prefetch %d: %.1f GB/s\n", nt, ns, ns == 1 ? "" : "s", pfd,
               (double) part * ns * nt / dt / 1e9);
    }
    free(p);
    return sink == 12345 ? 1 : 0;
}
