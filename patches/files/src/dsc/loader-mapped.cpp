// deepseek-cpu: weights that stay in the file mapping (DEEPSEEK_CPU_MAPPED), for the loader's
// buffer-type choice in llama-model-loader.cpp. Upstream's tensor overrides cannot say this: an
// override to the CPU buffer type still takes the repacking buffer types for the tensor.

#include "dsc-loader.h"

#include "llama-impl.h"
#include "llama-mmap.h"
#include "llama-model-loader.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <regex>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

bool llama_dsc_keep_mapped(const char * name) {
    const char * e = getenv("DEEPSEEK_CPU_MAPPED");
    if (e == nullptr || *e == '\0') {
        return false;
    }
    // read at every call (the package sets it for one load at a time); compiled once per value
    static std::mutex  mu;
    static std::string pattern;
    static std::regex  re;
    static bool        valid = false;
    std::lock_guard<std::mutex> lock(mu);
    if (pattern != e) {
        pattern = e;
        try {
            re    = std::regex(pattern);
            valid = true;
        } catch (const std::regex_error &) {
            valid = false;
            LLAMA_LOG_WARN("%s: DEEPSEEK_CPU_MAPPED=%s is not a regular expression; ignored\n", __func__, e);
        }
    }
    return valid && std::regex_search(name, re);
}

bool llama_dsc_keeps_any_mapped(void) {
    const char * e = getenv("DEEPSEEK_CPU_MAPPED");
    return e != nullptr && *e != '\0';
}

bool llama_dsc_reads_part_of_file(void) {
    return llama_dsc_keeps_any_mapped() || llama_dsc_repack_cache_hit();
}

void llama_dsc_read_ahead_copied(const llama_model_loader & ml) {
#if defined(__linux__)
    if (!llama_dsc_reads_part_of_file() || ml.mappings.empty()) {
        return;
    }
    const size_t page = sysconf(_SC_PAGESIZE);
    // With only the repack cache (no budget), the weights read here are the ones used from this
    // mapping at every token (the output head, the norms): read them in 2 MiB folios that map as huge
    // pages (MADV_HUGEPAGE before the read-in faults, as dsc/repack-mapped-buffer.cpp does). Read ahead
    // in small folios, V2-Lite's q6_K output head sat mostly on 4 KiB pages and decode lost ~10% (Zen 3).
    const bool huge = llama_dsc_repack_cache_hit() && !llama_dsc_keeps_any_mapped();
    if (huge) {
        for (const auto & mapping : ml.mappings) {
            madvise(mapping->addr(), mapping->size(), MADV_HUGEPAGE);
        }
    }
    for (const auto & it : ml.weights_map) {
        const auto & w = it.second;
        if (w.idx >= ml.mappings.size() || llama_dsc_keep_mapped(it.first.c_str()) ||
            llama_dsc_repack_cache_covers(it.first.c_str())) {
            continue;
        }
        const auto & mapping = ml.mappings[w.idx];
        const size_t first = w.offs / page * page;
        const size_t last  = std::min(mapping->size(), w.offs + ggml_nbytes(w.tensor));
        if (last > first) {
#if defined(MADV_POPULATE_READ)
            if (huge && madvise((char *) mapping->addr() + first, last - first, MADV_POPULATE_READ) == 0) {
                continue;
            }
#endif
            madvise((char *) mapping->addr() + first, last - first, MADV_WILLNEED);
        }
    }
#else
    (void) ml;
#endif
}
