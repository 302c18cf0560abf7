"""What a model is, from the first bytes of its file: the "will it fit?" answer before the body downloads.

`probe(prefix, file_size)` answers {"need": n} while the prefix ends inside the header (fetch at
least n bytes and call again), then a JSON-able summary: architecture, sizes, tensor types, memory.
"""

from __future__ import annotations

import time

from pyshim.errors import PyshimError
from pyshim.gguf.header import GGUFHeader, NeedMoreBytes, read_header
from pyshim.plan import auto
from pyshim.plan.memory import (cpu_engine_bytes, cpu_engine_fit, cpu_engine_limit, estimate, fits, per_token,
                                 unrunnable_reason, weights_by_type)
from pyshim.plan.settings import AUTO, DEFAULT_BUDGET_BYTES, DEFAULT_CONTEXT


def quant_summary(header: GGUFHeader) -> str:
    """Tensor types by share of the weight bytes, e.g. "Q4_K 62%, Q6_K 20%, F32 1%"."""
    by_type = weights_by_type(header.tensors)
    total = sum(t.nbytes for t in by_type.values()) or 1
    return ", ".join(f"{name} {100 * t.nbytes / total:.0f}%" for name, t in by_type.items())


def probe(prefix, file_size: int | None = None, *, context: int | None = None, kv_type: str = "f32",
          budget_bytes: int | None = None, limits: dict | None = None, judge: bool = False, wasm64: bool = False,
          streamed_layers: int | None = None, expert_slots: int | None = None) -> dict:
    """The header's summary at `context` positions (capped at the training context) with a `kv_type`
    cache. With `judge`, also the verdict `fit` {ok, reasons, need_bytes, budget_bytes}: the model against
    the GPU memory the page may use (`budget_bytes`) and the adapter's `limits` by the executor's own
    layout rules (pyshim.plan.memory.fits); with no adapter (`limits` None), against the WebAssembly CPU
    engine, which then runs models (pyshim.plan.memory.cpu_engine_fit: in 4 GiB, or 16 GiB where `wasm64`,
    the browser running 64-bit WebAssembly memories). `fit.engine` says which.
    `kv_type` "auto": the summary is at what pyshim.plan.auto picks for `budget_bytes` (None: the default
    budget), and `auto` says what it picked and why {context, kv_type, total_bytes, reason} (null: nothing fits).
    `streamed_layers` / `expert_slots`: the streaming the settings name, judged as the load will run it; with
    a named type, none named and an adapter's `limits`, the streaming the load plans where the resident plan
    does not fit (then `auto` says so)."""
    start = time.perf_counter()
    try:
        header = read_header(prefix, file_size=file_size)
    except NeedMoreBytes as exc:
        return {"need": exc.suggested}  # a guess of the whole header: usually one more round
    parse_ms = (time.perf_counter() - start) * 1e3
    summary = {
        "architecture": header.architecture,
        "name": header.get("general.name"),
        "file_type": header.file_type_name,
        "header_bytes": header.header_size,
        "tensor_count": len(header.tensors),
        "parameters": sum(t.n_elements for t in header.tensors),
        "quant": quant_summary(header),
        "parse_ms": parse_ms,
    }
    try:
        from pyshim.gguf.spec import ModelSpec, check_supported

        spec = ModelSpec.from_header(header)
        check_supported(spec)
    except PyshimError as exc:  # readable header, but not a model pyshim runs: say why, keep the facts
        return {**summary, "supported": False, "reason": str(exc),
                **({"fit": _verdict([str(exc)], None, budget_bytes)} if judge else {})}
    binding = None if limits is None else limits.get("max_storage_buffer_binding_size")
    # the CPU engine keeps a cache of the type asked for ("auto": f32) and of the context asked for, else of
    # the default (pyshim.exec.wasm_runner.load_wasm, RunSettings.context_for)
    cpu_context, cpu_kv = min(spec.context_length, context or DEFAULT_CONTEXT), "f32" if kv_type == AUTO else kv_type
    choice, asked_auto = None, kv_type == AUTO
    if asked_auto:      # the context (unless named) and KV type pyshim.plan.auto picks for the budget
        named = None if context is None else min(context, spec.context_length)
        choice = auto.choose(spec, header.tensors, budget_bytes=budget_bytes or DEFAULT_BUDGET_BYTES, context=named,
                             max_binding_bytes=binding, streamed_layers=streamed_layers, expert_slots=expert_slots)
        context, kv_type = (choice.context, choice.kv_type) if choice else (named, auto.RETRIEVAL_SAFE[-1])
        streamed_layers, expert_slots = (choice.streamed_layers, choice.expert_slots) if choice else (None, None)
    elif limits is not None and streamed_layers is None and expert_slots is None:
        # a named type whose resident plan does not fit the budget streams as the load will (auto.resolve)
        choice = auto.stream_named(spec, header.tensors, budget_bytes=budget_bytes or DEFAULT_BUDGET_BYTES,
                                   context=spec.context_length if context is None else min(context, spec.context_length),
                                   kv_type=kv_type, max_binding_bytes=binding, default_context=context is None)
        if choice:
            streamed_layers, expert_slots = choice.streamed_layers, choice.expert_slots
    context = spec.context_length if context is None else min(context, spec.context_length)
    est = estimate(spec, header.tensors, context=context, kv_type=kv_type, expert_slots=expert_slots,
                   streamed_layers=streamed_layers)
    unrunnable = unrunnable_reason(est.unrunnable)
    token = per_token(spec, header.tensors)
    out = {
        **summary,
        "supported": unrunnable is None,
        **({"reason": unrunnable} if unrunnable else {}),
        "context_length": spec.context_length,
        "vocab_size": spec.n_vocab,
        "weight_bytes": est.weight_bytes,
        "experts": {"count": spec.n_experts, "used": spec.n_experts_used} if spec.n_experts else None,
        "active_parameters": token.active_params,     # what a decode token reads (a mixture: its experts only)
        "decode_read_bytes": token.read_bytes,
        "kv_type": kv_type,
        "kv_bytes": est.kv_bytes,
        "activation_bytes": est.activation_bytes,
        "total_bytes": est.total_bytes,
        "context": est.context,
        "expert_slots": est.expert_slots,         # experts streamed from the store, this many a layer on the GPU
        "streamed_layers": est.streamed_layers,   # the last this many layers streamed from the store
        "largest_tensor": {"name": est.largest_tensor.name, "bytes": est.largest_tensor.nbytes},
        "widest_row": {"name": est.widest_row[0], "bytes": est.widest_row[1]},
        **({"auto": choice.as_dict() if choice else None} if asked_auto or choice else {}),
    }
    if judge:
        if limits is None:      # no WebGPU adapter: the WebAssembly CPU engine runs it, in its 4 (or 16) GiB
            out["fit"] = {**_verdict(list(cpu_engine_fit(spec, est, cpu_context, cpu_kv, wasm64=wasm64).reasons),
                                     cpu_engine_bytes(spec, est, cpu_context, cpu_kv), cpu_engine_limit(wasm64)), "engine": "cpu"}
        else:
            reasons = list(fits(est, budget_bytes=budget_bytes, max_binding_bytes=binding,
                                max_buffer_bytes=limits.get("max_buffer_size")).reasons)
            out["fit"] = {**_verdict(reasons, est.total_bytes, budget_bytes), "engine": "gpu"}
    return out


def _verdict(reasons: list[str], need_bytes: int | None, budget_bytes: int | None) -> dict:
    return {"ok": not reasons, "reasons": reasons, "need_bytes": need_bytes, "budget_bytes": budget_bytes}


