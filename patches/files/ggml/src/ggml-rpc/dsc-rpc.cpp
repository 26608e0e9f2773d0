// deepseek-cpu: the RPC backend's timeouts, lost-worker state, worker memory limit, weight cache
// and request checks (dsc-rpc.h says why each exists). The key handshake is dsc-rpc-auth.cpp.

#include "dsc-rpc.h"
#include "transport.h"

#include "ggml-backend-impl.h"
#include "ggml-impl.h"

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <unordered_map>

#ifndef _WIN32
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#endif

static long env_long(const char * name, long fallback) {
    const char * v = std::getenv(name);
    if (!v || !*v) {
        return fallback;
    }
    char * end = nullptr;
    const long x = std::strtol(v, &end, 10);
    return (end && *end == '\0' && x > 0) ? x : fallback;
}

int dsc_rpc_timeout_s(void) {
    static const int t = (int) env_long("DEEPSEEK_CPU_RPC_TIMEOUT", 15);
    return t;
}

#ifndef _WIN32
static void set_timeval_opt(int fd, int opt, int seconds) {
    struct timeval tv = { seconds, 0 };
    setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof(tv));
}
#endif

void dsc_rpc_tune_socket(int fd) {
#ifndef _WIN32
    const int t = dsc_rpc_timeout_s();
    // idle t/3, then 3 probes t/6 apart: a silent peer is noticed within ~5t/6
    int on = 1, idle = t / 3 > 0 ? t / 3 : 1, intvl = t / 6 > 0 ? t / 6 : 1, cnt = 3;
    unsigned int user_timeout_ms = (unsigned int) t * 1000u;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
#else
    GGML_UNUSED(fd);
#endif
}

void dsc_rpc_handshake_timeout(int fd, bool on) {
#ifndef _WIN32
    set_timeval_opt(fd, SO_RCVTIMEO, on ? dsc_rpc_timeout_s() : 0);
#else
    GGML_UNUSED(fd); GGML_UNUSED(on);
#endif
}

void dsc_rpc_connect_timeout(int fd, bool on) {
#ifndef _WIN32
    // on Linux SO_SNDTIMEO also bounds connect(); cleared afterwards so that a large upload to a
    // worker that is briefly busy is not cut (keepalive and TCP_USER_TIMEOUT still apply)
    set_timeval_opt(fd, SO_SNDTIMEO, on ? dsc_rpc_timeout_s() : 0);
#else
    GGML_UNUSED(fd); GGML_UNUSED(on);
#endif
}

// ---- client: lost workers ----

static std::mutex  g_lost_mutex;
static std::string g_lost_message;  // the latest loss
static size_t      g_lost_count = 0;

void dsc_rpc_worker_lost(const std::string & endpoint, const char * what) {
    {
        std::lock_guard<std::mutex> lock(g_lost_mutex);
        g_lost_message = "RPC worker " + endpoint + " lost: " + what;
        g_lost_count++;
    }
    GGML_LOG_ERROR("deepseek-cpu: RPC worker %s lost: %s\n", endpoint.c_str(), what);
    const long code = env_long("DEEPSEEK_CPU_RPC_LOST_EXIT", 0);
    if (code > 0) {
        fflush(stdout);
        fflush(stderr);
        _exit((int) code);
    }
}

size_t ggml_dsc_rpc_lost(char * buf, size_t size) {
    std::lock_guard<std::mutex> lock(g_lost_mutex);
    if (buf && size > 0) {
        snprintf(buf, size, "%s", g_lost_message.c_str());
    }
    return g_lost_count;
}

// ---- worker: memory limit ----

static std::mutex                                  g_mem_mutex;
static size_t                                      g_mem_used = 0;
static std::unordered_map<const void *, size_t>    g_mem_buffers;

static size_t mem_limit(void) {
    static const size_t limit = (size_t) env_long("DEEPSEEK_CPU_RPC_MEM", 0);
    return limit;
}

