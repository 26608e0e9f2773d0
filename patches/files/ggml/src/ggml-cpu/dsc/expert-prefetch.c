// deepseek-cpu: reading routed experts ahead, for expert weights used from the file mapping (a memory
// budget: the Python package turns it on through ggml_dsc_expert_prefetch_set; or
// DEEPSEEK_CPU_EXPERT_PREFETCH=1|2). Everything runs on thread 0 after a node (dsc/op-profile.c).
//
// Level 1, the chosen experts: as soon as a layer's router has ranked the experts (the node
// "ffn_moe_argsort-N" is done; "ffn_moe_topk-N", its first k rows, is a view that the compute loop
// skips), the chosen experts' slices of that layer's gate, up and down weights are asked for with one
// madvise(WILLNEED) each: their reads start at once, in large requests, instead of one small
// read-around per page fault as the products reach each page.
//
// Level 2, also the next layer's (pre-gating): at the same moment the next layer's router weights are
// applied to this layer's router input (the normed hidden state, "ffn_moe_logits-N"'s second operand,
// still alive then), and the top k experts of those scores are read ahead too, a whole layer early, so
// the disk has two layers' requests in flight. The next layer's real input differs by one attention and
// one FFN residual; the hit rate is counted (ggml_dsc_expert_prefetch_stats). Batches score at most
// GGML_DSC_PREGATE_TOKENS tokens (dsc-tuning.h), evenly spaced, to bound thread 0's work.
//
// DeepSeek-V4's hash-routed layers choose their experts from the token ids alone (a table lookup,
// "ffn_moe_topk-N", a GET_ROWS of the layer's tid2eid table): each lookup's experts are read ahead
// when it is done, like a router's choice, and at the first hash layer's lookup also every later hash
// layer's experts for this graph's tokens. That is exact, not a prediction (the tables are learnt
// from an earlier graph), so it needs no level 2; there, a hash layer's router logits (still computed:
// they weight the chosen experts) pre-gate the next layer as an argsort would.
//
// Addresses are learnt from the nodes the first time they run (weights do not move): the expert
// weights from each layer's MUL_MAT_ID, the router from "ffn_moe_logits-N" (an f32 MUL_MAT). A layer's
// MUL_MAT_ID runs after its router, so the first graph (a cold prompt) would read nothing ahead: the
// Python package registers the expert weights at load (ggml_dsc_expert_prefetch_weights). Pre-gating
// reads the next layer's router as learnt from an earlier graph: when a model is freed, its addresses
// must be forgotten first (ggml_dsc_expert_prefetch_forget; deepseek_cpu.Llama does it at load and
// close), since they would point into freed memory; the chosen experts' read-ahead only passes
// addresses to madvise, which refuses unmapped ones.

#include "ggml.h"
#include "dsc/dsc-tuning.h"
#include "dsc/expert-prefetch.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#define DSC_PF_LAYERS  256
#define DSC_PF_EXPERTS 512
#define DSC_PF_WEIGHTS 3   // gate, up, down

struct dsc_pf_weight {
    const char * data;
    size_t       nb2;
    int64_t      n_expert;
};

struct dsc_pf_router {  // f32 [n_embd, n_expert]
    const float * data;
    size_t        nb1;
    int64_t       n_embd;
    int64_t       n_expert;
};

struct dsc_pf_input {   // this graph's router input of a layer: f32 [n_embd, n_tokens]
    const char * data;
    size_t       nb1;
    int64_t      n_tokens;
};

static struct dsc_pf_weight dsc_pf[DSC_PF_LAYERS][DSC_PF_WEIGHTS];
static struct dsc_pf_router dsc_pf_router[DSC_PF_LAYERS];
static struct dsc_pf_input  dsc_pf_input[DSC_PF_LAYERS];
static int64_t  dsc_pf_k[DSC_PF_LAYERS];                            // experts per token, from the layer's ids
static uint8_t  dsc_pf_predicted[DSC_PF_LAYERS][DSC_PF_EXPERTS];    // by the previous layer, this graph
static int      dsc_pf_has_prediction[DSC_PF_LAYERS];
static uint64_t dsc_pf_stats[3];

