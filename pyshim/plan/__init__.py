"""Planning a run before any weight is read: the settings a model runs with (KV cache types, the
arithmetic, the prefill chunk, the context: one definition each), the memory plan with the executor's own
layout rules, and "will it fit?" from a header's first bytes.
May import: pyshim.errors, pyshim.gguf."""
