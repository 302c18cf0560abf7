"""GGUF files read: the header (metadata and the tensor table) from its bytes alone, the model's
hyperparameters (`ModelSpec`, and the architectures pyshim runs), the tensor types (and which executor
decodes which), the tensors' bytes from a file or a buffer.
May import: pyshim.errors (and gguf, numpy)."""
