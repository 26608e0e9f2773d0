// deepseek-cpu: what we add to llama.cpp's RPC backend (dsc-rpc.cpp), called from ggml-rpc.cpp and
// transport.cpp. Upstream's backend aborts the client when a worker dies, blocks forever on a peer
// that stopped answering, can be crashed by a malformed request, takes any amount of memory,
// trusts its weight cache blindly (a short file under a hash's name was loaded as the weights) and
// serves anyone who reaches its port; each function below is the fix for one of those.
#pragma once

#include "ggml-backend.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct socket_t;

// Sockets. DEEPSEEK_CPU_RPC_TIMEOUT (seconds, default 15) bounds how long a peer that stopped
// answering goes unnoticed: TCP keepalive probes (answered by the peer's kernel even while it
// computes, so a long graph is not a timeout), TCP_USER_TIMEOUT for unacknowledged data, and a
// receive timeout for the handshake only (a busy worker serves one client at a time).
int  dsc_rpc_timeout_s(void);
void dsc_rpc_tune_socket(int fd);
void dsc_rpc_handshake_timeout(int fd, bool on);
void dsc_rpc_connect_timeout(int fd, bool on);

// Client: a worker that died or became unreachable. Each loss is counted and its message kept
// (ggml_dsc_rpc_lost returns the count and copies the latest message; a caller compares counts
// before and after a decode); later commands to that worker are skipped and graph_compute fails, so
// llama_decode returns an error instead of the process aborting. With
// DEEPSEEK_CPU_RPC_LOST_EXIT=N the process exits with status N instead (for a supervised server).
void dsc_rpc_worker_lost(const std::string & endpoint, const char * what);
extern "C" {
GGML_BACKEND_API size_t ggml_dsc_rpc_lost(char * buf, size_t size);
}

// Worker: DEEPSEEK_CPU_RPC_MEM (bytes) caps the buffers all clients hold and is what
// GET_DEVICE_MEMORY reports, so a client splits layers by what the worker offers.
bool dsc_rpc_mem_reserve(size_t size);
void dsc_rpc_mem_commit(const void * buffer, size_t size);   // after a reserve, once allocated
void dsc_rpc_mem_unreserve(size_t size);                     // after a reserve, allocation failed
void dsc_rpc_mem_release(const void * buffer);
bool dsc_rpc_mem_report(size_t * free, size_t * total);      // false: no limit set

// Worker: the weight cache. Entries are written to a temporary name and renamed (a crash leaves
// no half file under a hash's name); an entry is used if it has the size of the whole region it is
// for (`whole`), or else if its content has the hash it is filed under (a damaged file is removed
// and the client sends the weights again).
typedef uint64_t (*dsc_rpc_hash_fn)(const uint8_t * data, size_t len, uint64_t seed);
bool dsc_rpc_cache_read(const char * dir, uint64_t hash, size_t whole, dsc_rpc_hash_fn fnv, std::vector<uint8_t> & data);
size_t dsc_rpc_region_size(uint32_t type, const uint32_t * ne, const uint32_t * nb, uint64_t offset);  // 0: malformed
void dsc_rpc_cache_write(const char * dir, uint64_t hash, const void * data, size_t size);

// Worker: requests that would make ggml abort are refused instead (the connection is closed).
bool dsc_rpc_node_ok(const ggml_tensor * node);
bool dsc_rpc_shape_ok(const uint32_t * ne, const uint32_t * nb);                // counts and sizes fit
bool dsc_rpc_region_ok(const ggml_tensor * t, uint64_t offset, uint64_t size);  // within the tensor
bool dsc_rpc_copy_ok(const ggml_tensor * src, const ggml_tensor * dst);           // same layout

// Worker: the weights the client's loader would repack (2D matrices, 3D expert stacks) are repacked
// in place as they arrive and used through the CPU backend's repacked GEMMs (dsc-rpc.cpp says how).
// DEEPSEEK_CPU_RPC_REPACK=0 keeps them as sent. dsc_rpc_set_weight: false means "store as usual".
void dsc_rpc_worker_devices(ggml_backend_dev_t * devices, size_t n);  // at start: finds CPU_REPACK
bool dsc_rpc_set_weight(ggml_tensor * t, const void * data, size_t offset, size_t size);
void dsc_rpc_adopt_repacked(ggml_tensor * t);          // a graph's copy of a repacked weight
void dsc_rpc_forget_buffer(ggml_backend_buffer_t buffer);

// Worker: a message's body grows with the bytes that arrive (reserved, not zero-filled up front), so
// a peer that announces gigabytes and sends a few bytes costs a few bytes.
bool dsc_rpc_recv_body(socket_t & sock, std::vector<uint8_t> & input, uint64_t size);

// Authentication (dsc-rpc-auth.cpp): a shared key, DEEPSEEK_CPU_RPC_KEY_FILE (one key of at least
// 16 printable ASCII characters; a regular file must be private, mode 600). A worker with a key
// serves only clients that prove it; a client with a key connects only to workers that prove it.
// Before HELLO, in llama.cpp's framing (| cmd (1) | size (8, LE) | body | and replies | size | body |):
//   client -> worker  AUTH | 40 | "DSCAUTH1" | nc (32 random bytes)
//   worker -> client       | 72 | "DSCAUTH1" | ns (32 random bytes) | HMAC-SHA256(key, LW | nc | ns)
//   client -> worker  AUTH | 32 | HMAC-SHA256(key, LC | nc | ns)
// LW/LC: the role labels "deepseek-cpu rpc auth v1 worker"/"... client" with their NUL (32 bytes
// each), so a worker's answer replayed as a client's proof does not verify; the worker's nonce makes
// a recorded client's bytes useless on a new connection. A worker without a key answers AUTH with
// | 8 | "DSCNOKEY" |, a worker with one answers any other first command with | 8 | "DSCNEEDK" |, and
// either closes the connection; every refusal is logged by the worker with the peer's address.
#define DSC_RPC_CMD_AUTH        0xD5
#define DSC_RPC_NONCE           32
#define DSC_RPC_KEY_MIN         16
#define DSC_RPC_KEY_FILE_MAX    4096
#define DSC_RPC_MAGIC_AUTH      "DSCAUTH1"
#define DSC_RPC_MAGIC_NO_KEY    "DSCNOKEY"
#define DSC_RPC_MAGIC_NEED_KEY  "DSCNEEDK"
bool dsc_rpc_read_key_file(const char * path, std::string & key, std::string & error);
bool dsc_rpc_worker_auth_init(void);                               // at start: false = do not serve
bool dsc_rpc_worker_accept(socket_t & sock, uint8_t * cmd);        // the first command after the key
bool dsc_rpc_client_auth(socket_t & sock, const std::string & endpoint, std::string & why);
extern "C" {
// the key a client uses for `endpoint` (len 0: none given, DEEPSEEK_CPU_RPC_KEY_FILE applies)
GGML_BACKEND_API void ggml_dsc_rpc_set_key(const char * endpoint, const char * key, size_t len);
// the key in a key file (its length; -1 and `error` if refused), as a worker reads it
GGML_BACKEND_API int  ggml_dsc_rpc_read_key_file(const char * path, char * key, size_t key_size, char * error, size_t error_size);
GGML_BACKEND_API void ggml_dsc_rpc_sha256(const void * data, size_t len, uint8_t * out);  // for the tests
GGML_BACKEND_API void ggml_dsc_rpc_hmac_sha256(const void * key, size_t key_len, const void * data, size_t len, uint8_t * out);
}