struct dsc_pf_hash_table {  // a hash layer's tid2eid: I32 [k, n_vocab]
    const char * data;
    size_t       nb1;
    int64_t      k;
    int64_t      n_vocab;
};
static struct dsc_pf_hash_table dsc_pf_hash[DSC_PF_LAYERS];
static uint8_t  dsc_pf_hash_read[DSC_PF_LAYERS][DSC_PF_EXPERTS];    // read ahead from this graph's tokens
static int      dsc_pf_hash_pending[DSC_PF_LAYERS];
static uint64_t dsc_pf_hash_stats[2];
static int      dsc_pf_level = -1;

static int dsc_pf_get_level(void) {
    if (dsc_pf_level < 0) {
        const char * e = getenv("DEEPSEEK_CPU_EXPERT_PREFETCH");
        dsc_pf_level = e && *e >= '1' && *e <= '9' ? (*e == '1' ? 1 : 2) : 0;
    }
    return dsc_pf_level;
}

void ggml_dsc_expert_prefetch_forget(void) {
    memset(dsc_pf, 0, sizeof(dsc_pf));
    memset(dsc_pf_router, 0, sizeof(dsc_pf_router));
    memset(dsc_pf_input, 0, sizeof(dsc_pf_input));
    memset(dsc_pf_k, 0, sizeof(dsc_pf_k));
    memset(dsc_pf_has_prediction, 0, sizeof(dsc_pf_has_prediction));
    memset(dsc_pf_hash, 0, sizeof(dsc_pf_hash));
    memset(dsc_pf_hash_pending, 0, sizeof(dsc_pf_hash_pending));
}

void ggml_dsc_expert_prefetch_weights(int layer, int slot, const void * data, size_t expert_bytes, int64_t n_expert,
                                      int64_t k) {
    if (layer < 0 || layer >= DSC_PF_LAYERS || slot < 0 || slot >= DSC_PF_WEIGHTS || n_expert <= 0 || k <= 0) {
        return;
    }
    dsc_pf[layer][slot] = (struct dsc_pf_weight) { (const char *) data, expert_bytes, n_expert };
    dsc_pf_k[layer]     = k;
}

int ggml_dsc_expert_prefetch_set(int level) {
    const int was = dsc_pf_get_level();
    dsc_pf_level = level <= 0 ? 0 : level == 1 ? 1 : 2;
    return was;
}

void ggml_dsc_expert_prefetch_stats(uint64_t * out, int reset) {
    memcpy(out, dsc_pf_stats, sizeof(dsc_pf_stats));
    if (reset) {
        memset(dsc_pf_stats, 0, sizeof(dsc_pf_stats));
    }
}

void ggml_dsc_expert_prefetch_hash_stats(uint64_t * out, int reset) {
    memcpy(out, dsc_pf_hash_stats, sizeof(dsc_pf_hash_stats));
    if (reset) {
        memset(dsc_pf_hash_stats, 0, sizeof(dsc_pf_hash_stats));
    }
}

// "blk.N.ffn_{gate,up,down}_exps.weight" -> N and the slot; -1 otherwise
static int dsc_pf_slot(const char * name, int * slot) {
    int layer = -1, used = 0;
    if (sscanf(name, "blk.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0 || layer >= DSC_PF_LAYERS) {
        return -1;
    }
    const char * w = name + used;
    if (strncmp(w, "ffn_gate_exps", 13) == 0 || strncmp(w, "ffn_gate_up_exps", 16) == 0) { *slot = 0; return layer; }
    if (strncmp(w, "ffn_up_exps", 11) == 0)   { *slot = 1; return layer; }
    if (strncmp(w, "ffn_down_exps", 13) == 0) { *slot = 2; return layer; }
    return -1;
}

// "<prefix>-N" -> N (0 <= N < DSC_PF_LAYERS), else -1
static int dsc_pf_node_layer(const char * name, const char * prefix) {
    const size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0 || name[n] != '-') {
        return -1;
    }
    char * end = NULL;
    const long layer = strtol(name + n + 1, &end, 10);
    return end != name + n + 1 && *end == '\0' && layer >= 0 && layer < DSC_PF_LAYERS ? (int) layer : -1;
}

