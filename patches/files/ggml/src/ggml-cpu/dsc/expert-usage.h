#pragma once

// deepseek-cpu: expert-usage statistics (dsc/expert-usage.c)

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_tensor;

// count the experts a MUL_MAT_ID node selected (thread 0, after the node ran)
void ggml_dsc_expert_usage_count(const struct ggml_tensor * node);

// exported for the Python package: counts[layer][expert] into out (n_layer x n_expert, row-major),
// and clearing them
__attribute__((visibility("default"))) int  ggml_dsc_expert_usage(uint64_t * out, int n_layer, int n_expert);
__attribute__((visibility("default"))) void ggml_dsc_expert_usage_reset(void);

#ifdef __cplusplus
}
#endif
