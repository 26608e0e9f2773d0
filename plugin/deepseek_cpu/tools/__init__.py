"""Developer and demo commands: benchmarks, synthetic models, the stock llama.cpp build, the demo."""