#if defined(__linux__)
// whether every page of [addr, addr + len) is in the page cache. Asking for pages that are already
// there is not free (on V2-Lite with the whole file cached, WILLNEED for each chosen expert took 30%
// of decode time); mincore reads the page tables instead.
static int dsc_pf_resident(void * addr, size_t len, size_t page) {
    unsigned char vec[1024];
    for (size_t off = 0; off < len; off += sizeof(vec)*page) {
        const size_t n = len - off < sizeof(vec)*page ? len - off : sizeof(vec)*page;
        if (mincore((char *) addr + off, n, vec) != 0) {
            return 0;
        }
        for (size_t i = 0; i < (n + page - 1)/page; i++) {
            if (!(vec[i] & 1)) {
                return 0;
            }
        }
    }
    return 1;
}

static void dsc_pf_read_expert(int layer, int32_t e) {
    static long page = 0;
    if (page == 0) {
        page = sysconf(_SC_PAGESIZE);
    }
    for (int s = 0; s < DSC_PF_WEIGHTS; s++) {
        const struct dsc_pf_weight * w = &dsc_pf[layer][s];
        if (w->data == NULL || e >= w->n_expert) {
            continue;
        }
        const uintptr_t a  = (uintptr_t) (w->data + (size_t) e*w->nb2);
        const uintptr_t a0 = a - a % (uintptr_t) page;
        if (!dsc_pf_resident((void *) a0, w->nb2 + (a - a0), (size_t) page)) {
            madvise((void *) a0, w->nb2 + (a - a0), MADV_WILLNEED);
        }
    }
}

static float dsc_pf_dot(const float * a, const float * b, int64_t n) {
    float s[8] = { 0 };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; j++) {
            s[j] += a[i + j]*b[i + j];
        }
    }
    float t = (s[0] + s[1]) + (s[2] + s[3]) + (s[4] + s[5]) + (s[6] + s[7]);
    for (; i < n; i++) {
        t += a[i]*b[i];
    }
    return t;
}

// the next layer's experts, predicted from this layer's router input, read ahead
static void dsc_pf_pregate(int layer) {
    const int next = layer + 1;
    const struct dsc_pf_router * r = &dsc_pf_router[next];
    const struct dsc_pf_input  * x = &dsc_pf_input[layer];
    const int64_t k = dsc_pf_k[next] > 0 ? dsc_pf_k[next] : dsc_pf_k[layer];
    if (next >= DSC_PF_LAYERS || r->data == NULL || x->data == NULL || r->n_expert > DSC_PF_EXPERTS ||
        k <= 0 || k > r->n_expert) {
        return;
    }
    memset(dsc_pf_predicted[next], 0, sizeof(dsc_pf_predicted[next]));
    const int64_t n_tok = x->n_tokens < GGML_DSC_PREGATE_TOKENS ? x->n_tokens : GGML_DSC_PREGATE_TOKENS;
    float score[DSC_PF_EXPERTS];
    for (int64_t i = 0; i < n_tok; i++) {
        const int64_t t = n_tok == x->n_tokens ? i : i * x->n_tokens / n_tok;
        const float * h = (const float *) (x->data + t*x->nb1);
        for (int64_t e = 0; e < r->n_expert; e++) {
            score[e] = dsc_pf_dot((const float *) ((const char *) r->data + e*r->nb1), h, r->n_embd);
        }
        for (int64_t j = 0; j < k; j++) {  // k passes of a max: k is 6 or 8
            int64_t best = -1;
            for (int64_t e = 0; e < r->n_expert; e++) {
                if (score[e] > -INFINITY && (best < 0 || score[e] > score[best])) {
                    best = e;
                }
            }
            if (best < 0) {
                break;
            }
            score[best] = -INFINITY;
            if (!dsc_pf_predicted[next][best]) {
                dsc_pf_predicted[next][best] = 1;
                dsc_pf_read_expert(next, (int32_t) best);
            }
        }
    }
    dsc_pf_has_prediction[next] = 1;
}

