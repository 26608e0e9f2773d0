// deepseek-cpu: the repack cache (DEEPSEEK_CPU_REPACK_CACHE, a directory). The first load of a model
// writes its repacked weights (the CPU_REPACK buffer, as the loader filled it) to a file there; later
// loads map that file read-only instead of allocating, zeroing and repacking that memory again. The
// weights are then page cache (a warm load costs what llama.cpp's mapped load costs; a cold one reads
// the file once, sequentially) and the model's own file is only read for the weights left outside.
//
// One cache file per model file, named after it (its name and a hash of its real path). It is used
// only when everything that decides its bytes is unchanged: this engine build and the CPU features
// that chose the repacked layouts, each model file's size, modification time and header, every
// repacked weight's name, type, shape and samples of its bytes (start, middle, end), and the offset
// each weight gets in the buffer. Anything else: the file is ignored and written again.
// Files are written to a temporary name and renamed, so a crash leaves no half-written cache.
//
// One load at a time (like DEEPSEEK_CPU_MAPPED): the state below lives from begin() to end().

#include "dsc-loader.h"

#include "llama-impl.h"
#include "llama-mmap.h"
#include "llama-model-loader.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__linux__)
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#endif

extern "C" const char * deepseek_cpu_build_info(void);

namespace {

constexpr char     MAGIC[8]   = {'D', 'S', 'C', 'R', 'P', 'K', '0', '1'};
constexpr size_t   SAMPLE     = 4096;    // bytes hashed at the start, middle and end of each weight
constexpr size_t   DATA_ALIGN = 1 << 21; // the weights start on a 2 MiB boundary of the file

typedef ggml_backend_buffer_t (*buffer_from_file_t)(int fd, size_t offset, size_t size);

struct cache_state {
    bool                  enabled = false;
    bool                  hit     = false;
    std::string           path;            // the cache file for this model
    ggml_context *        ctx     = nullptr;  // the loader's CPU_REPACK context
    std::string           identity;        // what decides the bytes (see above)
    std::vector<uint64_t> offsets;         // per tensor of ctx, from the cache file (hit)
    size_t                data_offset = 0; // where the buffer's bytes start in the cache file (hit)
    size_t                data_size   = 0;
    int                   fd          = -1;
    ggml_backend_buffer_t mapped      = nullptr;  // the buffer mapped from the cache (hit)
    ggml_backend_buffer_t fresh       = nullptr;  // the buffer the loader fills, to write (miss)
};

cache_state g_state;

uint64_t fnv1a(uint64_t h, const void * p, size_t n) {
    const uint8_t * b = (const uint8_t *) p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

constexpr uint64_t FNV_BASIS = 0xcbf29ce484222325ULL;

template <typename T> void put(std::string & s, const T & v) {
    s.append((const char *) &v, sizeof(v));
}

void put_str(std::string & s, const char * str) {
    const uint64_t n = strlen(str);
    put(s, n);
    s.append(str, n);
}

bool is_repack_ctx(const llama_model_loader::ctx_key & key) {
    return !key.lazy && strcmp(ggml_backend_buft_name(key.buft), "CPU_REPACK") == 0;
}

ggml_backend_reg_t cpu_reg() {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    return dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
}

// the CPU backend's feature list ("AVX2=1;AVX512=1;..."): the repacked layout of a weight depends on it
std::string cpu_features() {
    std::string s;
    ggml_backend_reg_t reg = cpu_reg();
    auto get = reg ? (ggml_backend_get_features_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features") : nullptr;
    if (get) {
        for (ggml_backend_feature * f = get(reg); f && f->name; f++) {
            s += f->name;
            s += '=';
            s += f->value;
            s += ';';
        }
    }
    return s;
}

#if defined(__linux__)
bool read_at(int fd, void * dst, size_t n, size_t off) {
    uint8_t * p = (uint8_t *) dst;
    while (n > 0) {
        const ssize_t r = pread(fd, p, n, (off_t) off);
        if (r <= 0) {
            if (r < 0 && errno == EINTR) {
                continue;
            }
            return false;
        }
        p += r;
        n -= (size_t) r;
        off += (size_t) r;
    }
    return true;
}

bool write_all(int fd, const void * src, size_t n) {
    const uint8_t * p = (const uint8_t *) src;
    while (n > 0) {
        const ssize_t w = write(fd, p, std::min(n, (size_t) 64 << 20));
        if (w <= 0) {
            if (w < 0 && errno == EINTR) {
                continue;
            }
            return false;
        }
        p += w;
        n -= (size_t) w;
    }
    return true;
}

// The file is written with O_DIRECT where the filesystem allows it: through the page cache, writing
// 8 GiB took twice as long as the disk needs on the VMs here (every page-cache page allocated anew),
// and it left as much dirty memory beside the model. O_DIRECT wants aligned addresses and lengths:
// the header is padded to DATA_ALIGN, the weights' base is the buffer's (2 MiB-aligned for large
// buffers), and the last partial block goes through an aligned copy; the file is then cut to size.
constexpr size_t DIRECT_ALIGN = 4096;

bool write_direct(int fd, const std::string & head, const uint8_t * base, size_t size) {
    void * bounce = nullptr;
    if (posix_memalign(&bounce, DIRECT_ALIGN, std::max(head.size(), DIRECT_ALIGN)) != 0) {
        return false;
    }
    memcpy(bounce, head.data(), head.size());
    bool ok = write_all(fd, bounce, head.size());
    const size_t whole = size / DIRECT_ALIGN * DIRECT_ALIGN;
    ok = ok && write_all(fd, base, whole);
    if (ok && whole < size) {
        memset(bounce, 0, DIRECT_ALIGN);
        memcpy(bounce, base + whole, size - whole);
        ok = write_all(fd, bounce, DIRECT_ALIGN) && ftruncate(fd, (off_t) (head.size() + size)) == 0;
    }
    free(bounce);
    return ok;
}

// what decides the cached bytes, as one byte string (compared whole with the cache file's copy)
bool make_identity(const llama_model_loader & ml, ggml_context * ctx, std::string & id) {
    put_str(id, deepseek_cpu_build_info());
    put_str(id, cpu_features().c_str());
    // each model file: size, modification time, and a hash of its header (metadata and tensor table:
    // everything before its first weight)
    std::vector<size_t> first_weight(ml.files.size(), SIZE_MAX);
    for (const auto & it : ml.weights_map) {
        if (it.second.idx < first_weight.size()) {
            first_weight[it.second.idx] = std::min(first_weight[it.second.idx], it.second.offs);
        }
    }
    for (size_t i = 0; i < ml.files.size(); i++) {
        const int fd = ml.files[i]->file_id();
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) {
            return false;
        }
        put(id, (uint64_t) st.st_size);
        put(id, (int64_t) st.st_mtim.tv_sec);
        put(id, (int64_t) st.st_mtim.tv_nsec);
        const size_t n = first_weight[i] == SIZE_MAX ? 0 : first_weight[i];
        std::vector<uint8_t> head(std::min(n, (size_t) 256 << 20));
        if (!read_at(fd, head.data(), head.size(), 0)) {
            return false;
        }
        put(id, fnv1a(FNV_BASIS, head.data(), head.size()));
    }
    // each repacked weight, in the context's order (the order the allocator places them in)
    std::vector<uint8_t> sample(SAMPLE);
    for (ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        put_str(id, ggml_get_name(t));
        put(id, (int32_t) t->type);
        for (int d = 0; d < GGML_MAX_DIMS; d++) {
            put(id, (int64_t) t->ne[d]);
        }
        const size_t nbytes = ggml_nbytes(t);
        put(id, (uint64_t) nbytes);
        const auto * w = ml.get_weight(ggml_get_name(t));
        if (w == nullptr || w->idx >= ml.files.size()) {
            return false;
        }
        const int fd = ml.files[w->idx]->file_id();
        uint64_t h = FNV_BASIS;
        const size_t n = std::min(nbytes, SAMPLE);
        for (size_t at : {(size_t) 0, (nbytes - n) / 2, nbytes - n}) {
            if (!read_at(fd, sample.data(), n, w->offs + at)) {
                return false;
            }
            h = fnv1a(h, sample.data(), n);
        }
        put(id, h);
    }
    return true;
}

std::string cache_dir() {
    const char * e = getenv("DEEPSEEK_CPU_REPACK_CACHE");
    if (e == nullptr || *e == '\0' || strcmp(e, "0") == 0) {
        return "";
    }
    return e;
}

bool make_dirs(const std::string & dir) {
    std::string cur;
    for (size_t i = 0; i <= dir.size(); i++) {
        if (i == dir.size() || (dir[i] == '/' && i > 0)) {
            cur = dir.substr(0, i);
            if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
                return false;
            }
        }
    }
    return true;
}

// the cache file's header: magic, identity, offsets, data offset and size; true when it matches `id`
bool read_header(int fd, const std::string & id, cache_state & st) {
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        return false;
    }
    char magic[8];
    uint64_t id_len = 0;
    if (!read_at(fd, magic, 8, 0) || memcmp(magic, MAGIC, 8) != 0 || !read_at(fd, &id_len, 8, 8) || id_len != id.size()) {
        return false;
    }
    std::string stored(id_len, '\0');
    uint64_t n = 0;
    size_t at = 16;
    if (!read_at(fd, stored.data(), id_len, at) || stored != id) {
        return false;
    }
    at += id_len;
    if (!read_at(fd, &n, 8, at) || n > (1u << 24)) {
        return false;
    }
    at += 8;
    st.offsets.resize(n);
    uint64_t data[2];
    if (!read_at(fd, st.offsets.data(), n * 8, at) || !read_at(fd, data, 16, at + n * 8)) {
        return false;
    }
    st.data_offset = data[0];
    st.data_size   = data[1];
    return st.data_offset % DATA_ALIGN == 0 && st.data_size > 0 &&
           (uint64_t) sb.st_size == st.data_offset + st.data_size;
}
#endif

