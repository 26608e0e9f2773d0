// deepseek-cpu: a shared key between RPC clients and workers. Before HELLO, each side proves it
// knows the key with an HMAC-SHA-256 over both sides' fresh nonces (dsc-rpc.h has the message
// layout; docs/multi-host.md what it protects). SHA-256 (FIPS 180-4) and HMAC (RFC 2104) are
// written here, checked against FIPS 180-2 and RFC 4231 vectors by tests/test_rpc_auth.py.

#include "dsc-rpc.h"
#include "transport.h"

#include "ggml-impl.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#ifndef _WIN32
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/random.h>
#endif
#endif

// ---- SHA-256 ----

namespace {

struct sha256 {
    uint32_t h[8];
    uint64_t bytes = 0;      // message length so far
    uint8_t  block[64];
    size_t   used = 0;       // bytes waiting in `block`

    sha256() {
        static const uint32_t init[8] = {
            0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
        };
        memcpy(h, init, sizeof(h));
    }

    static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

    void compress(const uint8_t * p) {
        static const uint32_t k[64] = {
            0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
            0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
            0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
            0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
            0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
            0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
            0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
            0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
        };
        uint32_t w[64];
        for (int i = 0; i < 16; i++) {
            w[i] = (uint32_t) p[4*i] << 24 | (uint32_t) p[4*i + 1] << 16 | (uint32_t) p[4*i + 2] << 8 | p[4*i + 3];
        }
        for (int i = 16; i < 64; i++) {
            const uint32_t s0 = rotr(w[i-15], 7) ^ rotr(w[i-15], 18) ^ (w[i-15] >> 3);
            const uint32_t s1 = rotr(w[i-2], 17) ^ rotr(w[i-2], 19) ^ (w[i-2] >> 10);
            w[i] = w[i-16] + s0 + w[i-7] + s1;
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        for (int i = 0; i < 64; i++) {
            const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
            const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
    }

    void update(const void * data, size_t len) {
        const uint8_t * p = (const uint8_t *) data;
        bytes += len;
        while (len > 0) {
            if (used == 0 && len >= 64) {
                compress(p);
                p += 64;
                len -= 64;
                continue;
            }
            const size_t n = len < 64 - used ? len : 64 - used;
            memcpy(block + used, p, n);
            used += n;
            p += n;
            len -= n;
            if (used == 64) {
                compress(block);
                used = 0;
            }
        }
    }

    void final(uint8_t out[32]) {
        const uint64_t bits = bytes * 8;
        const uint8_t one = 0x80, zero = 0;
        update(&one, 1);
        while (used != 56) {
            update(&zero, 1);
        }
        uint8_t len[8];
        for (int i = 0; i < 8; i++) {
            len[i] = (uint8_t) (bits >> (56 - 8*i));
        }
        update(len, 8);
        for (int i = 0; i < 8; i++) {
            out[4*i] = (uint8_t) (h[i] >> 24); out[4*i + 1] = (uint8_t) (h[i] >> 16);
            out[4*i + 2] = (uint8_t) (h[i] >> 8); out[4*i + 3] = (uint8_t) h[i];
        }
    }
};

struct span {
    const void * data;
    size_t       size;
};

// HMAC-SHA-256 of the concatenation of `parts`
void hmac_sha256(const void * key, size_t key_len, const span * parts, size_t n_parts, uint8_t out[32]) {
    uint8_t k[64] = {0};
    if (key_len > 64) {
        sha256 kh;
        kh.update(key, key_len);
        kh.final(k);
    } else if (key_len > 0) {
        memcpy(k, key, key_len);
    }
    uint8_t pad[64];
    for (int i = 0; i < 64; i++) {
        pad[i] = k[i] ^ 0x36;
    }
    sha256 inner;
    inner.update(pad, 64);
    for (size_t i = 0; i < n_parts; i++) {
        inner.update(parts[i].data, parts[i].size);
    }
    uint8_t ih[32];
    inner.final(ih);
    for (int i = 0; i < 64; i++) {
        pad[i] = k[i] ^ 0x5c;
    }
    sha256 outer;
    outer.update(pad, 64);
    outer.update(ih, 32);
    outer.final(out);
}

bool same_mac(const uint8_t * a, const uint8_t * b, size_t n) {  // constant time
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < n; i++) {
        diff = diff | (uint8_t) (a[i] ^ b[i]);
    }
    return diff == 0;
}

} // namespace

extern "C" {

void ggml_dsc_rpc_sha256(const void * data, size_t len, uint8_t * out) {
    sha256 s;
    s.update(data, len);
    s.final(out);
}

void ggml_dsc_rpc_hmac_sha256(const void * key, size_t key_len, const void * data, size_t len, uint8_t * out) {
    const span part = { data, len };
    hmac_sha256(key, key_len, &part, 1, out);
}

}

// ---- the key file ----

static bool is_space(uint8_t c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

bool dsc_rpc_read_key_file(const char * path, std::string & key, std::string & error) {
    key.clear();
#ifdef _WIN32
    FILE * f = fopen(path, "rb");
#else
    struct stat st;
    if (stat(path, &st) != 0) {
        error = std::string("RPC key file ") + path + (errno == ENOENT ? " not found" : std::string(": ") + strerror(errno));
        return false;
    }
    if (S_ISDIR(st.st_mode)) {
        error = std::string("RPC key file ") + path + " is a directory";
        return false;
    }
    if (S_ISREG(st.st_mode) && (st.st_mode & 077)) {
        char mode[8];
        snprintf(mode, sizeof(mode), "%04o", (unsigned) (st.st_mode & 07777));
        error = std::string("RPC key file ") + path + " is accessible by others (mode " + mode +
                "); it must be private: chmod 600 " + path;
        return false;
    }
    FILE * f = fopen(path, "rb");
#endif
    if (!f) {
        error = std::string("cannot read RPC key file ") + path + ": " + strerror(errno);
        return false;
    }
    std::string data(DSC_RPC_KEY_FILE_MAX + 1, '\0');
    const size_t n = fread(&data[0], 1, data.size(), f);
    fclose(f);
    data.resize(n);
    if (n > DSC_RPC_KEY_FILE_MAX) {
        error = std::string("RPC key file ") + path + " is larger than " + std::to_string(DSC_RPC_KEY_FILE_MAX) +
                " bytes; is it the right file?";
        return false;
    }
    // one key: the one line that is neither blank nor a '#' comment, spaces around it dropped
    int found = 0;
    size_t start = 0;
    while (start <= data.size()) {
        size_t end = data.find('\n', start);
        if (end == std::string::npos) {
            end = data.size();
        }
        size_t a = start, b = end;
        while (a < b && is_space((uint8_t) data[a])) a++;
        while (b > a && is_space((uint8_t) data[b - 1])) b--;
        if (b > a && data[a] != '#') {
            found++;
            key.assign(data, a, b - a);
        }
        start = end + 1;
    }
    if (found == 0) {
        error = std::string("RPC key file ") + path + " holds no key";
        return false;
    }
    if (found > 1) {
        error = std::string("RPC key file ") + path + " holds " + std::to_string(found) + " keys; it must hold one";
        key.clear();
        return false;
    }
    for (unsigned char c : key) {
        if (c < 0x20 || c > 0x7e) {
            error = std::string("the key in RPC key file ") + path + " is not printable ASCII";
            key.clear();
            return false;
        }
    }
    if (key.size() < DSC_RPC_KEY_MIN) {
        error = std::string("the key in RPC key file ") + path + " is shorter than " + std::to_string(DSC_RPC_KEY_MIN) +
                " characters (make one with: openssl rand -hex 32)";
        key.clear();
        return false;
    }
    return true;
}

int ggml_dsc_rpc_read_key_file(const char * path, char * key, size_t key_size, char * error, size_t error_size) {
    std::string k, e;
    if (!dsc_rpc_read_key_file(path, k, e)) {
        snprintf(error, error_size, "%s", e.c_str());
        return -1;
    }
    snprintf(key, key_size, "%s", k.c_str());
    return (int) k.size();
}

// ---- the handshake ----

static const char LABEL_WORKER[] = "deepseek-cpu rpc auth v1 worker";
static const char LABEL_CLIENT[] = "deepseek-cpu rpc auth v1 client";
static_assert(sizeof(LABEL_WORKER) == sizeof(LABEL_CLIENT), "labels of one length: the MAC input is unambiguous");

static void role_mac(const std::string & key, const char * label, const uint8_t * nc, const uint8_t * ns, uint8_t out[32]) {
    const span parts[3] = { { label, sizeof(LABEL_WORKER) }, { nc, DSC_RPC_NONCE }, { ns, DSC_RPC_NONCE } };
    hmac_sha256(key.data(), key.size(), parts, 3, out);
}

static bool fresh_nonce(uint8_t * out, size_t n) {
#ifdef _WIN32
    GGML_UNUSED(out); GGML_UNUSED(n);
    return false;  // no authenticated RPC on Windows
#else
    size_t got = 0;
#if defined(__linux__)
    while (got < n) {
        const ssize_t r = getrandom(out + got, n - got, 0);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            break;
        }
        got += (size_t) r;
    }
#endif
    if (got < n) {
        const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            return false;
        }
        while (got < n) {
            const ssize_t r = read(fd, out + got, n - got);
            if (r < 0 && errno == EINTR) {
                continue;
            }
            if (r <= 0) {
                break;
            }
            got += (size_t) r;
        }
        close(fd);
    }
    return got == n;
#endif
}

