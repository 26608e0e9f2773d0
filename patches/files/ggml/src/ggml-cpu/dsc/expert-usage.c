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
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

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

// ---------------------------------------------------------------------------------------------
// Expert prefetch (DEEPSEEK_CPU_EXPERT_PREFETCH=1; the Python package sets it under a memory budget,
// where the expert weights are used from the file mapping). As soon as a layer's router has ranked the
// experts (the node "ffn_moe_argsort-N" is done; "ffn_moe_topk-N", its first k rows, is a view that
// the compute loop skips), thread 0 asks the kernel for the chosen experts' slices of that
// layer's gate, up and down weights with one madvise(WILLNEED) each: the reads of all of them start at
// once, in large requests, while the gate product computes, instead of one small read-around per page
// fault as the product reaches each page. The weights' addresses are learnt from the layer's MUL_MAT_ID
// nodes the first time they run.

#define DSC_PF_WEIGHTS 3

struct dsc_pf_weight {
    const char * data;
    size_t       nb2;
    int64_t      n_expert;
};

static struct dsc_pf_weight dsc_pf[DSC_USAGE_LAYERS][DSC_PF_WEIGHTS];
static int64_t dsc_pf_k[DSC_USAGE_LAYERS];  // experts used per token, from the ids of the layer's MUL_MAT_ID
static int dsc_pf_on = -1;

static int dsc_pf_enabled(void) {
    if (dsc_pf_on < 0) {
        const char * e = getenv("DEEPSEEK_CPU_EXPERT_PREFETCH");
        dsc_pf_on = e && *e && *e != '0';
    }
    return dsc_pf_on;
}

// "blk.N.ffn_{gate,up,down}_exps.weight" -> N and the slot; -1 otherwise
static int dsc_pf_slot(const char * name, int * slot) {
    int layer = -1, used = 0;
    if (sscanf(name, "blk.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0 || layer >= DSC_USAGE_LAYERS) {
        return -1;
    }
    const char * w = name + used;
    if (strncmp(w, "ffn_gate_exps", 13) == 0 || strncmp(w, "ffn_gate_up_exps", 16) == 0) { *slot = 0; return layer; }
    if (strncmp(w, "ffn_up_exps", 11) == 0)   { *slot = 1; return layer; }
    if (strncmp(w, "ffn_down_exps", 13) == 0) { *slot = 2; return layer; }
    return -1;
}

void ggml_dsc_expert_prefetch_node(const struct ggml_tensor * node) {
    if (!dsc_pf_enabled()) {
        return;
    }
#if defined(__linux__)
    if (node->op == GGML_OP_MUL_MAT_ID) {  // learn where the layer's expert weights are
        const struct ggml_tensor * w = node->src[0];
        int slot = 0;
        const int layer = w ? dsc_pf_slot(w->name, &slot) : -1;
        if (layer >= 0 && w->data != NULL && node->src[2] != NULL) {
            dsc_pf[layer][slot] = (struct dsc_pf_weight) { (const char *) w->data, w->nb[2], w->ne[2] };
            dsc_pf_k[layer]     = node->src[2]->ne[0];
        }
        return;
    }
    int layer = -1, used = 0;
    if (node->type != GGML_TYPE_I32 || node->data == NULL ||
        sscanf(node->name, "ffn_moe_argsort-%d%n", &layer, &used) != 1 || used == 0 || layer < 0 ||
        layer >= DSC_USAGE_LAYERS || dsc_pf_k[layer] <= 0) {
        return;
    }
    const int64_t k_used = dsc_pf_k[layer] < node->ne[0] ? dsc_pf_k[layer] : node->ne[0];
    static long page = 0;
    if (page == 0) {
        page = sysconf(_SC_PAGESIZE);
    }
    uint8_t seen[DSC_USAGE_EXPERTS];
    memset(seen, 0, sizeof(seen));
    for (int64_t t = 0; t < node->ne[1]; t++) {
        const char * col = (const char *) node->data + t*node->nb[1];
        for (int64_t k = 0; k < k_used; k++) {
            const int32_t e = *(const int32_t *) (col + k*node->nb[0]);
            if (e < 0 || e >= DSC_USAGE_EXPERTS || seen[e]) {
                continue;
            }
            seen[e] = 1;
            for (int s = 0; s < DSC_PF_WEIGHTS; s++) {
                const struct dsc_pf_weight * w = &dsc_pf[layer][s];
                if (w->data == NULL || e >= w->n_expert) {
                    continue;
                }
                const uintptr_t a  = (uintptr_t) (w->data + (size_t) e*w->nb2);
                const uintptr_t a0 = a - a % (uintptr_t) page;
                madvise((void *) a0, w->nb2 + (a - a0), MADV_WILLNEED);
            }
        }
    }
#endif
}
