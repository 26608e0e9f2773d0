// deepseek-cpu: loader memory helpers (declared in llama-mmap.h, called by llama-model-loader.cpp):
// dropping the file pages of tensors already copied out of the mapping, and faulting in a tensor's
// destination from several threads before the loader writes it.

#include "llama-mmap.h"
#include "llama-impl.h"

#include "ggml.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

void llama_mmap::release_pages(size_t first, size_t last) {
#if defined(__linux__) && defined(MADV_DONTNEED)
    // on Linux, MADV_DONTNEED on a shared, read-only file mapping only zaps the page-table entries:
    // the pages leave the resident set, stay in the page cache, and refault unchanged if touched.
    // (posix_madvise(POSIX_MADV_DONTNEED) is a no-op in glibc, hence madvise.)
    const size_t page_size = sysconf(_SC_PAGESIZE);
    // only whole pages inside [first, last): a neighbouring tensor may share the edge pages
    first = (first + page_size - 1) / page_size * page_size;
    last  = last / page_size * page_size;
    if (last <= first) {
        return;
    }
    uint8_t * base = (uint8_t *) addr();
#if defined(MADV_DONTDUMP)
    // give the range a VMA of its own first. Page-cache folios can be large (ext4 since Linux 6.16,
    // xfs, tmpfs: up to 2 MiB), and a fault in a neighbouring tensor that stays mapped maps the
    // whole folio, PMD or PTEs, as far as its VMA reaches: into this range, back into the resident
    // set (~0.2 GiB for V2-Lite Q4_K_M). A fault cannot map across a VMA boundary. DONTDUMP is the
    // flag that changes nothing else, and these bytes have no business in a core dump anyway.
    if (madvise(base + first, last - first, MADV_DONTDUMP)) {
        LLAMA_LOG_DEBUG("%s: madvise(MADV_DONTDUMP) failed: %s\n", __func__, strerror(errno));
    }
#endif
    if (madvise(base + first, last - first, MADV_DONTNEED)) {
        LLAMA_LOG_DEBUG("%s: madvise(MADV_DONTNEED) failed: %s\n", __func__, strerror(errno));
    }
#else
    GGML_UNUSED(first);
    GGML_UNUSED(last);
#endif
}

// The weights of a repacked model go into an anonymous buffer as large as the model, and the loader's
// one thread then takes a page fault (and the kernel a page zeroing) for every page it first writes:
// ~75% of an 8.9 GB Q4_0 load under perf (clear_page_erms), more where a hypervisor backs guest memory
// lazily. MADV_POPULATE_WRITE (Linux 5.14) faults a range in with one call per range instead of one
// fault per page; splitting the range over the threads this process may run on zeroes it in parallel.
void llama_prefault_write(void * addr, size_t size) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
    const char * env = getenv("DEEPSEEK_CPU_PREFAULT");
    if ((env && strcmp(env, "0") == 0) || addr == nullptr || size == 0) {
        return;
    }
    cpu_set_t set;
    int n = 1;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        n = std::max(1, CPU_COUNT(&set));
    }
    n = std::min(n, 8);
    const size_t huge = (size_t) 2 << 20;   // slices on huge-page boundaries (the buffer is on huge pages)
    const size_t per  = (size / n + huge - 1) / huge * huge;
    auto populate = [](char * p, size_t len) {
        if (madvise(p, len, MADV_POPULATE_WRITE) != 0) {
            // EINVAL on kernels without it: the first writes fault the pages in as before
            LLAMA_LOG_DEBUG("%s: madvise(MADV_POPULATE_WRITE) failed: %s\n", __func__, strerror(errno));
        }
    };
    // madvise wants a page-aligned start: the slices start on the first page boundary inside the buffer
    const uintptr_t page  = (uintptr_t) sysconf(_SC_PAGESIZE);
    char *       base = (char *) (((uintptr_t) addr + page - 1) / page * page);
    char * const end  = (char *) addr + size;
    std::vector<std::thread> threads;
    for (int i = 1; i < n && base + i * per < end; i++) {
        char * p = base + i * per;
        threads.emplace_back(populate, p, (size_t) (std::min(p + per, end) - p));
    }
    populate(base, (size_t) (std::min(base + per, end) - base));
    for (auto & t : threads) {
        t.join();
    }
#else
    GGML_UNUSED(addr);
    GGML_UNUSED(size);
#endif
}
