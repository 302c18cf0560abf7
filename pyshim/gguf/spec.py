"""`ModelSpec`: the hyperparameters of a model, read from the `{arch}.*` keys of its GGUF header.

Defaults and per-architecture rules follow llama.cpp's `load_hparams` and `llama_model_rope_type`, so
that a model pyshim runs means what it means in llama.cpp:
- rope: "normal" (pairs 2i, 2i+1) for llama; NeoX (pairs i, i + dims/2) for qwen2, qwen3, gemma3, phi3.
  Base defaults to 10000, dims to the key head size; scaling type defaults to linear and a factor of 0/1
  means none; YaRN's original context defaults to the training context.
- llama: rope must rotate whole heads (llama.cpp refuses other dimension counts).
- gemma3: when `gemma3.attention.sliding_window` > 0, layers attend locally by the per-layer bool array
  `gemma3.attention.sliding_window_pattern`, or by that key as a period n (layer il is local when
  il % n < n - 1; 0: all local), by default 6 (five local layers, then one global). Local layers use
  rope base `gemma3.rope.freq_base_swa` (default 10000) without context scaling. Input embeddings are
  scaled by sqrt(n_embd); the 27B model (62 layers) scales queries by 1/sqrt(n_embd/n_head).
- gemma4: the per-layer bool array `gemma4.attention.sliding_window_pattern` is required; sliding layers
  have their own head size (`attention.key_length_swa`), rope dims and base (`rope.dimension_count_swa`,
  `rope.freq_base_swa`), and `attention.head_count_kv` may differ per layer; full layers alone use
  `rope_freqs` (ones, then 1e30: only their first pairs turn). Scores are not scaled (1.0), values are
  RMS-normed without a weight, final logits soft-capped at 30 unless the file says otherwise. A mixture's
  layer runs its dense MLP beside the experts. E2B/E4B's shared-KV layers and per-layer embeddings are
  refused by name.
- phi3: a sliding_window key may be present but llama.cpp disables it, and so does pyshim.
- YaRN's beta/ext/attn/log-multiplier keys are read by llama.cpp only for other architectures (DeepSeek,
  Grok...), so for these they keep llama.cpp's defaults whatever the file says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pyshim.errors import GGUFFormatError, UnsupportedError
from pyshim.gguf.header import GGUFHeader, MissingKeyError



@dataclass(frozen=True)
class Architecture:
    neox: bool                   # rope pairing (llama.cpp: LLAMA_ROPE_TYPE_NORM vs NEOX)
    models: str                  # what ships under this name


# The architectures pyshim runs, by GGUF `general.architecture`: the one list (pyshim.models.decoder
# runs them all; everything else is refused by name when the header is read).
ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(neox=False, models="SmolLM2, TinyLlama, Llama 2/3.x, Mistral"),
    "qwen2": Architecture(neox=True, models="Qwen2, Qwen2.5"),
    "qwen3": Architecture(neox=True, models="Qwen3 (dense)"),
    "gemma3": Architecture(neox=True, models="Gemma 3"),
    "phi3": Architecture(neox=True, models="Phi-3, Phi-3.5 (dense)"),
    "qwen2moe": Architecture(neox=True, models="Qwen1.5-MoE, Qwen2-57B-A14B"),
    "qwen3moe": Architecture(neox=True, models="Qwen3-30B-A3B, Qwen3-Coder-30B-A3B"),
    "olmoe": Architecture(neox=True, models="OLMoE-1B-7B"),
    "gemma4": Architecture(neox=True, models="Gemma 4 26B-A4B, 31B"),
}


@dataclass(frozen=True)
class Routing:
    """How an architecture's router weighs its experts, as llama.cpp's graph for it fixes (it reads none
    of the `expert_gating_func` / `expert_weights_norm` / `expert_weights_scale` keys for these)."""
    gating: str                  # "softmax" over all experts, then the top n_used
    norm: bool                   # the chosen weights divided by their sum
    expert_ff_key: str           # where the expert width is: "expert_feed_forward_length" or "feed_forward_length"


# Mixture-of-experts layouts by architecture (`llama` with an expert_count is Mixtral's).
ROUTING: dict[str, Routing] = {
    "llama": Routing("softmax", norm=True, expert_ff_key="feed_forward_length"),
    "qwen2moe": Routing("softmax", norm=False, expert_ff_key="expert_feed_forward_length"),
    "qwen3moe": Routing("softmax", norm=True, expert_ff_key="expert_feed_forward_length"),
    "olmoe": Routing("softmax", norm=False, expert_ff_key="feed_forward_length"),
    "gemma4": Routing("softmax", norm=True, expert_ff_key="expert_feed_forward_length"),
}
GATING_FUNCS = {1: "softmax", 2: "sigmoid", 3: "softmax_weight", 4: "sqrt_softplus"}   # llama.cpp's expert_gating_func

DEFAULT_ROPE_BASE = 10000.0
MAX_LAYERS = 512                 # llama.cpp's LLAMA_MAX_LAYERS: per-layer tables are sized by it
GEMMA3_SWA_PERIOD = 6            # default: every 6th layer attends globally
GEMMA3_LOCAL_ROPE_BASE = 10000.0
GEMMA3_27B_LAYERS = 62
GEMMA4_SOFTCAP = 30.0            # llama.cpp's default final_logit_softcapping when a gemma4 file has none
YARN_BETA_FAST = 32.0            # llama.cpp's defaults (its yarn_* keys are not read for these architectures)
YARN_BETA_SLOW = 1.0
SCALING_TYPES = ("none", "linear", "yarn", "longrope")


@dataclass(frozen=True)
class RopeParams:
    """Rotary embedding of one kind of layer. The first eight fields match `pyshim.models.rope.RopeSpec`."""
    dims: int                    # leading dims of each head that rotate
    base: float
    neox: bool                   # True: pairs (i, i + dims/2); False: pairs (2i, 2i + 1)
    scaling: str = "none"        # one of SCALING_TYPES
    factor: float = 1.0          # context extension factor (llama.cpp's freq_scale = 1/factor)
    n_ctx_orig: int = 0          # context the model was trained with before extension (YaRN)
    attn_factor: float = 1.0     # {arch}.rope.scaling.attn_factor
    yarn_log_mul: float = 0.0    # (llama.cpp reads {arch}.rope.scaling.yarn_log_multiplier for DeepSeek only)
    yarn_ext_factor: float = -1.0  # < 0: llama.cpp chooses (1 for YaRN, else 0)
    yarn_attn_factor: float = 1.0
    yarn_beta_fast: float = YARN_BETA_FAST
    yarn_beta_slow: float = YARN_BETA_SLOW


@dataclass(frozen=True)
class ModelSpec:
    architecture: str
    name: str                    # general.name, or the architecture
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_vocab: int
    context_length: int          # training context
    norm_eps: float              # RMSNorm epsilon
    rope: RopeParams             # global (non-sliding) layers
    rope_swa: RopeParams         # sliding-window layers (== rope when there are none)
    rope_factor_tensors: tuple[str, ...]  # per-dimension frequency factors: rope_freqs (Llama 3.1+), rope_factors_long/short (Phi-3 LongRoPE)
    sliding_window: int          # tokens a local layer sees (0: no sliding window)
    swa_layers: tuple[bool, ...]  # per layer: True = sliding-window (local) attention
    attn_scale: float            # multiplies q.k before softmax
    attn_logit_softcap: float | None   # tanh soft cap of attention scores (gemma2-style); None: none
    final_logit_softcap: float | None  # tanh soft cap of output logits; None: none
    embedding_scale: float       # multiplies token embeddings (gemma: sqrt(n_embd))
    tied_output: bool            # no output.weight: the output projection reuses token_embd
    ffn_activation: str          # "silu" (SwiGLU) or "gelu" (GeGLU, tanh approximation)
    # Weight layout facts the forward pass needs, read off the tensor table.
    qkv_bias: bool               # blk.N.attn_q.bias etc. (qwen2)
    qk_norm: bool                # blk.N.attn_q_norm / attn_k_norm (qwen3, gemma3)
    post_norms: bool             # blk.N.post_attention_norm / post_ffw_norm (gemma3)
    fused_qkv: bool              # blk.N.attn_qkv (phi3)
    fused_gate_up: bool          # no ffn_gate: ffn_up holds [gate; up] (phi3)
    # Mixture of experts (0 experts: a dense model).
    n_experts: int = 0
    n_experts_used: int = 0
    n_ff_expert: int = 0
    n_ff_shared: int = 0         # the shared expert's width (qwen2moe; 0: none)
    expert_gating: str = "softmax"
    expert_norm: bool = False    # the chosen experts' weights renormalized to sum to 1
    fused_gate_up_exps: bool = False  # one ffn_gate_up_exps tensor holding [gate; up] per expert
    qk_norm_full: bool = False   # q/k norms over the whole projection, not per head (olmoe)
    # Gemma 4: sliding and full layers differ in head size and KV heads; values are RMS-normed (no weight)
    # before the cache; the rope factor tensor turns only the full layers' pairs; a mixture's layer runs its
    # dense MLP beside the experts (pyshim.models.decoder), with per-expert output scales
    layer_kv_heads: tuple[int, ...] = ()   # per layer, where they differ (empty: n_kv_heads everywhere)
    head_dim_swa: int = 0        # sliding layers' key and value head size (0: head_dim_k / head_dim_v)
    v_norm: bool = False
    keys_as_values: tuple[bool, ...] = ()  # per layer: no attn_v, its values are its keys' projection (empty: none)
    swa_rope_factors: bool = True  # sliding layers use the rope factor tensor too
    moe_beside_dense: bool = False
    layer_output_scale: bool = False  # blk.N.layer_output_scale: a constant each layer's output is multiplied by
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # rope_finetuned etc.: informative

    def kv_heads(self, layer: int) -> int:
        """Layer `layer`'s key/value heads (Gemma 4's sliding and full layers differ)."""
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.n_kv_heads

    def head_dims(self, layer: int) -> tuple[int, int]:
        """Layer `layer`'s (key, value) head sizes (Gemma 4's sliding layers have smaller heads)."""
        if self.head_dim_swa and self.swa_layers[layer]:
            return self.head_dim_swa, self.head_dim_swa
        return self.head_dim_k, self.head_dim_v

    def kv_row(self, layer: int) -> tuple[int, int]:
        """(key, value) values a position holds in layer `layer`'s cache, all its KV heads together."""
        hk, hv = self.head_dims(layer)
        return self.kv_heads(layer) * hk, self.kv_heads(layer) * hv

    @property
    def uniform_kv(self) -> bool:
        """Every layer has the same KV heads and head sizes (all but Gemma 4)."""
        return len({(self.kv_heads(il), self.head_dims(il)) for il in range(self.n_layers)}) == 1

    @property
    def n_swa_layers(self) -> int:
        return sum(self.swa_layers)

    def rope_for_layer(self, layer: int) -> RopeParams:
        return self.rope_swa if self.swa_layers[layer] else self.rope

    @classmethod
    def from_header(cls, header: GGUFHeader) -> ModelSpec:
        return _spec_from_header(header)


