"""Every pipeline the executor's policies may ask for, as ShaderKeys: what the compile checks in naga
(tests/test_kernels.py) and Tint (tests/test_shaders_tint.py) go through, so no variant first fails on a
visitor's device."""

from __future__ import annotations

from gguf import GGMLQuantizationType as QT

from pyshim.gpu.kernels import (GROUPED_TYPES, I8_ACTIVATIONS, I8_BLOCKS, I8_LANE_TYPES, I8_PAIR_TYPES, I8_TOKENS, I8_TOKEN_TYPES, TOPK,
                                WEIGHT_TYPES, WG, interleave_key, lanes_key, shader_block,
                                argmax_keys, attention_keys, attention_prefill_key, embed_key, glu_key,
                                kv_write_key, matmul_key, matvec_i8_key, matvec_key, moe_key, quantize_key,
                                repack_key, rmsnorm_key, rope_key, router_key)
from pyshim.gpu.policy import (ATTN_LANES_GPU, ATTN_SPLITS_GPU, CPU_I8_ODD_Q6_K_ROWS, CPU_I8_Q6_K_ROW_GROUP, CPU_I8_ROW_GROUP,
                               CPU_I8_LONG_ROWS, CPU_I8_ROWS, CPU_I8_SHORT_K_ROWS, MATMUL_TILE, MATMUL_TILE_CPU, MATVEC_ROWS, NARROW_SIMD_ROWS,
                               TOKEN_ROWS, TOKEN_ROWS_NARROW)
from pyshim.gpu.shaderc import ShaderKey
from pyshim.models.ops import ACTIVATIONS
from pyshim.plan.settings import KV_TYPES


