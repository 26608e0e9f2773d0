// deepseek-cpu: the DEEPSEEK_CPU_OP_PROFILE=1 op profile (time per op, weight and batch size, printed at
// exit). Called around each node by ggml_graph_compute_thread (ggml-cpu.c).

#include "ggml.h"
#include "dsc/dsc-tuning.h"
#include "dsc/op-profile.h"
#include "dsc/expert-usage.h"
#include "dsc/expert-prefetch.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// deepseek-cpu: DEEPSEEK_CPU_OP_PROFILE=1 prints, at exit, where thread 0 spent its graph time, by op and
// weight (blk.N. stripped, so a weight's layers add up) and batch size: each node's time runs from its
// start to the end of the barrier after it, so waiting for the slower thread counts against the node that
// caused it. A diagnostic: one process, one context at a time (the table is not locked).
// "own" is the part before thread 0 reaches that barrier: a node whose total is far above its own time
// waited for another thread.
// (GGML_DSC_PROF_MAX rows: dsc/dsc-tuning.h)
struct dsc_prof_entry { char key[96]; double s; double own; int64_t n; };
static struct dsc_prof_entry dsc_prof[GGML_DSC_PROF_MAX];
static int dsc_prof_n = 0;
static int dsc_prof_on = -1;

static double dsc_prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9*ts.tv_nsec;
}

static int dsc_prof_cmp(const void * a, const void * b) {
    const double x = ((const struct dsc_prof_entry *) a)->s, y = ((const struct dsc_prof_entry *) b)->s;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void dsc_prof_print(void) {
    double tot = 0;
    for (int i = 0; i < dsc_prof_n; i++) tot += dsc_prof[i].s;
    qsort(dsc_prof, dsc_prof_n, sizeof(dsc_prof[0]), dsc_prof_cmp);
    fprintf(stderr, "deepseek-cpu op profile: %.3f s in graphs\n", tot);
    for (int i = 0; i < dsc_prof_n; i++) {
        fprintf(stderr, "%6.2f%% %10.3f ms %8" PRId64 " x %9.1f us (own %9.1f)  %s\n", 100*dsc_prof[i].s/tot,
                1e3*dsc_prof[i].s, dsc_prof[i].n, 1e6*dsc_prof[i].s/dsc_prof[i].n, 1e6*dsc_prof[i].own/dsc_prof[i].n,
                dsc_prof[i].key);
    }
}

static void dsc_prof_add(const struct ggml_tensor * node, int n_fused, double dt, double own) {
    char key[96];
    const struct ggml_tensor * w = node->src[0];
    if ((node->op == GGML_OP_MUL_MAT || node->op == GGML_OP_MUL_MAT_ID) && w) {
        const char * nm = w->name;
        if (strncmp(nm, "blk.", 4) == 0) {
            const char * dot = strchr(nm + 4, '.');
            if (dot) nm = dot + 1;
        }
        // tokens: MUL_MAT's src1 rows; MUL_MAT_ID's ids columns
        const int64_t ntok = node->op == GGML_OP_MUL_MAT_ID ? node->src[2]->ne[1] : node->src[1]->ne[1];
        snprintf(key, sizeof(key), "%s%s %s %s [%d tok]", ggml_op_name(node->op), n_fused ? "+fused" : "",
                 ggml_type_name(w->type), nm, (int) ntok);
    } else {
        // attention and the rest: by type and shape (dst rows x the rest, or for flash attention its
        // queries), so a 16-head op of a 512-token prompt and of one decoded token are kept apart
        const int64_t ntok = node->op == GGML_OP_FLASH_ATTN_EXT && node->src[0] ? node->src[0]->ne[1] : node->ne[1];
        const int64_t nrest = node->op == GGML_OP_FLASH_ATTN_EXT ? 1 : node->ne[2]*node->ne[3];
        char rest[24] = "";
        if (nrest > 1) {
            snprintf(rest, sizeof(rest), " x %d", (int) nrest);
        }
        snprintf(key, sizeof(key), "%s%s %s [%d%s]", ggml_op_name(node->op), n_fused ? "+fused" : "",
                 w ? ggml_type_name(w->type) : "-", (int) ntok, rest);
    }
    for (int i = 0; i < dsc_prof_n; i++) {
        if (strcmp(dsc_prof[i].key, key) == 0) {
            dsc_prof[i].s += dt;
            dsc_prof[i].own += own;
            dsc_prof[i].n++;
            return;
        }
    }
    if (dsc_prof_n < GGML_DSC_PROF_MAX) {
        snprintf(dsc_prof[dsc_prof_n].key, sizeof(dsc_prof[0].key), "%s", key);
        dsc_prof[dsc_prof_n].s = dt;
        dsc_prof[dsc_prof_n].own = own;
        dsc_prof[dsc_prof_n].n = 1;
        dsc_prof_n++;
    }
}

// thread 0's clock when the profile is on, else 0 (DEEPSEEK_CPU_OP_PROFILE is read on thread 0's first call)
double ggml_dsc_op_profile_time(int ith) {
    if (ith == 0 && dsc_prof_on < 0) {
        const char * e = getenv("DEEPSEEK_CPU_OP_PROFILE");
        dsc_prof_on = e && *e && *e != '0';
        if (dsc_prof_on) {
            atexit(dsc_prof_print);
        }
    }
    return ith == 0 && dsc_prof_on > 0 ? dsc_prof_now() : 0;
}

// after the barrier that ends the node: t0 from its start, t1 from before the barrier
void ggml_dsc_op_profile_add(int ith, const struct ggml_tensor * node, int n_fused, double t0, double t1) {
    // the one per-node hook of the compute loop also feeds the expert-usage counters (dsc/expert-usage.c)
    if (ith == 0 && node->op == GGML_OP_MUL_MAT_ID) {
        ggml_dsc_expert_usage_count(node);
    }
    if (ith == 0) {
        ggml_dsc_expert_prefetch_node(node);
    }
    if (ith == 0 && dsc_prof_on > 0) {
        dsc_prof_add(node, n_fused, dsc_prof_now() - t0, t1 - t0);
    }
}
