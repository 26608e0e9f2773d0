#pragma once

// deepseek-cpu: every tuning constant of our kernels, in one place, all named GGML_DSC_*. Each can
// be overridden at build time (CMAKE_C_FLAGS / CMAKE_CXX_FLAGS="-DGGML_DSC_NAME=VALUE"); the values
// here are the measured defaults. docs/engine.md gives each one's valid range (tests/test_house_facts.py
// keeps its table and this file in step), and lists every DEEPSEEK_CPU_* run-time switch.
// Constants fixed by a data layout and switches derived from the target ISA stay next to the
// code that needs them.
// Shared by C and C++.

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
#ifndef GGML_DSC_F32_KC
#define GGML_DSC_F32_KC 128
#endif
#ifndef GGML_DSC_F32_NC
#define GGML_DSC_F32_NC 64
#endif

// Fewest tokens (MUL_MAT: activation rows; MUL_MAT_ID: tokens of the batch) for which q4_0 / q4_K
// products of the repack buffer run on AMX tiles instead of the AVX-512 VNNI GEMMs.
#ifndef GGML_DSC_AMX_MIN_TOKENS
#define GGML_DSC_AMX_MIN_TOKENS 16
#endif

// ---- expert GEMMs (MUL_MAT_ID) ----
// Tokens per chunk when an expert gets two or more tokens: their gathered q8_0 rows stay in L2.
#ifndef GGML_DSC_MMID_SGEMM_COLS
#define GGML_DSC_MMID_SGEMM_COLS 64
#endif
// Weight rows per chunk on that path (also the largest row chunk of the plain q5_0 / q8_0 GEMM).
#ifndef GGML_DSC_MMID_SGEMM_ROWS
#define GGML_DSC_MMID_SGEMM_ROWS 128
#endif
// Longest row, in 32-value blocks (1024 = 32768 values), the q5_0 / q8_0 broadcast GEMM takes.
#ifndef GGML_DSC_MMID_G8_MAX_NB
#define GGML_DSC_MMID_G8_MAX_NB 1024
#endif
// q5_0 blocks per k-chunk in that GEMM, so a 4-token tile's broadcast activations (16 KB) stay in L1.
#ifndef GGML_DSC_MMID_G8_KC
#define GGML_DSC_MMID_G8_KC 16
#endif

// ---- MLA attention ----
// One token: keys per block, and query heads per group sharing each loaded K/V row (the group's
// scores, HG x KB floats, stay in L1); the fewest runs of key blocks the keys are cut into.
#ifndef GGML_DSC_MQA_KB
#define GGML_DSC_MQA_KB 64
#endif
#ifndef GGML_DSC_MQA_HG
#define GGML_DSC_MQA_HG 16
#endif
#ifndef GGML_DSC_MQA_RUNS
#define GGML_DSC_MQA_RUNS 4
#endif
// Prompt (tiled f32 flash attention): queries per tile (the SIMD dimension) and keys per tile.
#ifndef GGML_DSC_FA_QT
#define GGML_DSC_FA_QT 64
#endif
#ifndef GGML_DSC_FA_KT
#define GGML_DSC_FA_KT 64
#endif
// The fewest queries the tiled kernel takes (a tile computes GGML_DSC_FA_QT columns whatever the count).
// DeepSeek-V4's graph sends prompts of this many tokens to flash attention (DSC_FA_TILED_MIN_TOKENS in
// src/dsc/mla-attention-graph.cpp must not be smaller: stock code would accumulate its f16 V in f16).
#ifndef GGML_DSC_FA_MIN_Q
#define GGML_DSC_FA_MIN_Q 16
#endif

// ---- expert read-ahead under a memory budget (dsc/expert-prefetch.c) ----
// Tokens of a batch whose next-layer experts are predicted (pre-gating), evenly spaced: a prompt's
// batch chooses most experts of a layer anyway, and thread 0 scores the tokens alone.
#ifndef GGML_DSC_PREGATE_TOKENS
#define GGML_DSC_PREGATE_TOKENS 16
#endif

// ---- profiling ----
// Rows (distinct op, weight and shape keys) the DEEPSEEK_CPU_OP_PROFILE table holds.
#ifndef GGML_DSC_PROF_MAX
#define GGML_DSC_PROF_MAX 512
#endif
