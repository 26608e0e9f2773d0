// deepseek-cpu: how many regions of its weights a decode GEMV reads at once: GGML_DSC_GEMV_STREAMS
// (dsc-tuning.h) or 1. Several streams keep more lines in flight than one thread's latency-bound
// stream; on the AMX Xeon four made Q4_K_M decode 1.26x faster, but on Zen 5 one stream is 1.27x
// faster than four (process-pair A/B decode, docs/benchmarks.md): its prefetchers follow one
// stream per thread and lose several. So AMD CPUs read one stream, others GGML_DSC_GEMV_STREAMS;
// DEEPSEEK_CPU_GEMV_STREAMS=1 or =4 overrides. Read once. The sums are the same either way.
#include "dsc-tuning.h"

#include <stdlib.h>

int ggml_dsc_gemv_streams(void) {
    static int chosen; // 0 until read; every thread that races here writes the same value
    int v = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
    if (v == 0) {
        const char * e = getenv("DEEPSEEK_CPU_GEMV_STREAMS");
        v = e ? atoi(e) : 0;
        if (v != 1 && v != GGML_DSC_GEMV_STREAMS) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_cpu_init();
            v = __builtin_cpu_is("amd") ? 1 : GGML_DSC_GEMV_STREAMS;
#else
            v = GGML_DSC_GEMV_STREAMS;
#endif
        }
        __atomic_store_n(&chosen, v, __ATOMIC_RELAXED);
    }
    return v;
}