static std::string peer_name(int fd) {
#ifndef _WIN32
    struct sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    char host[INET6_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *) &addr, &len) == 0) {
        if (addr.ss_family == AF_INET) {
            const struct sockaddr_in * a = (const struct sockaddr_in *) &addr;
            inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
            return std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
        }
        if (addr.ss_family == AF_INET6) {
            const struct sockaddr_in6 * a = (const struct sockaddr_in6 *) &addr;
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
            return "[" + std::string(host) + "]:" + std::to_string(ntohs(a->sin6_port));
        }
    }
#else
    GGML_UNUSED(fd);
#endif
    return "a client";
}

static bool send_frame(socket_t & sock, const void * data, uint64_t size) {  // | size (8) | data |
    return sock.send_data(&size, sizeof(size)) && sock.send_data(data, size) && sock.flush();
}

// ---- worker ----

static std::string g_worker_key;  // empty: no key, the plain protocol

bool dsc_rpc_worker_auth_init(void) {
    const char * path = std::getenv("DEEPSEEK_CPU_RPC_KEY_FILE");
    if (!path || !*path) {
        printf("  authentication : none (any client that reaches this port is served)\n");
        return true;
    }
    std::string error;
    if (!dsc_rpc_read_key_file(path, g_worker_key, error)) {
        fprintf(stderr, "deepseek-cpu: %s (DEEPSEEK_CPU_RPC_KEY_FILE); not starting\n", error.c_str());
        return false;
    }
    uint8_t probe[DSC_RPC_NONCE];
    if (!fresh_nonce(probe, sizeof(probe))) {
        fprintf(stderr, "deepseek-cpu: no random numbers for the key handshake (getrandom, /dev/urandom); not starting\n");
        return false;
    }
    printf("  authentication : shared key (%s)\n", path);
    return true;
}

