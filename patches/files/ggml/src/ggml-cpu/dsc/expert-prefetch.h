#pragma once

// deepseek-cpu: reading routed experts ahead, for expert weights used from the file mapping (a memory
// budget): dsc/expert-prefetch.c.

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_tensor;

// thread 0, after each node ran (dsc/op-profile.c): learns where each layer's expert weights and router
// are, and, when on, reads ahead the experts each router chose and (level 2) those the next layer's
// router is predicted to choose
void ggml_dsc_expert_prefetch_node(const struct ggml_tensor * node);

// exported for the Python package. level: 0 off, 1 the chosen experts, 2 also the predicted ones of the
// next layer; returns the previous level. Starts at DEEPSEEK_CPU_EXPERT_PREFETCH (default 0).
__attribute__((visibility("default"))) int ggml_dsc_expert_prefetch_set(int level);
// where layer `layer`'s routed experts of `slot` (0 gate, 1 up, 2 down) lie: n_expert slices of
// expert_bytes from data, k chosen per token (so the first graph can read them ahead too)
__attribute__((visibility("default"))) void ggml_dsc_expert_prefetch_weights(int layer, int slot, const void * data,
                                                                            size_t expert_bytes, int64_t n_expert,
                                                                            int64_t k);
// forget every weight address learnt so far: call before a model whose addresses were learnt is freed
__attribute__((visibility("default"))) void ggml_dsc_expert_prefetch_forget(void);
// out[0] experts predicted for a layer, out[1] of them chosen by its router, out[2] experts chosen in
// layers that had a prediction: the pre-gating hit rate is out[1] / out[2]. reset: clears them.
__attribute__((visibility("default"))) void ggml_dsc_expert_prefetch_stats(uint64_t * out, int reset);
// DeepSeek-V4's hash layers: out[0] experts read ahead for a hash layer from the token ids at an earlier
// hash layer, out[1] of them chosen by its lookup (all, unless the table changed). reset: clears them.
__attribute__((visibility("default"))) void ggml_dsc_expert_prefetch_hash_stats(uint64_t * out, int reset);

#ifdef __cplusplus
}
#endif