def check_supported(spec: ModelSpec) -> None:
    """Raise UnsupportedError for what pyshim's forward pass (pyshim.models.decoder) does not do; the
    architecture and its expert layout were checked when the spec was read. Known from the header alone,
    so "will it fit?" refuses such a file before its body downloads."""
    for rope in (spec.rope, spec.rope_swa):
        if rope.scaling not in ("none", "linear", "yarn"):
            raise UnsupportedError(f"{spec.architecture}: rope scaling {rope.scaling!r} is not supported",
                                   hint="supported: none, linear, yarn")


def with_rope_override(spec: ModelSpec, scaling: str | None = None, factor: float | None = None,
                       n_ctx_orig: int | None = None) -> ModelSpec:
    """The spec with its global layers' rope scaling replaced, as llama.cpp's `--rope-scaling`,
    `--rope-scale` (freq_scale = 1/factor) and `--yarn-orig-ctx` replace the GGUF's: each one given
    replaces its key, the others keep the file's; "none" never scales. A factor with no type scales a
    file without scaling linearly (llama.cpp's default type). Sliding-window layers keep their own rope
    (llama.cpp applies the override to the global layers only)."""
    if scaling is None and factor is None and n_ctx_orig is None:
        return spec
    rope = spec.rope
    kind = scaling or (rope.scaling if rope.scaling != "none" or factor is None else "linear")
    new_factor = 1.0 if kind == "none" else (rope.factor if factor is None else float(factor))
    rope = replace(rope, scaling=kind, factor=new_factor, n_ctx_orig=rope.n_ctx_orig if n_ctx_orig is None else n_ctx_orig)
    return replace(spec, rope=rope, rope_swa=spec.rope_swa if spec.n_swa_layers else rope)


