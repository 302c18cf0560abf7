"""Automatic settings (`kv_type="auto"`, the default of the CLI, the APIs and the site): the KV cache type
and the context a model gets from the GPU memory it may use, and a sentence that says why.

The rule: the longest context, up to the model's training context (capped at AUTO_CONTEXT_CAP), that
fits the budget with a KV type that keeps retrieval at f32's level — trying, at each length, the types
of least rounding first (RETRIEVAL_SAFE). Which types keep retrieval is what `pyshim bench --needle`
measured (see RETRIEVAL_SAFE). A context the caller names is kept, and only the type is chosen; a type
the caller names is kept, and only the context is chosen.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from pyshim.errors import OutOfMemoryError
from pyshim.gguf.header import TensorInfo
from pyshim.gguf.spec import ModelSpec
from pyshim.plan.memory import (MIN_CONTEXT, MemoryEstimate, estimate, expert_slot_bytes, fits, layer_matrix_bytes,
                                streamed_read_bytes)
from pyshim.plan.settings import AUTO, DEFAULT_BUDGET_BYTES, PREFILL_CHUNK, RunSettings

# Longer contexts are allowed, but asked for by name: a KV cache sized for 128k positions is memory the
# page holds for the whole visit, and a chat rarely reaches 32k.
AUTO_CONTEXT_CAP = 32768
# With experts streamed, memory left after the shared weights is the expert cache, and its size is speed:
# the context is capped lower (a longer one is asked for by name).
STREAMED_CONTEXT_CAP = 4096
# An expert cache holds this many slots per expert a token uses where the budget allows (at the longest
# context that leaves room for them): two tokens' worth, so a prompt runs in steps of two and a token can
# find the last one's experts. Where it does not, one token's worth (steps of one token).
MIN_SLOTS_PER_USED = 2
# KV types auto may pick, least rounding first. On the CPU engine (`pyshim bench --needle`, 3 seeds at 15/50/85%
# depth on SmolLM2 and Qwen2.5-0.5B) q8 with scaled keys found every needle f32 found at 1k and 2k and agrees
# with f32 on 98.5-99% of next tokens; q4 with scaled (and rotated) keys stayed within one needle of f32 at
# every depth at 1k, 2k and 4k (Qwen2.5's 4k in the reference) and agrees on 84-88%, so auto takes it up to
# that length only, and there only where q8 does not fit.
RETRIEVAL_SAFE = ("f32", "f16", "q8", "q4")
SAFE_UP_TO = {"q4": 4096}       # the longest context a type was measured to keep retrieval at (others: any)
# Types that keep retrieval but change next tokens measurably (q4: 84-88% the same as f32's): taken only where
# no other safe type fits, streamed plans included (there the others go smallest first, as cache memory is
# speed; a streamed 7B's ctx-256 cache in q4 saved 25 MB, no layer, and cost its agreement with llama.cpp)
LAST_RESORT = ("q4",)
WHY_TYPES = {"f32": "exact", "f16": "half the memory; found every needle f32 found",
             "q8": "28% of f32's memory; found every needle f32 found",
             "q4": f"16% of f32's memory; within one needle of f32 up to {SAFE_UP_TO['q4']} tokens"}


@dataclass(frozen=True)
class AutoChoice:
    context: int
    kv_type: str
    estimate: MemoryEstimate
    reason: str          # one sentence: what was picked, and why
    expert_slots: int | None = None     # the routed experts streamed into a cache of this many per layer
    streamed_layers: int | None = None  # the last this many layers streamed through rotating buffers

    @property
    def mode(self) -> str:
        if self.expert_slots is not None:
            return "experts streamed"
        return "resident" if self.streamed_layers is None else "layers streamed"

    def as_dict(self) -> dict:
        return {"context": self.context, "kv_type": self.kv_type, "total_bytes": self.estimate.total_bytes,
                "mode": self.mode, "expert_slots": self.expert_slots, "streamed_layers": self.streamed_layers,
                "reason": self.reason}


def _gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB"


def choose(spec: ModelSpec, tensors: Iterable[TensorInfo], *, budget_bytes: int, context: int | None = None,
           fixed_context: bool = True, kv_type: str = AUTO, chunk: int = PREFILL_CHUNK,
           max_binding_bytes: int | None = None, expert_slots: int | None = None,
           streamed_layers: int | None = None, seqs: int = 1, kv_pages: int | None = None,
           default_context: bool = False) -> AutoChoice | None:
    """The automatic context and KV type for `budget_bytes` (None when nothing fits). A named `context` is
    kept (`fixed_context`: the caller asked for it) or is where the halving starts (`pyshim inspect
    --context N --budget-mb M`: the best fit up to N); None: the training context, capped.

    A mixture of experts that fits nowhere resident gets its routed experts streamed (or has them when
    `expert_slots` is named): the context capped at STREAMED_CONTEXT_CAP, and every byte the shared
    weights, KV cache and activations leave given to the expert cache (at least MIN_SLOTS_PER_USED
    slots per expert a token uses), with the smallest retrieval-safe KV type (q4, LAST_RESORT, only where
    no other fits). A dense model streams its
    last layers instead (or when `streamed_layers` is named): as many layers stay resident as the budget
    holds beside two rotating layers' buffers, the context capped and the KV type chosen the same way.
    `seqs`: sequences run together, sharing `kv_pages` KV pages (None: room for each one's whole context).
    `default_context`: the fixed `context` is the default one, not the caller's (a streamed plan's sentence says so)."""
    tensors = tuple(tensors)
    ceiling = min(spec.context_length, AUTO_CONTEXT_CAP) if context is None else context
    limits = dict(budget_bytes=budget_bytes, max_binding_bytes=max_binding_bytes)
    if expert_slots is None and streamed_layers is None:
        lengths = [context] if context is not None and fixed_context else _halvings(ceiling)
        refused: list[str] = []
        for n in lengths:
            for t in kv_types_at(kv_type, n):
                est = estimate(spec, tensors, context=n, kv_type=t, chunk=chunk, seqs=seqs, kv_pages=kv_pages)
                if fits(est, **limits).ok:
                    return AutoChoice(n, t, est, _reason(spec, est, budget_bytes, refused, lengths[0], ceiling, context, kv_type))
                if n == lengths[0]:
                    refused.append(f"{t} would need {_gb(est.total_bytes)}")
    if streamed_layers is not None or (expert_slots is None and not spec.n_experts):
        return _stream_layers(spec, tensors, budget_bytes, context, fixed_context, ceiling, chunk, limits,
                              kv_type, streamed_layers, seqs, kv_pages, default_context)
    streamed_ceiling = min(ceiling, STREAMED_CONTEXT_CAP) if context is None else context
    lengths = [context] if context is not None and fixed_context else _halvings(streamed_ceiling)
    # two tokens' experts a layer where that fits at some context, else one token's (steps of one token);
    # the retrieval-safe types smallest first: memory a cache type saves is expert slots, i.e. speed
    for per_used in (MIN_SLOTS_PER_USED, 1):
        least = min(spec.n_experts - 1, per_used * spec.n_experts_used)
        for n in lengths:
            for t in _smallest_first(kv_types_at(kv_type, n)):
                slots = expert_slots or _slots_that_fit(spec, tensors, n, t, chunk, budget_bytes, seqs, kv_pages)
                if slots < least and not expert_slots:
                    continue
                est = estimate(spec, tensors, context=n, kv_type=t, chunk=chunk, expert_slots=slots, seqs=seqs, kv_pages=kv_pages)
                if fits(est, **limits).ok:
                    return AutoChoice(n, t, est, _streamed_reason(spec, tensors, est, budget_bytes, context, kv_type,
                                                                  expert_slots is not None, default_context), slots)
    return None


def _stream_layers(spec, tensors, budget, context, fixed_context, ceiling, chunk, limits, kv_type, named, seqs=1,
                   kv_pages=None, default_context=False):
    """Layer streaming's plan: the longest context up to STREAMED_CONTEXT_CAP, the smallest retrieval-safe KV
    type (LAST_RESORT's only where no other fits), and the fewest streamed layers that fit (or the `named`
    count)."""
    per_layer = layer_matrix_bytes(tensors)
    if not per_layer:
        return None
    top = min(ceiling, STREAMED_CONTEXT_CAP) if context is None else context
    lengths = [context] if context is not None and fixed_context else _halvings(top)
    for n in lengths:
        for t in _smallest_first(kv_types_at(kv_type, n)):
            if named is not None:
                streamed = named
            else:
                every = estimate(spec, tensors, context=n, kv_type=t, chunk=chunk, streamed_layers=spec.n_layers, seqs=seqs, kv_pages=kv_pages)
                room = budget - every.total_bytes
                if room < 0:
                    continue
                streamed = max(1, spec.n_layers - int(room // max(per_layer.values())))
            est = estimate(spec, tensors, context=n, kv_type=t, chunk=chunk, streamed_layers=streamed, seqs=seqs, kv_pages=kv_pages)
            if fits(est, **limits).ok:
                return AutoChoice(n, t, est, _layers_reason(spec, tensors, est, budget, context, kv_type, named is not None,
                                                            default_context), streamed_layers=streamed)
    return None


def _slots_that_fit(spec, tensors, context: int, kv_type: str, chunk: int, budget: int, seqs: int = 1,
                    kv_pages: int | None = None) -> int:
    """The most expert slots per layer the budget leaves (fewer than the experts: else it is resident)."""
    per_slot = expert_slot_bytes(spec, tensors)
    base = estimate(spec, tensors, context=context, kv_type=kv_type, chunk=chunk, expert_slots=0, seqs=seqs, kv_pages=kv_pages)
    return int(min(spec.n_experts - 1, (budget - base.total_bytes) // max(1, per_slot)))


def resolve(settings: RunSettings, spec: ModelSpec, tensors: Iterable[TensorInfo]) -> tuple[RunSettings, AutoChoice | None]:
    """(`settings` with "auto" replaced by what `choose` picked, the choice — None when nothing was
    automatic). Raises OutOfMemoryError when not even the shortest context fits.

    A KV type the caller names is kept, with its context (named, or the default): where that resident plan
    does not fit the budget and no streaming is named, the model streams as auto would stream it
    (`stream_named`); where nothing fits, the settings stay as asked and the budget check refuses them."""
    budget = settings.budget_bytes or DEFAULT_BUDGET_BYTES
    if settings.kv_type != AUTO:
        if settings.streamed_layers is not None or settings.expert_slots is not None:
            return settings, None
        choice = stream_named(spec, tensors, budget_bytes=budget, context=settings.context_for(spec.context_length),
                              kv_type=settings.kv_type, chunk=settings.prefill_chunk, seqs=settings.parallel,
                              kv_pages=settings.kv_pages, default_context=settings.context is None)
        if choice is None:
            return settings, None
        return replace(settings, expert_slots=choice.expert_slots, streamed_layers=choice.streamed_layers), choice
    choice = choose(spec, tensors, budget_bytes=budget, context=settings.context, chunk=settings.prefill_chunk,
                    expert_slots=settings.expert_slots, streamed_layers=settings.streamed_layers, seqs=settings.parallel,
                    kv_pages=settings.kv_pages)
    if choice is None:
        raise OutOfMemoryError(f"no KV cache type fits this model in the {budget / 1e9:.2f} GB GPU memory budget, "
                               f"not even at {settings.context or MIN_CONTEXT} tokens",
                               hint="raise the budget if the GPU has more memory, or use a smaller quantization")
    return replace(settings, kv_type=choice.kv_type, context=choice.context, expert_slots=choice.expert_slots,
                   streamed_layers=choice.streamed_layers), choice


def stream_named(spec: ModelSpec, tensors: Iterable[TensorInfo], *, budget_bytes: int, context: int, kv_type: str,
                 chunk: int = PREFILL_CHUNK, max_binding_bytes: int | None = None, seqs: int = 1,
                 kv_pages: int | None = None, default_context: bool = False) -> AutoChoice | None:
    """The streamed plan for a named KV type at a fixed `context` (a dense model's last layers, a mixture's
    experts) where the resident plan does not fit the budget: what auto would stream with that cache. None
    where the resident plan fits, or nothing does. `default_context`: the caller named no context (the
    sentence says so)."""
    choice = choose(spec, tensors, budget_bytes=budget_bytes, context=context, kv_type=kv_type, chunk=chunk,
                    max_binding_bytes=max_binding_bytes, seqs=seqs, kv_pages=kv_pages, default_context=default_context)
    return None if choice is None or choice.mode == "resident" else choice


def kv_types_at(kv_type: str, context: int) -> tuple[str, ...]:
    """The KV types to try at `context`: the one asked for, or for auto the retrieval-safe ones measured
    to keep retrieval at that length (least rounding first)."""
    if kv_type != AUTO:
        return (kv_type,)
    return tuple(t for t in RETRIEVAL_SAFE if context <= SAFE_UP_TO.get(t, context))


def _smallest_first(types: tuple[str, ...]) -> tuple[str, ...]:
    """A streamed plan's order: the smallest of the types first, those of LAST_RESORT after all the others."""
    return tuple(t for t in types[::-1] if t not in LAST_RESORT) + tuple(t for t in types[::-1] if t in LAST_RESORT)


