#pragma once

struct llama_model_loader;

// deepseek-cpu: the loader's choice of where a weight lives (src/dsc/loader-mapped.cpp), called by
// llama-model-loader.cpp.

// Whether the weight `name` stays in the plain CPU buffer, used from the file mapping instead of
// being copied into a repacked buffer: true when DEEPSEEK_CPU_MAPPED (a regular expression,
// searched) matches it. The Python package sets it under a memory budget for the routed experts.
bool llama_dsc_keep_mapped(const char * name);

// Whether DEEPSEEK_CPU_MAPPED names any weight: then the loader does not read the whole file ahead at
// load (MAP_POPULATE), only what it copies, and the weights kept in the mapping are read when used.
bool llama_dsc_keeps_any_mapped(void);

// Whether the loader reads only part of the model file at load: weights kept in the mapping
// (DEEPSEEK_CPU_MAPPED) or mapped from the repack cache. Then the file is not read ahead whole
// (MAP_POPULATE), only the weights it copies (llama_dsc_read_ahead_copied).
bool llama_dsc_reads_part_of_file(void);

// With weights kept in the mapping (and so no read-ahead of the whole file), ask the kernel for every
// other weight's pages at once (madvise WILLNEED), so the loader's copies do not fault them in one
// read-around at a time. Called once the file mappings exist.
void llama_dsc_read_ahead_copied(const llama_model_loader & ml);

// deepseek-cpu: the repack cache (src/dsc/repack-cache.cpp), a directory named by
// DEEPSEEK_CPU_REPACK_CACHE: the first load writes the repacked weights there, later loads map them.
struct ggml_context;
struct ggml_tensor;
typedef struct ggml_backend_buffer * ggml_backend_buffer_t;
typedef struct ggml_backend_buffer_type * ggml_backend_buffer_type_t;

// Before the file mappings exist: find this model's cache file and check that it matches.
void llama_dsc_repack_cache_begin(const llama_model_loader & ml);
// Whether this load maps its repacked weights from the cache (then the model file is not read ahead
// whole; the weights outside the cache are, by llama_dsc_read_ahead_copied).
bool llama_dsc_repack_cache_hit(void);
// Whether the weight `name` comes from the cache in this load.
bool llama_dsc_repack_cache_covers(const char * name);
// In place of ggml_backend_alloc_ctx_tensors_from_buft for the CPU_REPACK context: the buffer mapped from
// the cache with the context's tensors placed in it, or NULL (allocate as usual).
ggml_backend_buffer_t llama_dsc_repack_cache_alloc(ggml_context * ctx, ggml_backend_buffer_type_t buft);
// The buffer allocated as usual for a context, to be written to the cache once loaded.
void llama_dsc_repack_cache_fresh(ggml_context * ctx, ggml_backend_buffer_t buf);
// Whether the tensor's bytes are already in place (mapped from the cache): the loader skips it.
bool llama_dsc_repack_cache_holds(const ggml_tensor * t);
// After every weight is loaded: write the cache when this load filled a fresh buffer; forget the state.
void llama_dsc_repack_cache_end(void);
