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

// With weights kept in the mapping (and so no read-ahead of the whole file), ask the kernel for every
// other weight's pages at once (madvise WILLNEED), so the loader's copies do not fault them in one
// read-around at a time. Called once the file mappings exist.
void llama_dsc_read_ahead_copied(const llama_model_loader & ml);