// the experts a layer chose: the first k_used rows of an I32 [>= k_used, n_tokens] node
static void dsc_pf_chosen(const struct ggml_tensor * node, int64_t k_used, uint8_t seen[DSC_PF_EXPERTS]) {
    memset(seen, 0, DSC_PF_EXPERTS);
    for (int64_t t = 0; t < node->ne[1]; t++) {
        const char * col = (const char *) node->data + t*node->nb[1];
        for (int64_t k = 0; k < k_used; k++) {
            const int32_t e = *(const int32_t *) (col + k*node->nb[0]);
            if (e >= 0 && e < DSC_PF_EXPERTS) {
                seen[e] = 1;
            }
        }
    }
}

// every later hash layer's experts for this graph's tokens (an I32 [n_tokens] tensor), read ahead
static void dsc_pf_hash_ahead(int layer, const struct ggml_tensor * tokens) {
    if (tokens->type != GGML_TYPE_I32 || tokens->data == NULL || tokens->nb[0] != sizeof(int32_t)) {
        return;
    }
    for (int m = layer + 1; m < DSC_PF_LAYERS; m++) {
        const struct dsc_pf_hash_table * h = &dsc_pf_hash[m];
        if (h->data == NULL || dsc_pf_k[m] <= 0) {
            continue;
        }
        memset(dsc_pf_hash_read[m], 0, sizeof(dsc_pf_hash_read[m]));
        for (int64_t t = 0; t < ggml_nelements(tokens); t++) {
            const int32_t tok = ((const int32_t *) tokens->data)[t];
            if (tok < 0 || tok >= h->n_vocab) {
                continue;
            }
            const int32_t * row = (const int32_t *) (h->data + (size_t) tok*h->nb1);
            for (int64_t k = 0; k < h->k; k++) {
                const int32_t e = row[k];
                if (e >= 0 && e < DSC_PF_EXPERTS && !dsc_pf_hash_read[m][e]) {
                    dsc_pf_hash_read[m][e] = 1;
                    dsc_pf_read_expert(m, e);
                }
            }
        }
        dsc_pf_hash_pending[m] = 1;
    }
}

// a hash layer's table lookup is done: its table, its chosen experts read ahead, the tokens' later
// hash layers too; counts how many of the experts read ahead for it were chosen
static void dsc_pf_hash_layer(const struct ggml_tensor * node, int layer) {
    const struct ggml_tensor * table = node->src[0];
    if (table == NULL || table->type != GGML_TYPE_I32 || table->data == NULL || node->src[1] == NULL) {
        return;
    }
    dsc_pf_hash[layer] = (struct dsc_pf_hash_table) { (const char *) table->data, table->nb[1], table->ne[0],
                                                      table->ne[1] };
    if (dsc_pf_k[layer] <= 0) {
        dsc_pf_k[layer] = table->ne[0];
    }
    uint8_t seen[DSC_PF_EXPERTS];
    dsc_pf_chosen(node, node->ne[0], seen);
    for (int32_t e = 0; e < DSC_PF_EXPERTS; e++) {
        if (seen[e]) {
            dsc_pf_read_expert(layer, e);
        }
    }
    if (dsc_pf_hash_pending[layer]) {
        for (int e = 0; e < DSC_PF_EXPERTS; e++) {
            dsc_pf_hash_stats[0] += dsc_pf_hash_read[layer][e];
            dsc_pf_hash_stats[1] += dsc_pf_hash_read[layer][e] & seen[e];
        }
        dsc_pf_hash_pending[layer] = 0;
    }
    dsc_pf_hash_ahead(layer, node->src[1]);
}
#endif

