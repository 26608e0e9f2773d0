// deepseek-cpu: a CPU_REPACK buffer whose bytes are a read-only mapping of a file: the repack cache that
// the loader wrote at an earlier load (src/dsc/repack-cache.cpp). Its weights are already in the
// repacked layout, so the loader copies nothing into it, and its pages are page cache, not anonymous
// memory: a later load costs what a mapped load costs (no zeroing of fresh pages, no repacking), and
// the kernel may drop and re-read them like any mapped file. Found by the loader through the CPU
// backend's get_proc_address ("ggml_dsc_repack_buffer_from_file").
#include "ggml-backend-impl.h"
#include "ggml-impl.h"
#include "ggml-cpu.h"

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "../repack.h"

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

static void dsc_mapped_buffer_free(ggml_backend_buffer_t buffer) {
#if defined(__linux__)
    munmap(buffer->context, buffer->size);
#endif
}

static void dsc_mapped_buffer_set_tensor(ggml_backend_buffer_t, ggml_tensor * tensor, const void *, size_t, size_t) {
    // the loader skips tensors of this buffer; anything else writing weights here is a bug
    GGML_ABORT("tensor '%s' lives in a read-only repack cache mapping", tensor->name);
}

ggml_backend_buffer_t ggml_dsc_repack_buffer_from_file(int fd, size_t offset, size_t size) {
#if defined(__linux__)
    if (size == 0) {
        return nullptr;
    }
    // read-only and private: nothing is ever written through it, and a writable private mapping would
    // be populated by copy-on-write faults (anonymous memory again). On a 2 MiB boundary (the cache's
    // data starts on one in the file too), so that page-cache folios of 2 MiB map as huge pages.
    const size_t huge = (size_t) 2 << 20;
    void * area = mmap(nullptr, size + huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (area == MAP_FAILED) {
        GGML_LOG_WARN("%s: no room for a %zu-byte mapping: %s\n", __func__, size, strerror(errno));
        return nullptr;
    }
    char * aligned = (char *) (((uintptr_t) area + huge - 1) / huge * huge);
    void * addr = mmap(aligned, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, (off_t) offset);
    if (addr == MAP_FAILED) {
        GGML_LOG_WARN("%s: mmap of %zu bytes failed: %s\n", __func__, size, strerror(errno));
        munmap(area, size + huge);
        return nullptr;
    }
    // the reservation's ends around the file mapping
    if (aligned > (char *) area) {
        munmap(area, aligned - (char *) area);
    }
    const size_t page = (size_t) sysconf(_SC_PAGESIZE);
    char * tail_start = (char *) ((((uintptr_t) aligned + size) + page - 1) / page * page);
    if ((char *) area + size + huge > tail_start) {
        munmap(tail_start, (char *) area + size + huge - tail_start);
    }
    // MADV_HUGEPAGE before the pages are read: a fault in such a mapping reads the file ahead in 2 MiB
    // folios (Linux 6.x, filesystems with large folios: ext4 since 6.16, xfs), which then map as huge
    // pages. Read in by faults, not MAP_POPULATE (which reads ahead in small folios): with 4 KiB pages
    // for ~60% of V2-Lite's weights, decode ran at 0.91x the repacked-in-memory rate (Zen 3).
    madvise(addr, size, MADV_HUGEPAGE);
#if defined(MADV_POPULATE_READ)
    if (madvise(addr, size, MADV_POPULATE_READ) != 0)
#endif
    {
        madvise(addr, size, MADV_WILLNEED);  // older kernels: read ahead; the first use faults in the rest
    }
    // the repack buffer type's own interface (init_tensor chooses each tensor's repacked kernels), made by
    // allocating a token buffer of that type; then this mapping's free and a set_tensor that refuses
    ggml_backend_buffer_type_t buft = ggml_backend_cpu_repack_buffer_type();
    ggml_backend_buffer_t token = ggml_backend_buft_alloc_buffer(buft, 64);
    if (token == nullptr) {
        munmap(addr, size);
        return nullptr;
    }
    ggml_backend_buffer_i iface = token->iface;
    ggml_backend_buffer_free(token);
    iface.free_buffer = dsc_mapped_buffer_free;
    iface.set_tensor  = dsc_mapped_buffer_set_tensor;
    return ggml_backend_buffer_init(buft, iface, addr, size);
#else
    (void) fd; (void) offset; (void) size;
    return nullptr;
#endif
}
