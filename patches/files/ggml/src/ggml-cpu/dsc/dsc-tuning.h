#pragma once

// deepseek-cpu: every tuning constant of our kernels, in one place. Each can be overridden at
// build time (CMAKE_C_FLAGS / CMAKE_CXX_FLAGS="-DNAME=VALUE"); the values here are the measured
// defaults (docs/engine.md gives each one's valid range, docs/patch-notes.md the measurements).
// Constants fixed by a data layout and switches derived from the target ISA stay next to the
// code that needs them.
// Shared by C and C++.
//
// The engine's run-time switches, read from the environment (OP_PROFILE, MQA_FA and HUGEPAGES once,
// the others at each context, graph build or large tensor); docs/engine.md has the details:
//   DEEPSEEK_CPU_OP_PROFILE=1  per-op time table at exit (ggml/src/ggml-cpu/dsc/op-profile.c) default off
//   DEEPSEEK_CPU_MQA_FA=0      one-token MLA attention as four stock ops (src/llama-graph.cpp,
//                              ggml/src/ggml-cpu/dsc/mla-attention.cpp)                     default on
//   DEEPSEEK_CPU_MLA_MHA=0|1   force the absorbed (0) or decompressed (1) MLA form
//                              (src/dsc/mla-attention-graph.cpp)                  default: by cost
//   DEEPSEEK_CPU_MLA_FA=0      decompressed prefill through KQ/softmax/KQV, not flash attention
//                              (src/dsc/mla-attention-graph.cpp)                            default on
//   DEEPSEEK_CPU_HUGEPAGES=0   no transparent-huge-page hint on buffers >= 32 MiB
//                              (ggml/src/ggml.c)                                            default on
//   DEEPSEEK_CPU_PREFAULT=0    no multi-threaded prefault of tensor destinations at load
//                              (src/dsc/loader-memory.cpp)                                  default on
//   DEEPSEEK_CPU_FORCE_ROPE=1  the wrapper's rope_freq_* win over the GGUF's YaRN values
//                              (src/llama-context.cpp)                                     default off
//   DEEPSEEK_CPU_AMX=0         prompt products on AVX-512 VNNI instead of AMX tiles
//                              (ggml/src/ggml-cpu/dsc/amx-gemm.cpp)           default on where AMX runs
//   DEEPSEEK_CPU_EXPERT_PREFETCH=1|2  read each layer's chosen experts ahead (madvise WILLNEED), and (2)
//                              the next layer's predicted ones, for weights used from the file mapping
//                              (ggml/src/ggml-cpu/dsc/expert-prefetch.c; also ggml_dsc_expert_prefetch_set)
//                                                                                          default off
//   DEEPSEEK_CPU_MAPPED=REGEX  weights kept in the file mapping, not copied (src/dsc/loader-mapped.cpp,
//                              read at each load)                                       default unset

// ---- decode GEMVs (one token) ----
// Rows (for repacked weights, 8-column groups) one decode GEMV reads at once, one from each of
// that many even parts of the weight matrix: more streams in flight than one thread's
// latency-bound DRAM stream gives.
#ifndef GGML_DSC_GEMV_STREAMS
#define GGML_DSC_GEMV_STREAMS 4
#endif
// The decode GEMVs read GGML_DSC_GEMV_STREAMS regions at once where this returns that, one where it
// returns 1: chosen per CPU at run time (dsc/gemv-streams.c).
#ifdef __cplusplus
extern "C"
#endif
int ggml_dsc_gemv_streams(void);
// Bytes ahead of its loads a decode GEMV software-prefetches its weights (also walks the page
// tables ahead, which the hardware streamer does not do across 4 KB pages).
#ifndef GGML_DSC_GEMV_PREFETCH
#define GGML_DSC_GEMV_PREFETCH 2048
#endif
// Longest row, in 32-value blocks (512 = 16384 values), the multi-row q4_0 / q5_0 / q8_0 GEMVs take.
#ifndef GGML_DSC_GEMV_MAX_BLOCKS
#define GGML_DSC_GEMV_MAX_BLOCKS 512
#endif
// Blocks per k-chunk in the repacked q4_0 GEMV (per-block offsets and scales kept as vectors, 8 KB).
#ifndef GGML_DSC_Q4_0_KCV
#define GGML_DSC_Q4_0_KCV 128
#endif