bool dsc_rpc_mem_reserve(size_t size) {
    const size_t limit = mem_limit();
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    if (limit && (size > limit || g_mem_used > limit - size)) {
        GGML_LOG_ERROR("deepseek-cpu: refused a %.1f MiB buffer: %.1f of the worker's %.1f MiB (--mem) are in use\n",
                       size / 1048576.0, g_mem_used / 1048576.0, limit / 1048576.0);
        return false;
    }
    g_mem_used += size;
    return true;
}

void dsc_rpc_mem_commit(const void * buffer, size_t size) {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    g_mem_buffers[buffer] = size;
}

void dsc_rpc_mem_unreserve(size_t size) {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    g_mem_used -= size;
}

void dsc_rpc_mem_release(const void * buffer) {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    auto it = g_mem_buffers.find(buffer);
    if (it != g_mem_buffers.end()) {
        g_mem_used -= it->second;
        g_mem_buffers.erase(it);
    }
}

bool dsc_rpc_mem_report(size_t * free, size_t * total) {
    const size_t limit = mem_limit();
    if (!limit) {
        return false;
    }
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    *total = limit;
    *free  = limit - g_mem_used;
    return true;
}

// ---- worker: weight cache ----

namespace fs = std::filesystem;

static fs::path cache_path(const char * dir, uint64_t hash) {
    char name[17];
    snprintf(name, sizeof(name), "%016" PRIx64, hash);
    return fs::path(dir) / name;
}

size_t dsc_rpc_region_size(uint32_t type, const uint32_t * ne, const uint32_t * nb, uint64_t offset) {
    if (type >= GGML_TYPE_COUNT || ggml_blck_size((ggml_type) type) <= 0) {
        return 0;
    }
    const int64_t blck = ggml_blck_size((ggml_type) type);
    uint64_t n = blck == 1 ? ggml_type_size((ggml_type) type) : (uint64_t) ne[0] * nb[0] / blck;
    for (int i = blck == 1 ? 0 : 1; i < GGML_MAX_DIMS; i++) {
        if (ne[i] == 0) {
            return 0;
        }
        n += (uint64_t) (ne[i] - 1) * nb[i];
    }
    return offset <= n ? (size_t) (n - offset) : 0;
}

bool dsc_rpc_cache_read(const char * dir, uint64_t hash, size_t whole, dsc_rpc_hash_fn fnv, std::vector<uint8_t> & data) {
    if (!dir) {
        return false;
    }
    const fs::path path = cache_path(dir, hash);
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (ec) {
        return false;
    }
    std::ifstream in(path, std::ios::binary);
    try {
        data.resize((size_t) size);
    } catch (const std::bad_alloc &) {
        return false;
    }
    // an entry of the whole tensor's size was written whole (atomically); anything else, e.g. a short
    // file left by a worker without that patch, must prove its content (FNV reads ~1 GB/s)
    bool ok = (bool) in.read((char *) data.data(), (std::streamsize) size);
    if (ok && size != whole) {
        ok = fnv(data.data(), data.size(), 0xcbf29ce484222325ULL) == hash;
    }
    if (!ok) {
        GGML_LOG_WARN("deepseek-cpu: cache entry %s is damaged; removed (the client sends the weights again)\n", path.string().c_str());
        fs::remove(path, ec);
        data.clear();
        return false;
    }
    return true;
}

void dsc_rpc_cache_write(const char * dir, uint64_t hash, const void * data, size_t size) {
    const fs::path path = cache_path(dir, hash);
    fs::path tmp = path;
    tmp += ".tmp" + std::to_string((long) getpid());
    std::error_code ec;
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out.write((const char *) data, (std::streamsize) size) || !out.flush()) {
            out.close();
            fs::remove(tmp, ec);
            GGML_LOG_WARN("deepseek-cpu: could not write cache entry %s (disk full?); not cached\n", path.string().c_str());
            return;
        }
    }
    fs::rename(tmp, path, ec);
    if (ec) {
        fs::remove(tmp, ec);
    }
}

// ---- worker: request checks ----