void reset() {
#if defined(__linux__)
    if (g_state.fd >= 0) {
        close(g_state.fd);
    }
#endif
    g_state = cache_state();
}

}  // namespace

void llama_dsc_repack_cache_begin(const llama_model_loader & ml) {
    reset();
#if defined(__linux__)
    const std::string dir = cache_dir();
    if (dir.empty() || !ml.use_mmap || ml.no_alloc) {
        return;
    }
    int n_repack = 0;
    for (const auto & [key, ctx] : ml.ctx_map) {
        if (is_repack_ctx(key) && ggml_get_first_tensor(ctx.get()) != nullptr) {
            g_state.ctx = ctx.get();
            n_repack++;
        }
    }
    if (n_repack != 1) {
        g_state.ctx = nullptr;
        return;  // nothing repacked (or an arrangement this cache does not describe)
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (!make_identity(ml, g_state.ctx, g_state.identity)) {
        LLAMA_LOG_WARN("%s: repack cache: could not read the model's header or weights; not used\n", __func__);
        g_state.ctx = nullptr;
        return;
    }
    // one cache file per model file (its real path): a changed model or engine rewrites it, and old
    // versions do not pile up
    char link[64];
    char real[4096];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", ml.files[0]->file_id());
    const ssize_t n_real = readlink(link, real, sizeof(real) - 1);
    const std::string model = n_real > 0 ? std::string(real, n_real) : g_state.identity;
    const char * base = strrchr(model.c_str(), '/');
    std::string stem = base ? base + 1 : "model";
    if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".gguf") == 0) {
        stem.resize(stem.size() - 5);
    }
    char name[64];
    snprintf(name, sizeof(name), "-%016llx.repack", (unsigned long long) fnv1a(FNV_BASIS, model.data(), model.size()));
    g_state.path    = dir + "/" + stem.substr(0, 128) + name;
    g_state.enabled = true;
    const int fd = open(g_state.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && read_header(fd, g_state.identity, g_state)) {
        g_state.fd  = fd;
        g_state.hit = true;
    } else if (fd >= 0) {
        close(fd);
        LLAMA_LOG_WARN("%s: repack cache: %s does not match this model and engine; writing it again\n", __func__, g_state.path.c_str());
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    LLAMA_LOG_INFO("%s: repack cache: %s %s (checked in %.0f ms)\n", __func__, g_state.hit ? "using" : "will write",
                   g_state.path.c_str(), ms);
#else
    (void) ml;
#endif
}

