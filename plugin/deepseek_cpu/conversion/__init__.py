"""The conversion framework: a Hugging Face checkpoint to a GGUF through the converter plugins."""