def shader_variants(head_dims: tuple[int, ...] = (64, 128, 256), int8: bool = True, subgroups: bool = True,
                    f16: bool = True) -> list[ShaderKey]:
    """Every pipeline the executor's policies and the roofline benchmark (`stream`) may ask for (attention
    per head size; both rows-per-invocation choices of the barrier-free matvecs): what the
    compile checks in naga and Tint go through (`int8`: with the dot4I8Packed ones; `subgroups`: with the
    ones that need the device's subgroups feature; `f16`: with the shader-f16 ones)."""
    keys = []
    keys += [embed_key(q) for q in WEIGHT_TYPES] + [embed_key(q, grouped=True) for q in GROUPED_TYPES]
    keys += [matvec_key(q, bias=bias, reduce=reduce) for q in WEIGHT_TYPES for bias in (False, True) for reduce in (False, True)]
    if subgroups:
        keys += [matvec_key(q, bias=bias, reduce=True, subgroup=True) for q in WEIGHT_TYPES for bias in (False, True)]
    keys += [matvec_key(q, bias=bias, uniform_x=True, rows=rows) for q in WEIGHT_TYPES for bias in (False, True)
             for rows in (MATVEC_ROWS, NARROW_SIMD_ROWS)]
    keys += [matvec_key(q, rows=NARROW_SIMD_ROWS) for q in WEIGHT_TYPES]
    if int8:
        keys += [quantize_key(fmt, norm) for fmt in I8_BLOCKS for norm in (False, True)]
        keys += [matvec_i8_key(q, bias=bias, uniform_x=ux, rows=rows) for q in I8_ACTIVATIONS for bias in (False, True)
                 for ux in (False, True) for rows in (MATVEC_ROWS, NARROW_SIMD_ROWS)]
        keys += [matvec_i8_key(q, bias=bias, uniform_x=ux, rows=rows, pairs=True) for q in I8_PAIR_TYPES
                 for bias in (False, True) for ux in (False, True) for rows in (MATVEC_ROWS, NARROW_SIMD_ROWS)]
        keys += [matvec_i8_key(q, bias=bias, rows=rows, tokens=I8_TOKENS, uniform_x=ux) for q in I8_TOKEN_TYPES
                 for bias in (False, True) for rows in (TOKEN_ROWS_NARROW, TOKEN_ROWS) for ux in (False, True)]
        # tokens in pairs (4-lane CPU adapters): a prompt's TOKENS, or a batched step's even count of sequences
        keys += [lanes_key()] + [matvec_i8_key(q, bias=bias, rows=rows, tokens=t, lanes=True, uniform_x=ux)
                                 for q in I8_LANE_TYPES for bias in (False, True) for rows in (TOKEN_ROWS_NARROW, TOKEN_ROWS)
                                 for t in range(2, I8_TOKENS + 1, 2) for ux in (False, True)]
        keys += [repack_key(q) for q in GROUPED_TYPES]
    # mixtures of experts: the router, the expert matvecs (one token's or a step's pairs alike), their ends
    keys += [router_key(g, norm, sc) for g in ("softmax", "sigmoid") for norm in (False, True) for sc in (False, True)]
    keys += [moe_key(op) for op in ("EXPERT_SUM", "SIGMOID_GATE")] + [ShaderKey.of("expert_group", WG=WG)]
    keys += [matvec_key(q, reduce=reduce, experts=True) for q in WEIGHT_TYPES for reduce in (False, True)]
    keys += [matvec_key(q, uniform_x=True, rows=rows, experts=True) for q in WEIGHT_TYPES for rows in (MATVEC_ROWS, NARROW_SIMD_ROWS)]
    keys += [matvec_key(q, rows=NARROW_SIMD_ROWS, experts=True) for q in WEIGHT_TYPES]
    if subgroups:
        keys += [matvec_key(q, reduce=True, subgroup=True, experts=True) for q in WEIGHT_TYPES]
    if int8:
        keys += [matvec_i8_key(q, uniform_x=ux, rows=rows, pairs=pairs, experts=True) for q in I8_ACTIVATIONS
                 for ux in (False, True) for rows in (MATVEC_ROWS, NARROW_SIMD_ROWS)
                 for pairs in ((False, True) if q in I8_PAIR_TYPES else (False,))]
        keys += [matvec_i8_key(q, rows=rows, tokens=I8_TOKENS, grouped=True) for q in I8_TOKEN_TYPES
                 for rows in (TOKEN_ROWS_NARROW, TOKEN_ROWS)]
    keys += [rmsnorm_key(residual=r) for r in (False, True)] + [rmsnorm_key(reduce=True, residual=r) for r in (False, True)]
    keys += [kv_write_key(t, rope=rope, neox=neox, k_norm=norm) for t in KV_TYPES for rope, neox, norm in
             [(False, False, False), (True, False, False), (True, True, False), (True, False, True), (True, True, True)]]
    if subgroups:
        keys += [rmsnorm_key(reduce=True, subgroup=True, residual=r) for r in (False, True)]
    keys += [rope_key(neox, norm, scale, rot) for neox in (False, True) for norm in (False, True)
             for scale, rot in ((False, False), (True, False), (True, True))]
    for hd in head_dims:
        for splits in (1, ATTN_SPLITS_GPU):
            keys += [k for cap in (False, True) for t in KV_TYPES for lanes in (0, ATTN_LANES_GPU)
                     for k in attention_keys(hd, hd, cap, splits, t, lanes=lanes) if k is not None and k not in keys]
        keys += [attention_prefill_key(hd, hd, cap, t) for cap in (False, True) for t in KV_TYPES]
        if int8:        # the int8 route's decode attention writing the next matmul's int8 blocks
            keys += [attention_keys(hd, hd, cap, 1, t, quant=fmt)[0] for cap in (False, True) for t in KV_TYPES
                     for fmt in I8_BLOCKS if hd % I8_BLOCKS[fmt][0] == 0]
    keys += [matmul_key(q, bias=bias, tile=tile) for q in WEIGHT_TYPES for bias in (False, True)
             for tile in (MATMUL_TILE, MATMUL_TILE_CPU)]
    keys += [glu_key(act, int8=i) for act in ACTIVATIONS for i in ((False, True) if act == "gelu_tanh" else (False,))]
    # the matvecs with the GLU epilogue (one-token steps of a gated feed-forward)
    keys += [matvec_key(q, glu=act, reduce=reduce) for q in WEIGHT_TYPES for act in ACTIVATIONS for reduce in (False, True)]
    keys += [matvec_key(q, glu=act, uniform_x=True, rows=rows) for q in WEIGHT_TYPES for act in ACTIVATIONS
             for rows in (MATVEC_ROWS, NARROW_SIMD_ROWS)]
    if subgroups:
        keys += [matvec_key(q, glu=act, reduce=True, subgroup=True) for q in WEIGHT_TYPES for act in ACTIVATIONS]
    if int8:
        keys += [matvec_i8_key(q, glu=act, uniform_x=ux, rows=rows, pairs=pairs) for q in I8_ACTIVATIONS for act in ACTIVATIONS
                 for ux in (False, True) for rows in (MATVEC_ROWS, NARROW_SIMD_ROWS)
                 for pairs in ((False, True) if q in I8_PAIR_TYPES else (False,))]
        # lavapipe's wider one-token rows (KernelPolicy.one_token_rows; its narrower ones are MATVEC_ROWS above)
        keys += [matvec_i8_key(QT.Q6_K, uniform_x=True, rows=CPU_I8_ODD_Q6_K_ROWS)]
        keys += [matvec_i8_key(QT.Q4_K, uniform_x=True, rows=CPU_I8_SHORT_K_ROWS, glu=act) for act in (None, *ACTIVATIONS)]
        # and its rows interleaved in groups (KernelPolicy.row_group_for): a group an invocation, the tokens' rows, embed
        for q, g in ((QT.Q4_K, CPU_I8_ROW_GROUP), (QT.Q6_K, CPU_I8_Q6_K_ROW_GROUP)):
            keys += [interleave_key(g, shader_block(q)[1]), embed_key(q, grouped=q in GROUPED_TYPES, row_group=g)]
            keys += [matvec_i8_key(q, bias=bias, uniform_x=ux, rows=g, row_group=g) for bias in (False, True) for ux in (False, True)]
            keys += [matvec_i8_key(q, uniform_x=ux, rows=g, glu=act, row_group=g) for act in ACTIVATIONS for ux in (False, True)]
            keys += [matvec_i8_key(q, bias=bias, rows=rows, tokens=I8_TOKENS, uniform_x=ux, row_group=g)
                     for bias in (False, True) for rows in sorted({TOKEN_ROWS, CPU_I8_ROWS}) for ux in (False, True)]
        # Q6_K's matvecs with their invocations ordered by phase (KernelPolicy.phase_spread): in groups of rows, and
        # in the file's layout (a streamed weight: one token 2 rows an invocation, a prompt 4); one token, and a
        # prompt's tokens
        keys += [matvec_i8_key(QT.Q6_K, bias=bias, uniform_x=ux, rows=rows, row_group=g, spread=True)
                 for rows, g in ((CPU_I8_Q6_K_ROW_GROUP, CPU_I8_Q6_K_ROW_GROUP), (CPU_I8_LONG_ROWS, 1))
                 for bias in (False, True) for ux in (False, True)]
        keys += [matvec_i8_key(QT.Q6_K, bias=bias, rows=rows, tokens=I8_TOKENS, uniform_x=ux, row_group=g, spread=True)
                 for g in (CPU_I8_Q6_K_ROW_GROUP, 1) for rows in sorted({TOKEN_ROWS, CPU_I8_ROWS})
                 for bias in (False, True) for ux in (False, True)]
    keys += [ShaderKey.of("eltwise", WG=WG, **{op: True}) for op in ("OP_ADD", "OP_SCALE", "OP_SOFTCAP", "OP_COPY")]
    keys += [*argmax_keys()] + ([*argmax_keys(subgroup=True)] if subgroups else [])
    keys += [ShaderKey.of("topk", WG=WG, K=TOPK, **{p: True}) for p in ("PASS1", "PASS2")]
    keys += [ShaderKey.of("stream", WG=WG, STRIDED=s, **{e: True for e in el}) for s in (False, True)
             for el in ((), ("I8",), ("I4",), ("I6",)) if int8 or not el]
    if f16:         # the f32 route's arithmetic in halves (real GPUs with shader-f16)
        keys += [matvec_key(q, bias=bias, reduce=True, f16=True) for q in WEIGHT_TYPES for bias in (False, True)]
        keys += [matvec_key(q, reduce=True, glu=act, f16=True) for q in WEIGHT_TYPES for act in ACTIVATIONS]
        keys += [matvec_key(q, reduce=True, experts=True, f16=True) for q in WEIGHT_TYPES]
        if subgroups:
            keys += [matvec_key(q, bias=bias, reduce=True, subgroup=True, f16=True) for q in WEIGHT_TYPES for bias in (False, True)]
            keys += [matvec_key(q, reduce=True, subgroup=True, glu=act, f16=True) for q in WEIGHT_TYPES for act in ACTIVATIONS]
        keys += [matmul_key(q, bias=bias, f16=True) for q in WEIGHT_TYPES for bias in (False, True)]
        keys += [k for hd in head_dims for cap in (False, True) for t in KV_TYPES
                 for lanes in (0, ATTN_LANES_GPU)
                 for k in attention_keys(hd, hd, cap, ATTN_SPLITS_GPU, t, f16=True, lanes=lanes)
                 if k is not None and k not in keys]
        keys += [glu_key(act, f16=True) for act in ACTIVATIONS]
    return keys
