"""Every error pyshim raises on purpose: one base class, a subclass per kind of trouble.

Each carries a message a user can act on ("what happened, what to do"); `hint` holds the "what to do"
part separately so UIs can show it on its own line.
"""

from __future__ import annotations


class PyshimError(Exception):
    """Base of all pyshim errors."""

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message if hint is None else f"{message} — {hint}")
        self.message, self.hint = message, hint


class GGUFFormatError(PyshimError):
    """The bytes are not a GGUF file this reader can trust (bad magic, truncated, absurd sizes...)."""


class UnsupportedError(PyshimError):
    """A valid model that uses something pyshim cannot run (architecture, tensor type, feature)."""


class ModelNotFoundError(PyshimError):
    """A model name or path that resolves to no file."""


class SetupError(PyshimError):
    """`pyshim setup` could not vendor or verify something."""


class ChecksumError(SetupError):
    """A downloaded file's SHA-256 differs from the expected one."""


class StoreReadError(PyshimError):
    """A stored model's bytes could not be read while it runs (streamed experts): deleted, evicted, damaged."""


class OutOfMemoryError(PyshimError):
    """The model (or its KV cache) does not fit the device or the budget."""


class KVCacheFullError(OutOfMemoryError):
    """The KV cache's pages are all held by running requests: a step cannot get the pages it writes."""


class ShaderError(PyshimError):
    """A WGSL source failed to preprocess or compile."""


class DeviceLostError(PyshimError):
    """The GPU device went away (driver reset, tab backgrounded, watchdog)."""


class RemoteError(PyshimError):
    """A remote OpenAI-compatible server (load(base_url=...)) did not answer, refused the key, or failed."""


class BadRequestError(PyshimError):
    """An API request with missing or wrong fields; `param` names the field (OpenAI's error `param`)."""

    def __init__(self, message: str, *, hint: str | None = None, param: str | None = None):
        super().__init__(message, hint=hint)
        self.param = param


class ChatTemplateError(BadRequestError):
    """A chat template that does not parse, or that refuses the messages (its raise_exception)."""


class MissingTensorError(GGUFFormatError):
    """The architecture needs a tensor the file does not have."""


class TensorShapeError(GGUFFormatError):
    """A tensor's shape differs from what the model's hyperparameters say it must be."""


class ContextOverflowError(BadRequestError):
    """A prompt (plus what is asked to be generated) longer than the context the model was set up with."""


class GPUUnavailableError(PyshimError):
    """No WebGPU adapter could be had (WebGPU off, blocklisted GPU, or a transient null adapter)."""
