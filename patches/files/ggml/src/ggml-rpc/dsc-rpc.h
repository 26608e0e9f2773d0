// deepseek-cpu: what we add to llama.cpp's RPC backend (dsc-rpc.cpp), called from ggml-rpc.cpp and
// transport.cpp. Upstream's backend aborts the client when a worker dies, blocks forever on a peer
// that stopped answering, can be crashed by a malformed request, takes any amount of memory and
// trusts its weight cache blindly (a short file under a hash's name was loaded as the weights); each function below is the fix for one of those.
#pragma once

#include "ggml-backend.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

// Worker: the weights the client's loader would repack (2D matrices, 3D expert stacks) are repacked
// in place as they arrive and used through the CPU backend's repacked GEMMs (dsc-rpc.cpp says how).
// DEEPSEEK_CPU_RPC_REPACK=0 keeps them as sent. dsc_rpc_set_weight: false means "store as usual".
void dsc_rpc_worker_devices(ggml_backend_dev_t * devices, size_t n);  // at start: finds CPU_REPACK
bool dsc_rpc_set_weight(ggml_tensor * t, const void * data, size_t offset, size_t size);
void dsc_rpc_adopt_repacked(ggml_tensor * t);          // a graph's copy of a repacked weight
void dsc_rpc_forget_buffer(ggml_backend_buffer_t buffer);