// the rest of a short request the worker answers before closing, read so that the connection ends
// with the answer and a FIN, not a reset that may discard the answer
static void drain_short(socket_t & sock) {
    uint64_t size = 0;
    uint8_t rest[64];
    if (sock.recv_data(&size, sizeof(size)) && size <= sizeof(rest)) {
        sock.recv_data(rest, (size_t) size);
    }
}

static bool refuse(const std::string & peer, const char * why) {
    GGML_LOG_ERROR("deepseek-cpu: refused %s: %s; closed before any command ran\n", peer.c_str(), why);
    return false;
}

bool dsc_rpc_worker_accept(socket_t & sock, uint8_t * cmd) {
    if (!sock.recv_data(cmd, 1)) {
        return false;
    }
    if (g_worker_key.empty()) {
        if (*cmd == DSC_RPC_CMD_AUTH) {
            // a client with a key: tell it this worker has none, so that it can say so
            drain_short(sock);
            send_frame(sock, DSC_RPC_MAGIC_NO_KEY, 8);
            return refuse(peer_name(sock.native_fd()), "it offered a key and this worker has none (start it with --key-file)");
        }
        return true;
    }
    const std::string peer = peer_name(sock.native_fd());
    if (*cmd != DSC_RPC_CMD_AUTH) {
        if (*cmd == 14) {  // RPC_CMD_HELLO: a client without a key, or an older one
            drain_short(sock);
        }
        send_frame(sock, DSC_RPC_MAGIC_NEED_KEY, 8);  // an old or keyless client learns why it is closed
        char why[96];
        snprintf(why, sizeof(why), "no key proof (it sent command %u first: a client without the key)", (unsigned) *cmd);
        return refuse(peer, why);
    }
    // | AUTH | 40 | magic (8) | client nonce (32) |
    uint64_t size = 0;
    uint8_t hello[8 + DSC_RPC_NONCE];
    if (!sock.recv_data(&size, sizeof(size)) || size != sizeof(hello) || !sock.recv_data(hello, sizeof(hello)) ||
        memcmp(hello, DSC_RPC_MAGIC_AUTH, 8) != 0) {
        return refuse(peer, "a malformed key handshake");
    }
    const uint8_t * nc = hello + 8;
    // | 72 | magic (8) | worker nonce (32) | HMAC(key, worker label | nc | ns) (32) |
    uint8_t reply[8 + DSC_RPC_NONCE + 32];
    uint8_t * ns = reply + 8;
    memcpy(reply, DSC_RPC_MAGIC_AUTH, 8);
    if (!fresh_nonce(ns, DSC_RPC_NONCE)) {
        return refuse(peer, "no random numbers for the handshake");
    }
    role_mac(g_worker_key, LABEL_WORKER, nc, ns, reply + 8 + DSC_RPC_NONCE);
    if (!send_frame(sock, reply, sizeof(reply))) {
        return refuse(peer, "it left during the key handshake");
    }
    // | AUTH | 32 | HMAC(key, client label | nc | ns) |
    uint8_t c = 0, proof[32], expected[32];
    if (!sock.recv_data(&c, 1) || c != DSC_RPC_CMD_AUTH || !sock.recv_data(&size, sizeof(size)) || size != sizeof(proof) ||
        !sock.recv_data(proof, sizeof(proof))) {
        return refuse(peer, "no key proof (it stopped or sent something else after the worker's challenge)");
    }
    role_mac(g_worker_key, LABEL_CLIENT, nc, ns, expected);
    if (!same_mac(proof, expected, sizeof(proof))) {
        return refuse(peer, "a wrong key proof (another key, or a replayed handshake)");
    }
    GGML_LOG_INFO("deepseek-cpu: %s proved the key\n", peer.c_str());
    return sock.recv_data(cmd, 1);
}