bool dsc_rpc_recv_body(socket_t & sock, std::vector<uint8_t> & input, uint64_t size) {
    const size_t step = 4u << 20;  // zero-filled ahead of the bytes: what an announced size costs at most
    input.clear();
    try {
        input.reserve((size_t) size);  // address space only: pages are touched as bytes arrive
    } catch (const std::exception &) {
        GGML_LOG_ERROR("deepseek-cpu: refused a message of %" PRIu64 " bytes (no memory for it)\n", size);
        return false;
    }
    while (input.size() < size) {
        const size_t have = input.size();
        const size_t n = (size_t) (size - have) < step ? (size_t) (size - have) : step;
        input.resize(have + n);
        if (!sock.recv_data(input.data() + have, n)) {
            return false;
        }
    }
    return true;
}

bool dsc_rpc_node_ok(const ggml_tensor * node) {
    if (node->op < 0 || node->op >= GGML_OP_COUNT) {
        return false;
    }
    if (node->op == GGML_OP_UNARY && ((int) ggml_get_unary_op(node) < 0 || ggml_get_unary_op(node) >= GGML_UNARY_OP_COUNT)) {
        return false;
    }
    if (node->op != GGML_OP_NONE && node->data == nullptr && ggml_nelements(node) > 0) {
        return false;  // an unallocated result: the kernel would write through NULL
    }
    for (int i = 0; i < GGML_MAX_SRC; i++) {
        if (node->src[i] && node->src[i]->data == nullptr && ggml_nelements(node->src[i]) > 0) {
            return false;
        }
    }
    return true;
}

bool dsc_rpc_shape_ok(const uint32_t * ne, const uint32_t * nb) {
    // the element count must fit int64_t (ggml_new_tensor asserts it) and the extent in bytes must
    // not wrap around (ggml_nbytes would, and the buffer check after it would pass a huge tensor)
    uint64_t n = 1;
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        const uint64_t extent = ne[i] ? (uint64_t) (ne[i] - 1) * nb[i] : 0;
        if ((ne[i] > 1 && n >= (uint64_t) INT64_MAX / ne[i]) || extent > (1ull << 60)) {
            GGML_LOG_ERROR("deepseek-cpu: refused a tensor of %u x %u x %u x %u elements, strides %u %u %u %u\n",
                           ne[0], ne[1], ne[2], ne[3], nb[0], nb[1], nb[2], nb[3]);
            return false;
        }
        n *= ne[i] ? ne[i] : 1;
    }
    return true;
}

bool dsc_rpc_region_ok(const ggml_tensor * t, uint64_t offset, uint64_t size) {
    const uint64_t n = ggml_nbytes(t);
    if (offset > n || size > n - offset) {
        GGML_LOG_ERROR("deepseek-cpu: refused a region (offset %" PRIu64 ", %" PRIu64 " bytes) outside its tensor (%" PRIu64 " bytes)\n",
                       offset, size, n);
        return false;
    }
    return true;
}

bool dsc_rpc_copy_ok(const ggml_tensor * src, const ggml_tensor * dst) {
    if (!ggml_are_same_layout(src, dst)) {
        GGML_LOG_ERROR("deepseek-cpu: refused a copy between tensors of different layouts\n");
        return false;
    }
    return true;
}

// ---- worker: weights repacked at upload ----
//
// The server allocates every buffer from the CPU device's default (plain) buffer type: it cannot tell
// weights from activations, and the repack buffer type aborts on anything but whole weights. So the
// weights the client's loader would have put in the repack buffer (2D matrices and 3D expert stacks,
// written whole) are repacked in place when they arrive, using that buffer type's own init_tensor and
// set_tensor (the layout is ours: dsc/repack-dsc.cpp), and remembered by address; each graph's copy of
// such a tensor then gets the repack traits and a stand-in buffer of the repack type, which is how the
// CPU backend picks the repacked GEMMs and GEMVs (ggml_cpu_extra_compute_forward).

namespace {
struct repacked_weight {
    ggml_type             type;
    int64_t               ne[GGML_MAX_DIMS];
    void                * traits;
    ggml_backend_buffer_t real;
};
}

static std::map<uintptr_t, repacked_weight>                          g_repacked;
static std::unordered_map<ggml_backend_buffer_t, ggml_backend_buffer_t> g_repack_alias;  // real -> stand-in
static ggml_backend_buffer_t                                         g_repack_probe = nullptr;

