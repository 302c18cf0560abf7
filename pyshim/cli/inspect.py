"""`pyshim inspect MODEL`: what a GGUF holds — its ModelSpec, tensor types, and the memory it needs."""

from __future__ import annotations


def add_arguments(parser):
    parser.add_argument("model", help="a .gguf path or a short name of a model in models/ (smollm2, gemma3, qwen2.5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--context", type=int, default=None, help="context length for the KV estimate (default: the training context)")
    parser.add_argument("--kv-type", default="f32", help="KV cache element type: f32, f16, q8 or q4 (default f32)")
    parser.add_argument("--budget-mb", type=float, default=None,
                        help="GPU memory available (MB): also say which context and KV type fit it best")


def run(args) -> int:
    import dataclasses
    import json

    from pyshim.setup.catalog import resolve_model
    from pyshim.gguf.header import read_header_from_file
    from pyshim.plan import auto
    from pyshim.plan.memory import estimate, per_token
    from pyshim.plan.settings import KV_TYPES
    from pyshim.errors import BadRequestError
    from pyshim.gguf.spec import ModelSpec

    if args.kv_type not in KV_TYPES:
        raise BadRequestError(f"unknown --kv-type {args.kv_type!r}", hint=f"choose one of {', '.join(KV_TYPES)}")
    if args.context is not None and args.context <= 0:
        raise BadRequestError(f"--context must be positive, got {args.context}")
    if args.budget_mb is not None and args.budget_mb <= 0:
        raise BadRequestError(f"--budget-mb must be positive, got {args.budget_mb}")
    path = resolve_model(args.model)
    header = read_header_from_file(path)
    spec = ModelSpec.from_header(header)
    est = estimate(spec, header.tensors, context=args.context, kv_type=args.kv_type)
    token = per_token(spec, header.tensors)

    report = {
        "file": str(path),
        "file_size": header.file_size,
        "gguf_version": header.version,
        "file_type": header.file_type_name,
        "header_bytes": header.header_size,
        "tensor_count": len(header.tensors),
        "spec": dataclasses.asdict(spec),
        "tensor_types": {name: {"count": t.count, "bytes": t.nbytes, "runs": _runnable(name)} for name, t in est.weights_by_type.items()},
        "params": {"total": token.total_params, "active_per_token": token.active_params},
        "memory": {
            "weight_bytes": est.weight_bytes,
            "decode_read_bytes": token.read_bytes,
            "largest_tensor": {"name": est.largest_tensor.name, "type": est.largest_tensor.type.name,
                               "shape": list(est.largest_tensor.shape), "bytes": est.largest_tensor.nbytes},
            "context": est.context,
            "kv_type": est.kv_type,
            "kv_bytes_per_token": est.kv_bytes_per_token,
            "kv_bytes": est.kv_bytes,
            "chunk": est.chunk,
            "activation_bytes": est.activation_bytes,
            "total_bytes": est.total_bytes,
        },
    }
    if args.budget_mb is not None:
        # what kv_type "auto" would pick, starting from --context (default: the training context, capped)
        fit = auto.choose(spec, header.tensors, budget_bytes=int(args.budget_mb * 1e6), context=args.context, fixed_context=False)
        report["best_fit"] = None if fit is None else fit.as_dict()
        if fit is not None and fit.mode != "resident":
            report["best_fit"]["store"] = _store_figures(path, spec, header.tensors, fit)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_text(report, spec))
    return 0


