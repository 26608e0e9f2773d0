"""The quantization types: one registry of every GGUF type deepseek-cpu writes or asks llama.cpp for."""