bool llama_dsc_repack_cache_hit(void) {
    return g_state.hit;
}

bool llama_dsc_repack_cache_covers(const char * name) {
    return g_state.hit && g_state.ctx != nullptr && ggml_get_tensor(g_state.ctx, name) != nullptr;
}

ggml_backend_buffer_t llama_dsc_repack_cache_alloc(ggml_context * ctx, ggml_backend_buffer_type_t buft) {
    if (!g_state.hit || ctx != g_state.ctx) {
        return nullptr;
    }
    ggml_backend_reg_t reg = cpu_reg();
    auto from_file = reg ? (buffer_from_file_t) ggml_backend_reg_get_proc_address(reg, "ggml_dsc_repack_buffer_from_file") : nullptr;
    ggml_backend_buffer_t buf = from_file ? from_file(g_state.fd, g_state.data_offset, g_state.data_size) : nullptr;
    if (buf == nullptr || ggml_backend_buffer_get_type(buf) != buft) {
        if (buf) {
            ggml_backend_buffer_free(buf);
        }
        g_state.hit = false;
        return nullptr;
    }
    // place the tensors as ggml_backend_alloc_ctx_tensors_from_buft would, checking each offset against
    // the one the cache was written with (before the allocator could run out of room and abort)
    ggml_tallocr talloc = ggml_tallocr_new(buf);
    const size_t align  = ggml_backend_buffer_get_alignment(buf);
    size_t i = 0;
    bool ok = true;
    for (ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t), i++) {
        const size_t size = GGML_PAD(ggml_backend_buffer_get_alloc_size(buf, t), align);
        if (t->data != nullptr || t->view_src != nullptr || i >= g_state.offsets.size() ||
            talloc.offset != g_state.offsets[i] || talloc.offset + size > g_state.data_size) {
            ok = false;
            break;
        }
        ggml_tallocr_alloc(&talloc, t);
    }
    if (!ok || i != g_state.offsets.size()) {
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
            if (t->buffer == buf) {
                t->buffer = nullptr;
                t->data   = nullptr;
                t->extra  = nullptr;
            }
        }
        ggml_backend_buffer_free(buf);
        LLAMA_LOG_WARN("%s: repack cache: %s places the weights differently; writing it again\n", __func__, g_state.path.c_str());
        g_state.hit = false;
        return nullptr;
    }
    g_state.mapped = buf;
    LLAMA_LOG_INFO("%s: repack cache: mapped %.2f MiB of repacked weights from %s\n", __func__,
                   g_state.data_size / 1024.0 / 1024.0, g_state.path.c_str());
    return buf;
}

