// Streaming rate of the engine's own decode GEMVs (one column times many rows), from L2 or from DRAM,
// on N threads: the measurement behind patches 0059 (prefetch) and the README's GB/s figures.
// It links the built libggml-cpu and calls its exported kernels on random weights of the given shape,
// so it measures exactly what the engine runs; compare with benchmarks/membw.c on the same machine.
//
//   g++ -O2 -fopenmp benchmarks/gemv_stream.cpp -o /tmp/gemv_stream -L$LIB -lggml-cpu -lggml-base -Wl,-rpath,$LIB
//   OMP_NUM_THREADS=1 /tmp/gemv_stream q4_0x8 2048 1408 1      # weights in L2: compute rate of one core
//   OMP_NUM_THREADS=2 /tmp/gemv_stream q4_0x8 2048 1408 400    # 400 MB from DRAM on two threads
//
// TYPE: q4_0x8 / mxfp4x8 / q4_Kx8 (repacked expert layouts; rows of N values, R rows per matrix, 8 per group;
// q2_Kx8: llama.cpp's own repacked q2_K GEMV, which ds-q2's experts take when repacked)
// or q8_0 / q5_0 / q4_0 / mxfp4 / q6_K / q3_K / q2_K (plain rows, R rows per matrix, handed out in chunks of 64 rows),
// or vd:NAME (any ggml type, e.g. vd:q3_K, vd:iq2_s: the row-by-row vec_dot the CPU backend's type
// table names, on one matrix of real quantized Gaussian weights repeated to fill MB).
// LIB: the engine's lib directory (e.g. .venv/lib/python3.11/site-packages/deepseek_cpu/lib).
// The AMX Xeon guest, 2 threads, 400 MB: q4_0x8 ~24 GB/s without 0059's prefetch, 24-30 with it.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <omp.h>
#include <vector>

enum ggml_type { GGML_TYPE_Q8_0 = 8, GGML_TYPE_Q8_K = 15 };
struct block_q4_0;
struct block_q4_K;
struct block_q2_K;
struct block_mxfp4;
namespace ggml { namespace cpu { namespace repack {
template <typename BLOC_TYPE, long INTER_SIZE, long NB_COLS, ggml_type PARAM_TYPE>
void gemv(int, float *, size_t, const void *, const void *, int, int);
}}}
// weak: a build without a kernel (AVX2 builds have no q6_K GEMV) still links, and says so below
extern "C" {
__attribute__((weak)) void ggml_dsc_gemv_q8_0_q8_0(int, int, float *, const void *, size_t, const void *);
__attribute__((weak)) void ggml_dsc_gemv_q5_0_q8_0(int, int, float *, const void *, size_t, const void *);
__attribute__((weak)) void ggml_dsc_gemv_q4_0_q8_0(int, int, float *, const void *, size_t, const void *);
__attribute__((weak)) void ggml_dsc_gemv_mxfp4_q8_0(int, int, float *, const void *, size_t, const void *);
__attribute__((weak)) void ggml_dsc_gemv_q6_K_q8_K(int, int, float *, const void *, size_t, const void *);
__attribute__((weak)) void ggml_dsc_gemv_q3_K_q8_K(int, int, float *, const void *, size_t, const void *);
__attribute__((weak)) void ggml_dsc_gemv_q2_K_q8_K(int, int, float *, const void *, size_t, const void *);
}
typedef void (*plain_gemv)(int, int, float *, const void *, size_t, const void *);