def _store_figures(path, spec, tensors, fit) -> dict:
    """A streamed plan's reads: bytes a decode token takes from the store, this file's read speed here
    (64 MiB read twice, the second pass timed: warm, as a running model's file is) and the decode rate
    that speed alone allows (the GPU's own work comes on top)."""
    import time

    import numpy as np

    from pyshim.gguf.tensors import FileSource
    from pyshim.plan.memory import streamed_bytes_per_token

    per_token = streamed_bytes_per_token(spec, tensors, expert_slots=fit.expert_slots, streamed_layers=fit.streamed_layers)
    source = FileSource(path)
    n = min(64 << 20, source.size // 2)
    for _ in range(2):
        t0 = time.perf_counter()
        np.array(source.read(source.size - n, n))
        seconds = max(time.perf_counter() - t0, 1e-9)
    speed = n / seconds
    # three significant figures: two decimals made a slow read's 0.185 tok/s 0.18 (a CI run caught it)
    return {"bytes_per_token": per_token, "read_bytes_per_s": round(speed),
            "max_tok_s": float(f"{speed / per_token:.3g}") if per_token else None}


def _runnable(type_name: str) -> bool:
    from pyshim.gguf.types import TensorType

    return TensorType[type_name].runnable


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _text(report: dict, spec) -> str:
    mem = report["memory"]
    rope = spec.rope
    lines = [
        f"{report['file']}  ({_mib(report['file_size'])}, GGUF v{report['gguf_version']}, {report['file_type'] or 'unknown mix'}, "
        f"header {_mib(report['header_bytes'])})",
        f"model       {spec.name} [{spec.architecture}]",
        f"layers      {spec.n_layers}   embd {spec.n_embd}   ffn {spec.n_ff}   vocab {spec.n_vocab}   context {spec.context_length}",
        f"attention   {spec.n_heads} heads, {spec.n_kv_heads} kv heads, head dim k/v {spec.head_dim_k}/{spec.head_dim_v}, "
        f"scale {spec.attn_scale:.6g}",
        f"rope        {'neox' if rope.neox else 'normal'}, base {rope.base:g}, dims {rope.dims}, scaling {rope.scaling}"
        + (f" x{rope.factor:g} (from {rope.n_ctx_orig})" if rope.scaling != "none" else ""),
        f"norm eps    {spec.norm_eps:.3g}   activation {spec.ffn_activation}   output {'tied to token_embd' if spec.tied_output else 'separate'}",
    ]
    if spec.sliding_window:
        local = spec.rope_swa
        lines.append(f"sliding     window {spec.sliding_window} on {spec.n_swa_layers}/{spec.n_layers} layers "
                     f"(global: {[i for i, s in enumerate(spec.swa_layers) if not s]}), local rope base {local.base:g}")
        if not spec.uniform_kv:       # gemma4: the sliding layers' heads differ from the global ones'
            il = spec.swa_layers.index(True)
            lines.append(f"            local layers: {spec.kv_heads(il)} kv heads, head dim {spec.head_dims(il)[0]}, "
                         f"rope dims {local.dims}")
    extras = [name for name, on in (("q/k/v bias", spec.qkv_bias), ("q/k norm", spec.qk_norm), ("post norms", spec.post_norms),
                                    ("fused qkv", spec.fused_qkv), ("fused gate/up", spec.fused_gate_up)) if on]
    if spec.embedding_scale != 1.0:
        extras.append(f"embedding scale {spec.embedding_scale:.4g}")
    if spec.final_logit_softcap:
        extras.append(f"final logit softcap {spec.final_logit_softcap:g}")
    if spec.rope_factor_tensors:
        extras.append("rope factors " + ", ".join(spec.rope_factor_tensors))
    if extras:
        lines.append("features    " + ", ".join(extras))
    if spec.n_experts:
        lines.append(f"experts     {spec.n_experts} ({spec.n_experts_used} used per token, {spec.expert_gating}"
                     f"{', renormalized' if spec.expert_norm else ''}), expert ffn {spec.n_ff_expert}"
                     + (f", shared expert ffn {spec.n_ff_shared}" if spec.n_ff_shared else "")
                     + (f", beside a dense ffn {spec.n_ff} with per-expert output scales" if spec.moe_beside_dense else ""))
    params = report["params"]
    lines.append(f"parameters  {params['total'] / 1e6:,.1f} M" + (f", {params['active_per_token'] / 1e6:,.1f} M active per token"
                                                              if spec.n_experts else ""))
    lines.append("")
    lines.append(f"tensors     {report['tensor_count']}")
    for name, t in report["tensor_types"].items():
        lines.append(f"  {name:<8} {t['count']:>5} tensors  {_mib(t['bytes']):>12}" + ("" if t["runs"] else "   (pyshim cannot run this type yet)"))
    lines.append("")
    lines.append(f"weights     {_mib(mem['weight_bytes'])}; a decode token reads {_mib(mem['decode_read_bytes'])} of them")
    big = mem["largest_tensor"]
    lines.append(f"largest     {big['name']} {big['type']} {big['shape']}: {_mib(big['bytes'])}")
    lines.append(f"KV cache    {mem['kv_type']}: {mem['kv_bytes_per_token']:,} bytes/token; {mem['context']} tokens: {_mib(mem['kv_bytes'])}")
    lines.append(f"activations {_mib(mem['activation_bytes'])} (a {mem['chunk']}-token prefill step)")
    lines.append(f"total       {_mib(mem['total_bytes'])} on the GPU")
    if "best_fit" in report:
        fit = report["best_fit"]
        lines.append("best fit    " + ("nothing fits: try a smaller quantization of this model" if fit is None else
                                      (f"experts streamed, {fit['expert_slots']} of {spec.n_experts} a layer on the GPU; "
                                       if fit["expert_slots"] else "") +
                                      (f"layers streamed, {spec.n_layers - fit['streamed_layers']} of {spec.n_layers} on the GPU; "
                                       if fit["streamed_layers"] else "") +
                                      f"context {fit['context']} with a {fit['kv_type']} KV cache: {_mib(fit['total_bytes'])}\n"
                                      f"            ({fit['reason']})"))
        if fit and fit.get("store"):
            st = fit["store"]
            lines.append(f"store       a decode token reads {st['bytes_per_token'] / 1e6:,.0f} MB of it; this file reads at "
                         f"{st['read_bytes_per_s'] / 1e9:.1f} GB/s here (warm), which alone allows {st['max_tok_s']} tok/s")
    return "\n".join(lines)