void llama_dsc_repack_cache_fresh(ggml_context * ctx, ggml_backend_buffer_t buf) {
    if (g_state.enabled && ctx == g_state.ctx && buf != nullptr) {
        g_state.fresh = buf;
    }
}

bool llama_dsc_repack_cache_holds(const ggml_tensor * t) {
    return g_state.mapped != nullptr && t->buffer == g_state.mapped;
}

void llama_dsc_repack_cache_end(void) {
#if defined(__linux__)
    if (g_state.enabled && g_state.mapped == nullptr && g_state.fresh != nullptr) {
        const auto t0 = std::chrono::steady_clock::now();
        ggml_backend_buffer_t buf = g_state.fresh;
        const uint8_t * base = (const uint8_t *) ggml_backend_buffer_get_base(buf);
        const size_t    size = ggml_backend_buffer_get_size(buf);
        // the header: magic, identity, each tensor's offset, then where the bytes start and how many
        std::string head(MAGIC, 8);
        put(head, (uint64_t) g_state.identity.size());
        head += g_state.identity;
        std::vector<uint64_t> offs;
        for (ggml_tensor * t = ggml_get_first_tensor(g_state.ctx); t; t = ggml_get_next_tensor(g_state.ctx, t)) {
            offs.push_back(t->buffer == buf ? (uint64_t) ((const uint8_t *) t->data - base) : UINT64_MAX);
        }
        put(head, (uint64_t) offs.size());
        head.append((const char *) offs.data(), offs.size() * 8);
        const uint64_t data_offset = GGML_PAD(head.size() + 16, DATA_ALIGN);
        put(head, data_offset);
        put(head, (uint64_t) size);
        head.resize(data_offset, '\0');

        const std::string dir = g_state.path.substr(0, g_state.path.rfind('/'));
        struct statvfs vfs;
        const std::string tmp = g_state.path + ".tmp." + std::to_string(getpid());
        int fd = -1;
        const char * why = nullptr;
        if (!make_dirs(dir)) {
            why = "cannot create the directory";
        } else if (statvfs(dir.c_str(), &vfs) == 0 && (uint64_t) vfs.f_bavail * vfs.f_frsize < data_offset + size + ((uint64_t) 1 << 30)) {
            why = "not enough free disk space (it keeps 1 GiB free)";
        } else if ((fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
            why = strerror(errno);
        } else if (!(((uintptr_t) base % DIRECT_ALIGN == 0 && fcntl(fd, F_SETFL, O_DIRECT) == 0 &&
                      write_direct(fd, head, base, size)) ||
                     // no O_DIRECT here (tmpfs, a small unaligned buffer), or it failed: through the page cache
                     (fcntl(fd, F_SETFL, 0) == 0 && lseek(fd, 0, SEEK_SET) == 0 && ftruncate(fd, 0) == 0 &&
                      write_all(fd, head.data(), head.size()) && write_all(fd, base, size))) ||
                   fdatasync(fd) != 0) {
            why = strerror(errno);
        } else if (close(fd) != 0 || (fd = -1, rename(tmp.c_str(), g_state.path.c_str()) != 0)) {
            why = strerror(errno);
        }
        if (why != nullptr) {
            if (fd >= 0) {
                close(fd);
            }
            unlink(tmp.c_str());
            LLAMA_LOG_WARN("%s: repack cache: not written to %s: %s\n", __func__, g_state.path.c_str(), why);
        } else {
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            LLAMA_LOG_INFO("%s: repack cache: wrote %.2f MiB to %s in %.1f s\n", __func__, size / 1024.0 / 1024.0,
                           g_state.path.c_str(), s);
        }
    }
#endif
    reset();
}