class _Keys:
    """Typed access to `{arch}.*` keys with messages that name the key."""

    def __init__(self, header: GGUFHeader, arch: str):
        self.header, self.arch = header, arch

    def _get(self, suffix: str):
        key = f"{self.arch}.{suffix}"
        return key, self.header.metadata.get(key)

    def integer(self, suffix: str, default: int | None = None) -> int:
        key, value = self._get(suffix)
        if value is None:
            if default is None:
                raise MissingKeyError(f"the file has no '{key}' key, which a {self.arch} model needs",
                                      hint="the file was written by an old or broken converter: convert the model again")
            return default
        if isinstance(value, np.ndarray) and value.dtype.kind in "iu":   # per-layer array (llama.cpp: get_key_or_arr)
            values = {int(v) for v in value}
            if len(values) != 1:
                raise UnsupportedError(f"'{key}' differs between layers ({sorted(values)}); pyshim needs one value for all layers")
            value = values.pop()
        if isinstance(value, bool) or not isinstance(value, int):
            raise GGUFFormatError(f"'{key}' should be an integer but is {value!r}", hint="the file is damaged: convert it again")
        return value

    def per_layer(self, suffix: str, n_layers: int, default: int) -> tuple[int, ...]:
        """An integer that may be one value or a per-layer array (llama.cpp's get_key_or_arr)."""
        key, value = self._get(suffix)
        if value is None:
            return (default,) * n_layers
        if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
            if len(value) != n_layers:
                raise GGUFFormatError(f"'{key}' has {len(value)} values for {n_layers} layers",
                                      hint="the file is damaged: convert it again")
            return tuple(int(v) for v in value)
        return (self.integer(suffix),) * n_layers

    def number(self, suffix: str, default: float) -> float:
        key, value = self._get(suffix)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GGUFFormatError(f"'{key}' should be a number but is {value!r}", hint="the file is damaged: convert it again")
        return float(value)

    def text(self, suffix: str, default: str) -> str:
        key, value = self._get(suffix)
        if value is None:
            return default
        if not isinstance(value, str):
            raise GGUFFormatError(f"'{key}' should be a string but is {value!r}", hint="the file is damaged: convert it again")
        return value


