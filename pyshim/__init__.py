"""pyshim: GGUF language models run by WGSL compute shaders, in the browser (Pyodide) and natively (wgpu).

The package is grouped by stage, in the order the data takes; a package imports only from its own and
earlier ones (tests/test_layout.py checks it, and that nothing imports in a cycle):

    errors, paths   what everything shares: the error classes, where the checkout's folders are
    gguf/           header bytes -> GGUFHeader, ModelSpec, tensor table; tensor types and who runs them
    plan/           run settings (KV types, arithmetic, prefill chunk), the memory plan, "will it fit?"
    text/           tokenizers, chat templates, stop strings, conversation compaction
    models/         the ops interface and the one llama-family decoder written against it
    gpu/            device faces (browser, native), kernel policy, programs, weight slots, KV cache, recorder
    exec/           the Runner contract; the NumPy reference, llama.cpp's arithmetic, the GPU runner
    serve/          the one generation loop, sessions, the request queue, request shapes, the Worker's API
    setup/          vendoring the site's runtime, the models pyshim knows, placing them
    cli/            the `pyshim` command
    api             the Python API (OpenAI-shaped), the package's public face
"""

__version__ = "0.1.0"

from pyshim.errors import PyshimError

# The import order of the stages above (tests/test_layout.py holds every module to it).
LAYERS = ("errors", "paths", "gguf", "plan", "text", "models", "gpu", "exec", "serve", "setup", "cli", "api")
# The only modules that import `js` / `pyodide` (the browser's FFI): the GPU face and the API's JS backend.
JS_INTEROP = ("pyshim.gpu.browser", "pyshim.serve.js_engine")

__all__ = ["JS_INTEROP", "LAYERS", "PyshimError", "__version__"]
