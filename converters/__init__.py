"""Built-in HF checkpoint -> GGUF converters (installed as deepseek_cpu.converters)."""