void ggml_dsc_expert_prefetch_node(const struct ggml_tensor * node) {
    const int level = dsc_pf_get_level();
    if (level == 0) {
        return;
    }
#if defined(__linux__)
    if (node->op == GGML_OP_MUL_MAT_ID) {  // where the layer's expert weights are
        const struct ggml_tensor * w = node->src[0];
        int slot = 0;
        const int layer = w ? dsc_pf_slot(w->name, &slot) : -1;
        if (layer >= 0 && w->data != NULL && node->src[2] != NULL) {
            dsc_pf[layer][slot] = (struct dsc_pf_weight) { (const char *) w->data, w->nb[2], w->ne[2] };
            dsc_pf_k[layer]     = node->src[2]->ne[0];
        }
        return;
    }
    if (node->op == GGML_OP_MUL_MAT) {  // the router: its weights, and this graph's input to it
        const int layer = dsc_pf_node_layer(node->name, "ffn_moe_logits");
        const struct ggml_tensor * w = node->src[0];
        const struct ggml_tensor * x = node->src[1];
        if (layer >= 0 && w->type == GGML_TYPE_F32 && x->type == GGML_TYPE_F32 && w->nb[0] == sizeof(float) &&
            x->nb[0] == sizeof(float) && w->ne[0] == x->ne[0] && w->ne[2] == 1 && x->ne[2] == 1) {
            dsc_pf_router[layer] = (struct dsc_pf_router) { (const float *) w->data, w->nb[1], w->ne[0], w->ne[1] };
            dsc_pf_input[layer]  = (struct dsc_pf_input) { (const char *) x->data, x->nb[1], x->ne[1] };
            if (level >= 2 && dsc_pf_hash[layer].data != NULL) {  // a hash layer has no argsort to pre-gate from
                dsc_pf_pregate(layer);
                dsc_pf_input[layer].data = NULL;
            }
        }
        return;
    }
    if (node->op == GGML_OP_GET_ROWS) {
        const int layer = dsc_pf_node_layer(node->name, "ffn_moe_topk");
        if (layer >= 0 && node->type == GGML_TYPE_I32 && node->data != NULL && node->ne[0] <= DSC_PF_EXPERTS) {
            dsc_pf_hash_layer(node, layer);
        }
        return;
    }
    if (node->type != GGML_TYPE_I32 || node->data == NULL) {
        return;
    }
    const int layer = dsc_pf_node_layer(node->name, "ffn_moe_argsort");
    if (layer < 0 || dsc_pf_k[layer] <= 0) {
        return;
    }
    const int64_t k_used = dsc_pf_k[layer] < node->ne[0] ? dsc_pf_k[layer] : node->ne[0];
    uint8_t seen[DSC_PF_EXPERTS];
    dsc_pf_chosen(node, k_used, seen);
    for (int32_t e = 0; e < DSC_PF_EXPERTS; e++) {
        if (seen[e]) {
            dsc_pf_read_expert(layer, e);
        }
    }
    if (dsc_pf_has_prediction[layer]) {  // how well the previous layer predicted this one
        for (int e = 0; e < DSC_PF_EXPERTS; e++) {
            dsc_pf_stats[0] += dsc_pf_predicted[layer][e];
            dsc_pf_stats[1] += dsc_pf_predicted[layer][e] & seen[e];
            dsc_pf_stats[2] += seen[e];
        }
        dsc_pf_has_prediction[layer] = 0;
    }
    if (level >= 2) {
        dsc_pf_pregate(layer);
    }
    dsc_pf_input[layer].data = NULL;  // valid for this graph only
#else
    (void) node;
#endif
}
