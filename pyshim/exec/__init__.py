"""Executors behind one Runner contract (`runner`): the NumPy reference (`reference`, the oracle), its
llama.cpp arithmetic (`llama_cpp`, with `ggml_cpu`'s bit-exact kernels), the GPU executor over
pyshim.gpu (`gpu_runner`), and the WebAssembly CPU engine (`wasm_runner`: programs recorded by
`wasm_ops` for the module `wasm_module` builds and runs); `loading` opens a GGUF file on any of them;
`profile` times a GPU step by kernel.
May import: pyshim.errors, pyshim.gguf, pyshim.plan, pyshim.models, pyshim.gpu."""
