#pragma once

// deepseek-cpu: DEEPSEEK_CPU_OP_PROFILE hooks of ggml_graph_compute_thread (ggml-cpu.c), in dsc/op-profile.c

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_tensor;

double ggml_dsc_op_profile_time(int ith);
void   ggml_dsc_op_profile_add(int ith, const struct ggml_tensor * node, int n_fused, double t0, double t1);

#ifdef __cplusplus
}
#endif