// ggml's C API for the vd: types (declared here as above, so this file needs no headers)
typedef void (*vec_dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
typedef void (*from_float_fn)(const float *, void *, int64_t);
struct type_traits_cpu { from_float_fn from_float; vec_dot_fn vec_dot; int vec_dot_type; int64_t nrows; };
extern "C" {
const type_traits_cpu * ggml_get_type_traits_cpu(int type);
const char * ggml_type_name(int type);
size_t ggml_row_size(int type, int64_t ne);
size_t ggml_quantize_chunk(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                           int64_t n_per_row, const float * imatrix);
void ggml_cpu_init(void);
}

static double now();

// five timed runs of `iters` calls of body(), each printed as "HEAD: X GB/s TAIL" for `bytes` read per call
template <class F> static void timed_reps(int iters, double bytes, const char * head, const char * tail, F body) {
    for (int rep = 0; rep < 5; rep++) {
        const double t0 = now();
        for (int it = 0; it < iters; it++) body();
        printf("%s: %.2f GB/s%s\n", head, bytes * iters / (now() - t0) / 1e9, tail);
    }
}

// vd:NAME: one matrix quantized from Gaussian weights (an imatrix of ones: the 2-bit i-quants need
// one), copied until MB is filled, rows handed out 64 at a time to the type's own vec_dot.
static int run_vec_dot(const char * name, int n, long rows, double mb) {
    ggml_cpu_init();
    int type = -1;
    for (int t = 0; t < 64 && type < 0; t++) {
        const char * tn = ggml_type_name(t);
        if (tn && !strcmp(tn, name)) type = t;
    }
    const type_traits_cpu * tr = type >= 0 ? ggml_get_type_traits_cpu(type) : nullptr;
    if (!tr || !tr->vec_dot) { fprintf(stderr, "no CPU vec_dot for type %s\n", name); return 2; }
    const size_t row_bytes = ggml_row_size(type, n), mat = row_bytes * rows;
    const long nm = mb * 1e6 / mat > 1 ? (long) (mb * 1e6 / mat) : 1;
    std::vector<float> f((size_t) n * rows), ones(n, 1.0f);
    unsigned x = 12345;
    for (auto & v : f) {  // Box-Muller from an LCG: Gaussian weights, as trained ones roughly are
        x = x * 1664525u + 1013904223u; const double u1 = (x >> 8) / 16777216.0 + 1e-9;
        x = x * 1664525u + 1013904223u; const double u2 = (x >> 8) / 16777216.0;
        v = (float) (0.02 * sqrt(-2 * log(u1)) * cos(6.283185307 * u2));
    }
    std::vector<uint8_t> w(nm * mat);
    ggml_quantize_chunk(type, f.data(), w.data(), 0, rows, n, ones.data());
    for (long m = 1; m < nm; m++) memcpy(w.data() + m * mat, w.data(), mat);
    std::vector<float> a(n);
    for (int i = 0; i < n; i++) a[i] = f[i] * 50;
    std::vector<uint8_t> y(ggml_row_size(tr->vec_dot_type, n));
    ggml_get_type_traits_cpu(tr->vec_dot_type)->from_float(a.data(), y.data(), n);
    std::vector<float> s(nm * rows);
    char head[160], tail[48];
    snprintf(head, sizeof head, "%s n=%d rows=%ld x %ld matrices, %d threads", name, n, rows, nm, omp_get_max_threads());
    snprintf(tail, sizeof tail, " (%.3f bits/weight)", 8.0 * row_bytes / n);
    timed_reps(mb < 10 ? 200 : 3, (double) nm * mat, head, tail, [&] {
#pragma omp parallel for schedule(dynamic, 1)
        for (long c = 0; c < nm * rows; c += 64) {
            const long m = c + 64 <= nm * rows ? 64 : nm * rows - c;
            for (long r = 0; r < m; r++) {
                tr->vec_dot(n, &s[c + r], 0, w.data() + (c + r) * row_bytes, 0, y.data(), 0, 1);
            }
        }
    });
    return 0;
}

static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s TYPE N ROWS_PER_MATRIX MB\n", argv[0]);
        return 2;
    }
    const char * ty = argv[1];
    const int n = atoi(argv[2]);
    const long rows = atol(argv[3]);
    const double mb = atof(argv[4]);
    if (!strncmp(ty, "vd:", 3)) return run_vec_dot(ty + 3, n, rows, mb);
    // block geometry: values per block, bytes per block (per 8 rows for the repacked ones), and where its
    // nscale consecutive f16 scales start
    int qk = 32, bsz = 0, nscale = 1, sc_off = 0;
    plain_gemv plain = nullptr;
    bool k_col = false;  // q8_K column (q4_K, q6_K) instead of q8_0
    bool e8m0  = false;  // the nscale scales are e8m0 bytes (MXFP4), not f16
    if (!strcmp(ty, "q4_0x8"))      { bsz = 8 * 18;  nscale = 8; }
    else if (!strcmp(ty, "mxfp4x8")) { bsz = 8 * 17; nscale = 8; e8m0 = true; }
    else if (!strcmp(ty, "mxfp4"))  { bsz = 17; e8m0 = true; plain = ggml_dsc_gemv_mxfp4_q8_0; }
    else if (!strcmp(ty, "q4_Kx8")) { qk = 256; bsz = 8 * 144; nscale = 16; k_col = true; }
    else if (!strcmp(ty, "q2_Kx8")) { qk = 256; bsz = 8 * 84; nscale = 16; k_col = true; }  // llama.cpp's own repack
    else if (!strcmp(ty, "q8_0"))   { bsz = 34; plain = ggml_dsc_gemv_q8_0_q8_0; }
    else if (!strcmp(ty, "q5_0"))   { bsz = 22; plain = ggml_dsc_gemv_q5_0_q8_0; }
    else if (!strcmp(ty, "q4_0"))   { bsz = 18; plain = ggml_dsc_gemv_q4_0_q8_0; }
    else if (!strcmp(ty, "q6_K"))   { qk = 256; bsz = 210; sc_off = 208; plain = ggml_dsc_gemv_q6_K_q8_K; k_col = true; }
    else if (!strcmp(ty, "q3_K"))   { qk = 256; bsz = 110; sc_off = 108; plain = ggml_dsc_gemv_q3_K_q8_K; k_col = true; }
    else if (!strcmp(ty, "q2_K"))   { qk = 256; bsz = 84; nscale = 2; sc_off = 80; plain = ggml_dsc_gemv_q2_K_q8_K; k_col = true; }
    else { fprintf(stderr, "unknown TYPE %s\n", ty); return 2; }
    const bool q2_Kx8 = !strcmp(ty, "q2_Kx8");
    const bool repacked = !strcmp(ty, "q4_0x8") || !strcmp(ty, "mxfp4x8") || !strcmp(ty, "q4_Kx8") || q2_Kx8;
    if (!repacked && !plain) { fprintf(stderr, "no %s GEMV in this build\n", ty); return 2; }
    if (n % qk != 0 || (!plain && rows % 8 != 0)) { fprintf(stderr, "N must be a multiple of %d (ROWS of 8)\n", qk); return 2; }

    const size_t row_bytes = (size_t) n / qk * bsz / (plain ? 1 : 8);
    const size_t mat = row_bytes * rows;
    const long nm = mb * 1e6 / mat > 1 ? (long) (mb * 1e6 / mat) : 1;
    std::vector<uint8_t> w(nm * mat);
    for (auto & b : w) b = rand();
    // sane f16 scales (1.0 or ~0.004; e8m0: 2^0) so no NaN/inf slows the float steps
    for (size_t i = 0; i + bsz <= w.size(); i += bsz) {
        for (int j = 0; j < nscale; j++) {
            if (e8m0) { w[i + j] = 127; continue; }
            w[i + sc_off + 2 * j] = 0; w[i + sc_off + 2 * j + 1] = k_col ? 0x1c : 0x3c;
        }
    }
    const size_t ybytes = k_col ? (size_t) n / 256 * 292 : (size_t) n / 32 * 34;
    std::vector<uint8_t> y(ybytes);
    for (auto & b : y) b = rand() % 64;
    if (k_col) { for (size_t i = 0; i < ybytes; i += 292) { const float one = 1; memcpy(&y[i], &one, 4); } }
    else       { for (size_t i = 0; i < ybytes; i += 34) { y[i] = 0; y[i + 1] = 0x3c; } }
    std::vector<float> s(nm * rows);

    const int nt = omp_get_max_threads();
    char head[160];
    snprintf(head, sizeof head, "%s n=%d rows=%ld x %ld matrices, %d threads", ty, n, rows, nm, nt);
    timed_reps(mb < 10 ? 200 : 3, (double) nm * mat, head, "", [&] {
        if (plain) {
#pragma omp parallel for schedule(dynamic, 1)
            for (long c = 0; c < nm * rows; c += 64) {
                const long m = c + 64 <= nm * rows ? 64 : nm * rows - c;
                plain(n, (int) m, s.data() + c, w.data() + c * row_bytes, row_bytes, y.data());
            }
        } else {
            // each thread an even share of every matrix's row groups, as the engine hands them out
#pragma omp parallel for schedule(static)
            for (long m = 0; m < nm * nt; m++) {
                const long mm = m / nt, part = m % nt;
                const long g0 = rows / 8 * part / nt, g1 = rows / 8 * (part + 1) / nt;
                float * dst = s.data() + mm * rows + 8 * g0;
                const uint8_t * src = w.data() + mm * mat + (size_t) g0 * 8 * row_bytes;
                if (q2_Kx8)    ggml::cpu::repack::gemv<block_q2_K, 8, 8, GGML_TYPE_Q8_K>(n, dst, rows, src, y.data(), 1, (int) (8 * (g1 - g0)));
                else if (k_col) ggml::cpu::repack::gemv<block_q4_K, 8, 8, GGML_TYPE_Q8_K>(n, dst, rows, src, y.data(), 1, (int) (8 * (g1 - g0)));
                else if (e8m0) ggml::cpu::repack::gemv<block_mxfp4, 8, 8, GGML_TYPE_Q8_0>(n, dst, rows, src, y.data(), 1, (int) (8 * (g1 - g0)));
                else           ggml::cpu::repack::gemv<block_q4_0, 8, 8, GGML_TYPE_Q8_0>(n, dst, rows, src, y.data(), 1, (int) (8 * (g1 - g0)));
            }
        }
    });
    return 0;
}
