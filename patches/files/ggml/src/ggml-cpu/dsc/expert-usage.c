// deepseek-cpu: expert-usage statistics. How often the router chose each routed expert of each layer,
// counted from the selected ids of every MUL_MAT_ID on the layer's gate experts (blk.N.ffn_gate_exps),
// by thread 0 after the node ran (ggml_dsc_op_profile_add, dsc/op-profile.c, sees every node). A few
// hundred integer increments per layer and batch: always on. Read and cleared through the two exported
// functions below (bound in Python by deepseek_cpu/runtime/experts.py). The counters are per process:
// two models evaluated in one process add up.

#include "ggml.h"
#include "dsc/expert-usage.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DSC_USAGE_LAYERS  256
#define DSC_USAGE_EXPERTS 512

static uint64_t dsc_usage[DSC_USAGE_LAYERS][DSC_USAGE_EXPERTS];

// "blk.N.ffn_gate_exps.weight" (or a view of it, "... (view)") -> N; -1 for any other weight
static int dsc_usage_layer(const char * name) {
    int layer = -1, used = 0;
    if (sscanf(name, "blk.%d.%n", &layer, &used) != 1 || used == 0) {
        return -1;
    }
    return strncmp(name + used, "ffn_gate_exps", 13) == 0 || strncmp(name + used, "ffn_gate_up_exps", 16) == 0
        ? layer : -1;
}

void ggml_dsc_expert_usage_count(const struct ggml_tensor * node) {
    const struct ggml_tensor * w   = node->src[0];
    const struct ggml_tensor * ids = node->src[2];
    if (w == NULL || ids == NULL || ids->type != GGML_TYPE_I32 || ids->data == NULL) {
        return;
    }
    const int layer = dsc_usage_layer(w->name);
    const int64_t n_expert = w->ne[2];
    if (layer < 0 || layer >= DSC_USAGE_LAYERS || n_expert > DSC_USAGE_EXPERTS) {
        return;
    }
    uint64_t * row = dsc_usage[layer];
    // ids: [n_expert_used, n_tokens], the experts chosen for each token
    for (int64_t t = 0; t < ids->ne[1]; t++) {
        const char * col = (const char *) ids->data + t*ids->nb[1];
        for (int64_t k = 0; k < ids->ne[0]; k++) {
            const int32_t e = *(const int32_t *) (col + k*ids->nb[0]);
            if (e >= 0 && e < n_expert) {
                row[e]++;
            }
        }
    }
}

int ggml_dsc_expert_usage(uint64_t * out, int n_layer, int n_expert) {
    if (out == NULL || n_layer < 0 || n_expert < 0) {
        return -1;
    }
    for (int l = 0; l < n_layer; l++) {
        for (int e = 0; e < n_expert; e++) {
            out[(int64_t) l*n_expert + e] = l < DSC_USAGE_LAYERS && e < DSC_USAGE_EXPERTS ? dsc_usage[l][e] : 0;
        }
    }
    return 0;
}

void ggml_dsc_expert_usage_reset(void) {
    memset(dsc_usage, 0, sizeof(dsc_usage));
}