def _positive(name: str, value: int, arch: str) -> int:
    if value <= 0:
        raise GGUFFormatError(f"{arch}.{name} is {value}; it must be positive", hint="the file is damaged: convert it again")
    return value


def _spec_from_header(header: GGUFHeader) -> ModelSpec:
    arch = header.architecture
    if arch not in ARCHITECTURES:
        raise UnsupportedError(f"pyshim cannot run the '{arch}' architecture",
                               hint=f"supported architectures: {', '.join(ARCHITECTURES)}")
    k = _Keys(header, arch)
    n_layers = _positive("block_count", k.integer("block_count"), arch)
    if n_layers > MAX_LAYERS:
        raise GGUFFormatError(f"{arch}.block_count is {n_layers}; llama.cpp and pyshim allow at most {MAX_LAYERS} layers",
                              hint="the file is damaged: convert it again")
    n_embd = _positive("embedding_length", k.integer("embedding_length"), arch)
    n_heads = _positive("attention.head_count", k.integer("attention.head_count"), arch)
    # Gemma 4's sliding and full layers have their own KV heads (llama.cpp: get_key_or_arr)
    layer_kv = k.per_layer("attention.head_count_kv", n_layers, n_heads) if arch == "gemma4" else ()
    n_kv_heads = layer_kv[0] if layer_kv else _positive("attention.head_count_kv", k.integer("attention.head_count_kv", n_heads), arch)
    for kv in set(layer_kv) | {n_kv_heads}:
        if kv <= 0 or n_heads % kv:
            raise GGUFFormatError(f"{arch}: {n_heads} query heads cannot be shared by {kv} key/value heads",
                                  hint="the file is damaged: convert it again")
    head_dim_k = _positive("attention.key_length", k.integer("attention.key_length", n_embd // n_heads), arch)
    head_dim_v = _positive("attention.value_length", k.integer("attention.value_length", n_embd // n_heads), arch)
    context_length = _positive("context_length", k.integer("context_length"), arch)

    neox = ARCHITECTURES[arch].neox
    rope = _rope(k, head_dim_k, neox, context_length)
    rope_swa = rope
    sliding_window = 0
    swa_layers = (False,) * n_layers
    attn_scale = 1.0 / math.sqrt(head_dim_k)
    final_softcap = None
    embedding_scale = 1.0
    activation = "silu"
    if arch == "llama" and rope.dims != head_dim_k:
        raise GGUFFormatError(f"llama.rope.dimension_count is {rope.dims} but the heads have {head_dim_k} dims; "
                              "llama models rotate whole heads", hint="the file is damaged: convert it again")
    if arch == "gemma3":
        sliding_window = k.integer("attention.sliding_window", 0)
        if sliding_window > 0:
            swa_layers = _swa_pattern(header, arch, n_layers)
            rope_swa = RopeParams(dims=rope.dims, base=k.number("rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE), neox=neox,
                                  n_ctx_orig=rope.n_ctx_orig)
        if n_layers == GEMMA3_27B_LAYERS:
            attn_scale = 1.0 / math.sqrt(n_embd / n_heads)
        final_softcap = k.number("final_logit_softcapping", 0.0) or None
        embedding_scale = math.sqrt(n_embd)
        activation = "gelu"
    gemma4 = {}
    if arch == "gemma4":
        gemma4, rope_swa = _gemma4(header, k, n_layers, head_dim_k, head_dim_v, rope)
        sliding_window = k.integer("attention.sliding_window")
        swa_layers = _swa_pattern(header, arch, n_layers)
        attn_scale = 1.0                 # q and k are RMS-normed per head: no 1/sqrt(head size)
        final_softcap = k.number("final_logit_softcapping", GEMMA4_SOFTCAP) or None
        embedding_scale = math.sqrt(n_embd)
        activation = "gelu"
        # (n_kv_heads: the full layers', as head_dim_k is; kv_heads(il) has each layer's)
        n_kv_heads = next((kv for kv, local in zip(layer_kv, swa_layers) if not local), n_kv_heads)
        layer_kv = layer_kv if len(set(layer_kv)) > 1 else ()

    has = header.has_tensor
    vocab = header.metadata.get("tokenizer.ggml.tokens")
    n_vocab = len(vocab) if isinstance(vocab, (list, np.ndarray)) else k.integer("vocab_size", 0)
    if not n_vocab and has("token_embd.weight") and len(header.tensor("token_embd.weight").shape) == 2:
        n_vocab = header.tensor("token_embd.weight").shape[1]
    rope_factor_tensors = tuple(name for name in ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
                                if has(name))
    n_experts = k.integer("expert_count", 0)
    n_ff = k.integer("feed_forward_length", 0)
    moe = _experts(header, k, n_experts, n_ff) if n_experts else {}
    if arch in ("qwen2moe", "qwen3moe", "olmoe") and not n_experts:
        raise GGUFFormatError(f"{arch}.expert_count is missing or 0, but {arch} is a mixture-of-experts architecture",
                              hint="the file is damaged: convert it again")
    dense_ff = not n_experts or arch == "gemma4"    # (gemma4's mixtures keep a dense MLP beside the experts)
    return ModelSpec(
        architecture=arch,
        name=str(header.metadata.get("general.name") or arch),
        n_layers=n_layers, n_embd=n_embd, n_heads=n_heads, n_kv_heads=n_kv_heads,
        head_dim_k=head_dim_k, head_dim_v=head_dim_v,
        n_ff=_positive("feed_forward_length", n_ff, arch) if dense_ff else n_ff,   # (MoE: the dense width, unused)
        n_vocab=n_vocab,
        context_length=context_length,
        norm_eps=k.number("attention.layer_norm_rms_epsilon", 1e-5),
        rope=rope, rope_swa=rope_swa, rope_factor_tensors=rope_factor_tensors,
        sliding_window=sliding_window if any(swa_layers) else 0,
        swa_layers=swa_layers,
        attn_scale=attn_scale,
        attn_logit_softcap=None,   # none of the supported architectures uses it (llama.cpp: gemma2 only)
        final_logit_softcap=final_softcap,
        embedding_scale=embedding_scale,
        tied_output=not has("output.weight"),
        ffn_activation=activation,
        qkv_bias=has("blk.0.attn_q.bias") or has("blk.0.attn_qkv.bias"),
        qk_norm=has("blk.0.attn_q_norm.weight"),
        post_norms=has("blk.0.post_attention_norm.weight"),
        fused_qkv=has("blk.0.attn_qkv.weight"),
        fused_gate_up=has("blk.0.ffn_up.weight") and not has("blk.0.ffn_gate.weight"),
        qk_norm_full=arch == "olmoe",
        layer_kv_heads=layer_kv,
        **moe,
        **gemma4,
        extra={"rope_finetuned": bool(header.metadata.get(f"{arch}.rope.scaling.finetuned", False))},
    )


def _experts(header: GGUFHeader, k: _Keys, n_experts: int, n_ff: int) -> dict[str, Any]:
    """The mixture-of-experts fields of a spec, refusing by name what pyshim (and llama.cpp's graph for
    the architecture) does not compute: a gating or normalization the file declares against its
    architecture's, a selection bias, per-expert scales, experts stored one tensor each."""
    arch = k.arch
    if arch not in ROUTING:
        raise UnsupportedError(f"{arch}: mixture-of-experts {arch} models are not supported",
                               hint=f"pyshim runs the experts of: {', '.join(ROUTING)}")
    routing = ROUTING[arch]
    n_used = _positive("expert_used_count", k.integer("expert_used_count", 0), arch)
    if n_used > n_experts:
        raise GGUFFormatError(f"{arch}: {n_used} experts used per token, of only {n_experts}",
                              hint="the file is damaged: convert it again")
    gating = k.header.metadata.get(f"{arch}.expert_gating_func")
    if gating is not None and GATING_FUNCS.get(int(gating), f"type {gating}") != routing.gating:
        raise UnsupportedError(f"{arch}: the file's experts are gated by {GATING_FUNCS.get(int(gating), f'type {gating}')}, "
                               f"but {arch} routes by {routing.gating} (as llama.cpp does)",
                               hint="this expert layout is not supported")
    norm = k.header.metadata.get(f"{arch}.expert_weights_norm")
    if norm is not None and bool(norm) != routing.norm:
        raise UnsupportedError(f"{arch}: the file asks for expert weights {'' if norm else 'not '}renormalized, but {arch} "
                               f"{'does' if routing.norm else 'does not'} renormalize them (as llama.cpp does)",
                               hint="this expert layout is not supported")
    scale = k.number("expert_weights_scale", 0.0)
    if scale not in (0.0, 1.0):
        raise UnsupportedError(f"{arch}: expert weights scaled by {scale} are not supported", hint="this expert layout is not supported")
    has = header.has_tensor
    for name, what in (("blk.0.exp_probs_b.bias", "an expert selection bias"),
                       ("blk.0.ffn_down_exps.scale", "per-expert output scales"),
                       ("blk.0.ffn_gate_inp.bias", "a router bias")):
        if has(name) and not (arch == "gemma4" and name == "blk.0.ffn_down_exps.scale"):   # gemma4's are computed
            raise UnsupportedError(f"{arch}: this file's experts have {what} ({name}), which pyshim does not compute",
                                   hint="this expert layout is not supported")
    if has("blk.0.ffn_gate.0.weight") or not (has("blk.0.ffn_up_exps.weight") or has("blk.0.ffn_gate_up_exps.weight")):
        raise UnsupportedError(f"{arch}: the experts are not stored as 3-D ffn_*_exps tensors (an old conversion: one "
                               "tensor per expert), which neither pyshim nor llama.cpp loads",
                               hint="convert the model again with a current llama.cpp")
    if routing.expert_ff_key == "feed_forward_length":
        n_ff_expert = _positive("feed_forward_length", n_ff, arch)
    else:
        n_ff_expert = k.integer("expert_feed_forward_length", n_ff // n_used if n_ff else 0)
        _positive("expert_feed_forward_length", n_ff_expert, arch)
    n_ff_shared = 0
    if has("blk.0.ffn_up_shexp.weight"):
        n_ff_shared = _positive("expert_shared_feed_forward_length", k.integer("expert_shared_feed_forward_length", n_ff), arch)
    return dict(n_experts=n_experts, n_experts_used=n_used, n_ff_expert=n_ff_expert, n_ff_shared=n_ff_shared,
                expert_gating=routing.gating, expert_norm=routing.norm,
                fused_gate_up_exps=has("blk.0.ffn_gate_up_exps.weight"), moe_beside_dense=arch == "gemma4")


def _gemma4(header: GGUFHeader, k: _Keys, n_layers: int, head_dim_k: int, head_dim_v: int,
            rope: RopeParams) -> tuple[dict[str, Any], RopeParams]:
    """Gemma 4's own fields and its sliding layers' rope (llama.cpp's llama_model_gemma4::load_arch_hparams),
    refusing by name what pyshim does not compute yet: E2B/E4B's layers that share another's KV cache and
    their per-layer token embeddings."""
    arch = k.arch
    shared = k.integer("attention.shared_kv_layers", 0)
    if shared:
        raise UnsupportedError(f"gemma4: this model's last {shared} layers reuse earlier layers' KV caches "
                               f"({arch}.attention.shared_kv_layers, Gemma 4 E2B/E4B), which pyshim does not run yet",
                               hint="Gemma 4 26B-A4B and 31B run; for a small model use Gemma 3")
    per_layer = k.integer("embedding_length_per_layer_input", 0)
    if per_layer:
        raise UnsupportedError(f"gemma4: per-layer token embeddings ({arch}.embedding_length_per_layer_input = "
                               f"{per_layer}, Gemma 4 E2B/E4B) are not supported yet",
                               hint="Gemma 4 26B-A4B and 31B run; for a small model use Gemma 3")
    if head_dim_k != head_dim_v:
        raise GGUFFormatError(f"gemma4: key and value heads differ in size ({head_dim_k}/{head_dim_v}), which "
                              "Gemma 4 (and llama.cpp) does not allow", hint="the file is damaged: convert it again")
    swa_k = _positive("attention.key_length_swa", k.integer("attention.key_length_swa"), arch)
    swa_v = _positive("attention.value_length_swa", k.integer("attention.value_length_swa"), arch)
    if swa_k != swa_v:
        raise GGUFFormatError(f"gemma4: sliding layers' key and value heads differ in size ({swa_k}/{swa_v})",
                              hint="the file is damaged: convert it again")
    swa_dims = k.integer("rope.dimension_count_swa", rope.dims)
    if swa_dims > swa_k or swa_dims % 2:
        raise GGUFFormatError(f"{arch}.rope.dimension_count_swa is {swa_dims}; it must be even and at most the sliding "
                              f"layers' head size {swa_k}", hint="the file is damaged: convert it again")
    if not isinstance(header.metadata.get(f"{arch}.attention.sliding_window_pattern"), np.ndarray):
        raise MissingKeyError(f"the file has no per-layer '{arch}.attention.sliding_window_pattern' array, which a "
                              "gemma4 model needs", hint="convert the model again with a current llama.cpp")
    # sliding layers: their own base, no context scaling (as gemma3's)
    rope_swa = RopeParams(dims=swa_dims, base=k.number("rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE), neox=rope.neox,
                          n_ctx_orig=rope.n_ctx_orig)
    has = header.has_tensor
    values = tuple(not has(f"blk.{il}.attn_v.weight") and not has(f"blk.{il}.attn_qkv.weight") for il in range(n_layers))
    return dict(head_dim_swa=swa_k, v_norm=True, keys_as_values=values if any(values) else (), swa_rope_factors=False,
                layer_output_scale=has("blk.0.layer_output_scale.weight")), rope_swa


def _swa_pattern(header: GGUFHeader, arch: str, n_layers: int) -> tuple[bool, ...]:
    """Which layers use the sliding window (llama.cpp's load_swa_pattern with gemma3's default period)."""
    key = f"{arch}.attention.sliding_window_pattern"
    value = header.metadata.get(key, GEMMA3_SWA_PERIOD)
    if isinstance(value, np.ndarray) and value.dtype.kind in "biu":
        # llama.cpp copies the array over all-dense layers: missing entries are global layers
        return tuple(bool(value[il]) if il < len(value) else False for il in range(n_layers))
    if isinstance(value, bool) or not isinstance(value, int):
        raise GGUFFormatError(f"'{key}' should be a period or a per-layer bool array, not {value!r}",
                              hint="the file is damaged: convert it again")
    return tuple(value == 0 or il % value < value - 1 for il in range(n_layers))


def _rope(k: _Keys, head_dim_k: int, neox: bool, context_length: int) -> RopeParams:
    dims = k.integer("rope.dimension_count", head_dim_k)
    if dims > head_dim_k or dims % 2:
        raise GGUFFormatError(f"{k.arch}.rope.dimension_count is {dims}; it must be even and at most the head size {head_dim_k}",
                              hint="the file is damaged: convert it again")
    factor = k.number("rope.scaling.factor", 0.0) or k.number("rope.scale_linear", 0.0)
    scaling = k.text("rope.scaling.type", "linear")
    if scaling not in SCALING_TYPES:
        raise UnsupportedError(f"{k.arch}.rope.scaling.type is '{scaling}'; pyshim knows {', '.join(SCALING_TYPES)}")
    if factor in (0.0, 1.0) and scaling == "linear":   # llama.cpp's default type with no factor: plain rope
        scaling = "none"
    return RopeParams(
        dims=dims,
        base=k.number("rope.freq_base", DEFAULT_ROPE_BASE),
        neox=neox,
        scaling=scaling,
        factor=factor or 1.0,
        n_ctx_orig=k.integer("rope.scaling.original_context_length", context_length),
        attn_factor=k.number("rope.scaling.attn_factor", 1.0),
    )