def _halvings(ceiling: int) -> list[int]:
    out = [ceiling]
    while out[-1] > MIN_CONTEXT:
        out.append(max(MIN_CONTEXT, out[-1] // 2))
    return out


def _reason(spec, est: MemoryEstimate, budget: int, refused: list[str], first: int, ceiling: int, asked_context,
            asked_type) -> str:
    what = f"{'an' if est.kv_type.startswith('f') else 'a'} {est.kv_type} KV cache ({WHY_TYPES.get(est.kv_type, est.kv_type)}) at {est.context} tokens"
    need = (f"weights {_gb(est.weight_bytes)} + cache {_gb(est.kv_bytes)} + activations {_gb(est.activation_bytes)} "
            f"= {_gb(est.total_bytes)} of the {_gb(budget)} budget")
    if asked_context is not None:
        where = "the context asked for" if est.context == asked_context else f"the longest that fits (of the {asked_context} asked for)"
    elif est.context == ceiling:
        where = ("the model's training context" if ceiling == spec.context_length
                 else f"the training context ({spec.context_length}) capped at {AUTO_CONTEXT_CAP}")
    else:
        where = f"the longest that fits (of the {ceiling} the model allows)"
    why_not = f"; at {first} tokens {', '.join(refused)}" if refused else ""
    if asked_type != AUTO:
        why_not = f"; the {asked_type} cache was asked for" + why_not
    return f"auto picked {what}, {where}: {need}{why_not}."


def _streamed_plan(spec, est: MemoryEstimate, budget: int, asked_context, asked_type, asked: bool, room_for: str,
                   default_context: bool = False):
    """The parts the streamed plans' sentences share: (why it streams, the cache type and context, where the
    context comes from)."""
    file_bytes = sum(t.nbytes for t in est.weights_by_type.values())
    why = "as asked" if asked else f"the weights ({_gb(file_bytes)}) are {file_bytes / budget:.1f}x the {_gb(budget)} budget"
    what = (f"{'an' if est.kv_type.startswith('f') else 'a'} {est.kv_type} KV cache "
            f"({WHY_TYPES.get(est.kv_type, est.kv_type)}) at {est.context} tokens")
    if asked_type != AUTO:
        what += f" (the {asked_type} cache was asked for)"
    if asked_context is not None and est.context == asked_context:
        where = "the default context" if default_context else "the context asked for"
    elif est.context == spec.context_length:
        where = "the model's training context"
    else:
        where = f"the longest up to {STREAMED_CONTEXT_CAP} that leaves the {room_for} room"
    return why, what, where


def _memory_sum(est: MemoryEstimate, resident: str, streamed: str) -> str:
    return (f"{resident} {_gb(est.weight_bytes - est.expert_cache_bytes)} + {streamed} {_gb(est.expert_cache_bytes)} + "
            f"cache {_gb(est.kv_bytes)} + activations {_gb(est.activation_bytes)} = {_gb(est.total_bytes)}")


def _streamed_reason(spec, tensors, est: MemoryEstimate, budget: int, asked_context, asked_type, asked_slots: bool,
                     default_context: bool = False) -> str:
    why, what, where = _streamed_plan(spec, est, budget, asked_context, asked_type, asked_slots, "experts", default_context)
    slots = est.expert_slots
    return (f"auto streams the routed experts, {why}: {slots} of each layer's {spec.n_experts} experts stay on the GPU "
            f"and the rest are read from the store when the router picks them (at most "
            f"{streamed_read_bytes(spec, tensors, slots) / 1e6:.1f} MB a token at random routing); {what}, {where}: "
            f"{_memory_sum(est, 'shared weights', 'expert cache')}.")


def _layers_reason(spec, tensors, est: MemoryEstimate, budget: int, asked_context, asked_type, asked: bool,
                   default_context: bool = False) -> str:
    why, what, where = _streamed_plan(spec, est, budget, asked_context, asked_type, asked, "layers", default_context)
    streamed, per_layer = est.streamed_layers, layer_matrix_bytes(tensors)
    read = sum(per_layer[i] for i in sorted(per_layer)[-streamed:])
    return (f"auto streams layers, {why}: {spec.n_layers - streamed} of {spec.n_layers} layers stay on the GPU and the last "
            f"{streamed} pass through two rotating layers' buffers, read from the store once per step "
            f"({read / 1e6:,.0f} MB a step, a decode token or a prompt chunk); {what}, {where}: "
            f"{_memory_sum(est, 'resident weights', 'layer buffers')}.")
