"""pyshim: GGUF language models run by WGSL compute shaders, in the browser (Pyodide) and natively (wgpu)."""

__version__ = "0.1.0"

from pyshim.errors import PyshimError

__all__ = ["PyshimError", "__version__"]