static ggml_backend_buffer_type_t g_repack_buft = nullptr;

void dsc_rpc_worker_devices(ggml_backend_dev_t * devices, size_t n) {
    const char * v = std::getenv("DEEPSEEK_CPU_RPC_REPACK");
    if (v && v[0] == '0') {
        return;
    }
    for (size_t i = 0; i < n && !g_repack_buft; i++) {
        if (ggml_backend_dev_type(devices[i]) != GGML_BACKEND_DEVICE_TYPE_CPU) {
            continue;
        }
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(devices[i]);
        auto get = reg ? (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts") : nullptr;
        for (ggml_backend_buffer_type_t * b = get ? get(devices[i]) : nullptr; b && *b; ++b) {
            if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) {
                g_repack_buft = *b;
                break;
            }
        }
    }
    fprintf(stdout, "  weights        : %s\n", g_repack_buft ? "repacked at upload (CPU_REPACK)" : "as sent");
}

static ggml_backend_buffer_type_t repack_buft(void) {
    return g_repack_buft;
}

bool dsc_rpc_set_weight(ggml_tensor * t, const void * data, size_t offset, size_t size) {
    ggml_backend_buffer_type_t buft = repack_buft();
    if (!buft || !t->buffer || offset != 0 || size != ggml_nbytes(t) || !ggml_is_contiguous(t)) {
        return false;
    }
    // as llama.cpp's loader decides: a matrix used by MUL_MAT, an expert stack used by MUL_MAT_ID
    const char * name = ggml_get_name(t);
    const int    nd   = ggml_n_dims(t);
    if (!strstr(name, ".weight") || !(nd == 2 || (nd == 3 && strstr(name, "_exps")))) {
        return false;
    }
    if (!g_repack_probe && !(g_repack_probe = ggml_backend_buft_alloc_buffer(buft, 64))) {
        return false;
    }
    ggml_tensor tmp = *t;
    tmp.buffer = g_repack_probe;
    tmp.extra  = nullptr;
    if (g_repack_probe->iface.init_tensor(g_repack_probe, &tmp) != GGML_STATUS_SUCCESS || !tmp.extra) {
        return false;  // a type or shape without a repacked layout: stored as sent
    }
    g_repack_probe->iface.set_tensor(g_repack_probe, &tmp, data, 0, size);  // writes t->data, repacked

    const uintptr_t lo = (uintptr_t) t->data, hi = lo + size;
    for (auto it = g_repacked.lower_bound(lo); it != g_repacked.end() && it->first < hi; ) {
        it = g_repacked.erase(it);  // an earlier weight at these addresses
    }
    repacked_weight w = { t->type, {}, tmp.extra, t->buffer };
    memcpy(w.ne, t->ne, sizeof(w.ne));
    g_repacked[lo] = w;
    return true;
}

void dsc_rpc_adopt_repacked(ggml_tensor * t) {
    if (g_repacked.empty() || !t->buffer) {
        return;
    }
    auto it = g_repacked.find((uintptr_t) t->data);
    if (it == g_repacked.end()) {
        return;
    }
    const repacked_weight & w = it->second;
    if (w.type != t->type || memcmp(w.ne, t->ne, sizeof(w.ne)) != 0 || w.real != t->buffer) {
        return;
    }
    ggml_backend_buffer_t & alias = g_repack_alias[w.real];
    if (!alias) {
        alias = new ggml_backend_buffer(*w.real);  // same memory and interface, the repack type
        alias->buft = repack_buft();
    }
    t->extra  = w.traits;
    t->buffer = alias;
}

void dsc_rpc_forget_buffer(ggml_backend_buffer_t buffer) {
    for (auto it = g_repacked.begin(); it != g_repacked.end(); ) {
        it = it->second.real == buffer ? g_repacked.erase(it) : std::next(it);
    }
    auto a = g_repack_alias.find(buffer);
    if (a != g_repack_alias.end()) {
        delete a->second;
        g_repack_alias.erase(a);
    }
}