// ---- client ----

static std::mutex                         g_keys_mutex;
static std::map<std::string, std::string> g_client_keys;  // endpoint -> key given by the caller

void ggml_dsc_rpc_set_key(const char * endpoint, const char * key, size_t len) {
    std::lock_guard<std::mutex> lock(g_keys_mutex);
    if (key && len > 0) {
        g_client_keys[endpoint] = std::string(key, len);
    } else {
        g_client_keys.erase(endpoint);
    }
}

static bool client_key(const std::string & endpoint, std::string & key, std::string & error) {
    {
        std::lock_guard<std::mutex> lock(g_keys_mutex);
        auto it = g_client_keys.find(endpoint);
        if (it != g_client_keys.end()) {
            key = it->second;
            return true;
        }
    }
    const char * path = std::getenv("DEEPSEEK_CPU_RPC_KEY_FILE");
    if (!path || !*path) {
        key.clear();
        return true;
    }
    return dsc_rpc_read_key_file(path, key, error);
}

bool dsc_rpc_client_auth(socket_t & sock, const std::string & endpoint, std::string & why) {
    std::string key;
    if (!client_key(endpoint, key, why)) {
        return false;
    }
    if (key.empty()) {
        return true;  // no key: the plain protocol (a worker with a key answers DSC_RPC_MAGIC_NEED_KEY)
    }
    uint8_t hello[8 + DSC_RPC_NONCE];
    memcpy(hello, DSC_RPC_MAGIC_AUTH, 8);
    const uint8_t * nc = hello + 8;
    if (!fresh_nonce(hello + 8, DSC_RPC_NONCE)) {
        why = "no random numbers for the key handshake";
        return false;
    }
    const uint8_t cmd = DSC_RPC_CMD_AUTH;
    uint64_t size = 0;
    if (!sock.send_data(&cmd, 1) || !send_frame(sock, hello, sizeof(hello)) || !sock.recv_data(&size, sizeof(size))) {
        why = "no answer to the key handshake (not a worker, busy, or it closed the connection)";
        return false;
    }
    uint8_t reply[8 + DSC_RPC_NONCE + 32];
    if (size == 8 && sock.recv_data(reply, 8) && memcmp(reply, DSC_RPC_MAGIC_NO_KEY, 8) == 0) {
        why = "the worker has no key (start it with --key-file), and this client was given one";
        return false;
    }
    if (size != sizeof(reply) || !sock.recv_data(reply, sizeof(reply)) || memcmp(reply, DSC_RPC_MAGIC_AUTH, 8) != 0) {
        why = "a malformed answer to the key handshake (not a deepseek-cpu worker?)";
        return false;
    }
    const uint8_t * ns = reply + 8;
    uint8_t expected[32], proof[32];
    role_mac(key, LABEL_WORKER, nc, ns, expected);
    if (!same_mac(reply + 8 + DSC_RPC_NONCE, expected, 32)) {
        why = "the worker does not know this key (another key, or not the worker meant)";
        return false;
    }
    role_mac(key, LABEL_CLIENT, nc, ns, proof);
    if (!sock.send_data(&cmd, 1) || !send_frame(sock, proof, sizeof(proof))) {
        why = "the connection closed during the key handshake";
        return false;
    }
    return true;
}
