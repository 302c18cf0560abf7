"""Executors behind one Runner contract (`runner`): the NumPy reference (`reference`, the oracle), its
llama.cpp arithmetic (`llama_cpp`, with `ggml_cpu`'s bit-exact kernels), and the GPU executor over
pyshim.gpu (`gpu_runner`); `loading` opens a GGUF file on any of them; `profile` times a GPU step by kernel.
May import: pyshim.errors, pyshim.gguf, pyshim.plan, pyshim.models, pyshim.gpu."""