// ---- prompt GEMMs (many tokens) ----
// Blocks per k-chunk in the repacked q4_0 4-row GEMM: the chunk's broadcast activations (16 KB) stay in L1.
#ifndef GGML_DSC_Q4_0_KC
#define GGML_DSC_Q4_0_KC 16
#endif
// The same for the 8-row q4_0 GEMM (16 KB at 8).
#ifndef GGML_DSC_Q4_0_KC8
#define GGML_DSC_Q4_0_KC8 8
#endif
// k depth and width (output columns, a multiple of 16) of the packed weight panel of the f32 x f32 GEMM.
#ifndef DSC_F32_KC
#define DSC_F32_KC 128
#endif
#ifndef DSC_F32_NC
#define DSC_F32_NC 64
#endif

// Fewest tokens (MUL_MAT: activation rows; MUL_MAT_ID: tokens of the batch) for which q4_0 / q4_K
// products of the repack buffer run on AMX tiles instead of the AVX-512 VNNI GEMMs.
#ifndef DSC_AMX_MIN_TOKENS
#define DSC_AMX_MIN_TOKENS 16
#endif

// ---- expert GEMMs (MUL_MAT_ID) ----
// Tokens per chunk when an expert gets two or more tokens: their gathered q8_0 rows stay in L2.
#ifndef DSC_MMID_SGEMM_COLS
#define DSC_MMID_SGEMM_COLS 64
#endif
// Weight rows per chunk on that path (also the largest row chunk of the plain q5_0 / q8_0 GEMM).
#ifndef DSC_MMID_SGEMM_ROWS
#define DSC_MMID_SGEMM_ROWS 128
#endif
// Longest row, in 32-value blocks (1024 = 32768 values), the q5_0 / q8_0 broadcast GEMM takes.
#ifndef DSC_MMID_G8_MAX_NB
#define DSC_MMID_G8_MAX_NB 1024
#endif
// q5_0 blocks per k-chunk in that GEMM, so a 4-token tile's broadcast activations (16 KB) stay in L1.
#ifndef DSC_MMID_G8_KC
#define DSC_MMID_G8_KC 16
#endif

// ---- MLA attention ----
// One token: keys per block, and query heads per group sharing each loaded K/V row (the group's
// scores, HG x KB floats, stay in L1); the fewest runs of key blocks the keys are cut into.
#ifndef DSC_MQA_KB
#define DSC_MQA_KB 64
#endif
#ifndef DSC_MQA_HG
#define DSC_MQA_HG 16
#endif
#ifndef DSC_MQA_RUNS
#define DSC_MQA_RUNS 4
#endif
// Prompt (tiled f32 flash attention): queries per tile (the SIMD dimension) and keys per tile.
#ifndef DSC_FA_QT
#define DSC_FA_QT 64
#endif
#ifndef DSC_FA_KT
#define DSC_FA_KT 64
#endif

// ---- expert read-ahead under a memory budget (dsc/expert-prefetch.c) ----
// Tokens of a batch whose next-layer experts are predicted (pre-gating), evenly spaced: a prompt's
// batch chooses most experts of a layer anyway, and thread 0 scores the tokens alone.
#ifndef DSC_PREGATE_TOKENS
#define DSC_PREGATE_TOKENS 16
#endif

// ---- profiling ----
// Rows (distinct op, weight and shape keys) the DEEPSEEK_CPU_OP_PROFILE table holds.
#ifndef DSC_PROF_MAX
#define DSC_PROF_MAX 512
#endif
