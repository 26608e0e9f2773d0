"""Loading the engine, the drop-in Llama, serving and chatting."""
