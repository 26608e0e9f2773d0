#pragma once

// deepseek-cpu: Intel AMX for prompt-sized products of repacked q4_0 and q4_K weights (dsc/amx-gemm.cpp),
// called from the repack buffer's tensor traits (repack.cpp). Each entry point returns 0 / false when
// it does not take the op (no AMX, or not a shape it handles), and the stock code then runs.

#include "ggml-cpu-impl.h"

#ifdef __cplusplus
extern "C" {
#endif

// Whether AMX runs here: compiled in (AMX-INT8 build), the CPU has AMX-TILE and AMX-INT8, Linux grants
// the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM) and DEEPSEEK_CPU_AMX is not 0. Decided once.
bool ggml_dsc_amx_enabled(void);
// "on", or why the AMX path does not run (no AMX in this build or CPU, the kernel refused it, DEEPSEEK_CPU_AMX=0)
const char * ggml_dsc_amx_status(void);
// Switch the AMX path off (or back on where it runs), for comparisons in one process (test-repack-ops);
// returns ggml_dsc_amx_enabled(). Set it between graph computations, not during one.
bool ggml_dsc_amx_set_enabled(bool on);

// The work buffer MUL_MAT / MUL_MAT_ID of a repacked weight (block_q4_0x8 or block_q4_Kx8: nb_cols and
// inter_size 8) needs on the AMX path, or 0 when that path does not take the op.
size_t ggml_dsc_amx_work_size(const struct ggml_tensor * op, int n_threads, int64_t nb_cols, int64_t inter_size);

// The whole op on the AMX path (every thread calls it; all decide alike), or false.
bool ggml_dsc_amx_forward(const struct ggml_compute_params * params, struct ggml_tensor * op, int64_t nb_cols, int64_t inter_size);

#ifdef __cplusplus
}
#endif
