"""Text in and out: tokenizers built from a GGUF vocabulary (llama.cpp's ids), chat templates (jinja2,
sandboxed), stop strings over streamed text, and compaction of conversations longer than the context.
May import: pyshim.errors, pyshim.gguf."""
