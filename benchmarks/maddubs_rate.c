// Issue rate of the instructions the AVX2 q4_0/q4_K GEMMs are made of, one core, no memory traffic:
// what bounds patch 0023's kernel. Every integer GEMM step on AVX2 without VNNI is a maddubs (u8 x s8
// -> pairs of int16) followed by an int16 add into an accumulator; these loops issue exactly that mix
// (independent chains, so latency does not count) and report how many pairs retire per cycle.
//
//   gcc -O2 -mavx2 -mfma benchmarks/maddubs_rate.c -o /tmp/maddubs_rate && /tmp/maddubs_rate 3.2
//
// The argument is the core clock in GHz (measure it with a chain of dependent adds if unsure).
// Zen 3 at 3.21 GHz: maddubs alone 2.0 per cycle, maddubs + add pairs 1.6 per cycle (3.2 vector uops)
// with register or memory operands alike. The 8-row q4_0 GEMM needs 64 such pairs plus ~46 other
// vector uops per 8 rows x 8 columns x 32 k (2048 multiply-adds), so at ~3.2 uops per cycle it cannot
// beat ~38 multiply-adds per cycle (~122 GMAC/s); it runs at ~107.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char ** argv) {
    const double ghz = argc > 1 ? atof(argv[1]) : 3.2;
    const long   n   = 200000000;
    __m256i c0 = _mm256_set1_epi8(1), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    __m256i t0, t1, t2, t3, t4, t5;
    const __m256i w = _mm256_set1_epi8(9), a = _mm256_set1_epi8(3);
    static __m256i mem[6] __attribute__((aligned(32)));

    // six independent maddubs -> add pairs; B0..B5 is the second maddubs operand (%13)
#define PAIRS(B0, B1, B2, B3, B4, B5)                                                     \
    "vpmaddubsw " B0 ", %12, %6\n\tvpaddw %6, %0, %0\n\t"                                  \
    "vpmaddubsw " B1 ", %12, %7\n\tvpaddw %7, %1, %1\n\t"                                  \
    "vpmaddubsw " B2 ", %12, %8\n\tvpaddw %8, %2, %2\n\t"                                  \
    "vpmaddubsw " B3 ", %12, %9\n\tvpaddw %9, %3, %3\n\t"                                  \
    "vpmaddubsw " B4 ", %12, %10\n\tvpaddw %10, %4, %4\n\t"                                \
    "vpmaddubsw " B5 ", %12, %11\n\tvpaddw %11, %5, %5\n\t"
#define OUTS "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5), \
             "=&x"(t0), "=&x"(t1), "=&x"(t2), "=&x"(t3), "=&x"(t4), "=&x"(t5)

    double s = now();
    for (long i = 0; i < n; i++) {
        __asm__ volatile(PAIRS("%13", "%13", "%13", "%13", "%13", "%13") : OUTS : "x"(w), "x"(a));
    }
    printf("maddubs + add pairs, register operand: %.2f per cycle\n", 6.0 * n / ((now() - s) * ghz * 1e9));

    s = now();
    for (long i = 0; i < n; i++) {
        __asm__ volatile(PAIRS("0(%13)", "32(%13)", "64(%13)", "96(%13)", "128(%13)", "160(%13)") : OUTS : "x"(w), "r"(mem));
    }
    printf("maddubs + add pairs, memory operand:   %.2f per cycle\n", 6.0 * n / ((now() - s) * ghz * 1e9));

    __m256i d0 = c0, d1 = c1, d2 = c2, d3 = c3, d4 = c4, d5 = c5, d6 = c0, d7 = c1;
    s = now();
    for (long i = 0; i < n; i++) {
        __asm__ volatile(
            "vpmaddubsw %8, %0, %0\n\tvpmaddubsw %8, %1, %1\n\tvpmaddubsw %8, %2, %2\n\tvpmaddubsw %8, %3, %3\n\t"
            "vpmaddubsw %8, %4, %4\n\tvpmaddubsw %8, %5, %5\n\tvpmaddubsw %8, %6, %6\n\tvpmaddubsw %8, %7, %7\n\t"
            : "+x"(d0), "+x"(d1), "+x"(d2), "+x"(d3), "+x"(d4), "+x"(d5), "+x"(d6), "+x"(d7)
            : "x"(w));
    }
    printf("maddubs alone:                         %.2f per cycle\n", 8.0 * n / ((now() - s) * ghz * 1e9));
    return 0;
}
