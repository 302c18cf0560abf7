"""The kernel catalog: each shader family's params struct, the weight-type defines, and a pipeline cache.

A params struct is a flat run of 4-byte u32/f32 fields, padded to 16 bytes (uniform layout rules are
then trivially satisfied); `PARAMS[family]` mirrors the WGSL `struct Params` field for field (a test
parses the shaders and compares). Bindings follow the house order: inputs, outputs, params last.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Mapping

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

from pyshim.errors import ShaderError, UnsupportedError
from pyshim.gpu.device import GPUDevice
from pyshim.gpu.policy import MATMUL_TILE, MATVEC_ROWS, MATVEC_WG, REDUCE_WG
from pyshim.gpu.shaderc import Preprocessor, ShaderKey
from pyshim.plan.memory import GROUPED_TYPES as GROUPED_TENSOR_TYPES
from pyshim.plan.memory import group_bytes
from pyshim.plan.settings import KV_TYPES

WG = 64                 # invocations per workgroup for every barrier-free kernel
ARGMAX_CHUNK = 256      # logits scanned per invocation in argmax's first pass
# Logits per workgroup in the first pass of the subgroup argmax (argmax.wgsl SUBGROUP, GPUs with subgroups):
# 16 per invocation, and Gemma's 262k vocabulary leaves 256 partials for the one-workgroup second pass.
ARGMAX_CHUNK_SUBGROUP = 1024
TOPK = 64               # candidates topk.wgsl keeps: top-k sampling on the GPU for any k up to this
TOPK_CHUNK = 2048       # logits per invocation in its first pass (Gemma's 262k vocabulary: 128 lists to merge)
# The workgroup-reduction matvec (real GPUs): rows per workgroup (its invocations: policy.REDUCE_WG, or a
# subgroup's width). Untuned (no GPU was at hand): k-quant rows of few blocks leave invocations idle.
REDUCE_ROWS = 2
# The subgroup variant of it (matvec.wgsl SUBGROUP) keeps REDUCE_WG and REDUCE_ROWS, so on a GPU the two
# differ only in how the WG partials are summed (pyshim.gpu.policy says where each runs).
# Invocations per workgroup of the one-workgroup-per-row rmsnorm (real GPUs; untuned): d = 576-4096 is
# then 2-16 vec4 loads per invocation instead of d/4 in one invocation.
RMSNORM_WG = 64
MAX_GROUPS = 65535      # WebGPU's default maxComputeWorkgroupsPerDimension
# The uniform-x matvec binds x as array<vec4<f32>, UNIFORM_X_VEC4>: 64 KiB, WebGPU's guaranteed
# maxUniformBufferBindingSize; activation buffers are at least this big so any of them can be bound so.
UNIFORM_X_VEC4 = 4096
UNIFORM_X_BYTES = UNIFORM_X_VEC4 * 16
# Causal prefill attention tiled over the keys (attention_prefill.wgsl): the K and V tiles in workgroup
# memory take at most this many bytes (WebGPU's guaranteed maxComputeWorkgroupStorageSize), and at most
# ATTN_TILE_KEYS keys (each invocation keeps one score per key of a tile in registers).
ATTN_TILE_BYTES = 16384
ATTN_TILE_KEYS = 32

# Weight type -> (define, elements per shader block, bytes per shader block). F32/F16 "blocks" are
# 8 elements: what one call of block_apply reads (two vec4s).
WEIGHT_TYPES: dict[QT, tuple[str, int, int]] = {
    QT.F32: ("W_F32", 8, 32),
    QT.F16: ("W_F16", 8, 16),
    QT.Q4_0: ("W_Q4_0", *GGML_QUANT_SIZES[QT.Q4_0]),
    QT.Q4_1: ("W_Q4_1", *GGML_QUANT_SIZES[QT.Q4_1]),
    QT.Q5_0: ("W_Q5_0", *GGML_QUANT_SIZES[QT.Q5_0]),
    QT.Q8_0: ("W_Q8_0", *GGML_QUANT_SIZES[QT.Q8_0]),
    QT.Q4_K: ("W_Q4_K", *GGML_QUANT_SIZES[QT.Q4_K]),
    QT.Q5_K: ("W_Q5_K", *GGML_QUANT_SIZES[QT.Q5_K]),
    QT.Q6_K: ("W_Q6_K", *GGML_QUANT_SIZES[QT.Q6_K]),
}


# The int8 route (matvec_i8.wgsl): activations quantized once per matmul input (quantize.wgsl) the way
# llama.cpp's CPU backend does, then dot4I8Packed against the weights' integer parts. Weight type ->
# activation format: "q8_0" (blocks of 32 with f16 scale, Q8_1's f16 sum and the int sum) or "q8_k"
# (blocks of 256, f32 scale, sums of 16). F32/F16 weights keep the f32 kernels.
I8_ACTIVATIONS: dict[QT, str] = {QT.Q4_0: "q8_0", QT.Q4_1: "q8_0", QT.Q5_0: "q8_0", QT.Q8_0: "q8_0",
                                 QT.Q4_K: "q8_k", QT.Q5_K: "q8_k", QT.Q6_K: "q8_k"}
# The int8 route's Q4_0, Q8_0 and Q6_K weights are rearranged on the GPU at load (repack.wgsl) into groups of
# REPACK_GROUP_BLOCKS blocks (each field of the 8 blocks together; pyshim.plan.memory holds the size, since
# the splitting rule counts it) read as vec4s, and matvec_i8 and embed read them only so: on CPU adapters
# these matvecs are bound by load instructions, the file's straddling words vs whole vec4s grouped
# (SwiftShader Q8_0 32768x640, one token: 57-61 ms file layout, 27-28 ms grouped; lavapipe Q6_K 2048x4096:
# 1.7-2.4 G elements/s file layout, 3.3-4.7 grouped). Type -> its define. (The f32 kernels read the file layout.)
GROUPED_TYPES: dict[QT, str] = {QT.Q4_0: "W_Q4_0G", QT.Q8_0: "W_Q8_0G", QT.Q6_K: "W_Q6_KG"}
assert set(GROUPED_TYPES) == set(GROUPED_TENSOR_TYPES)
# Types whose blocks are whole vec4s (144 and 176 bytes): their int8 decoders read the file layout 16 bytes
# a load (W_VEC4), as the grouped types do after the repack; every offset a matvec_i8 binding takes is
# whole rows of them.
I8_VEC4_TYPES = frozenset({QT.Q4_K, QT.Q5_K})
# Types the int8 route may interleave by rows at load (interleave.wgsl, KernelPolicy.row_group_for; matvec_i8
# and embed read them so; Q6_K's before repack.wgsl groups its blocks).
ROW_GROUP_TYPES = frozenset({QT.Q4_K, QT.Q6_K})
# Types whose int8 decoders unpack a block once for several tokens (matvec_i8's TOKENS: 32-value blocks,
# and the K-quants' blocks in pieces of 32, include/pieces_i8.wgsl),
# and the rows x tokens an invocation takes in steps of several tokens (prefill). SwiftShader, 64 tokens
# (playwright/bench_prefill_kernels.py), ms against one token and 4 rows per invocation: Q4_1 1536x576 101
# -> 60 (rows x tokens 8x8; 4x8 72, 8x16 56, 16x8 55), Q5_0 2048x640 172 -> 92 (4x8 108, 8x16 84, 16x8 84);
# larger tiles waste more on short prompts and narrow matrices. lavapipe, Gemma 3 64-token prefill: 2060 ->
# 1550-1640 ms for 4x4, 8x2 and 8x8 alike; the rows are the policy's (pyshim.gpu.policy TOKEN_ROWS_*).
I8_TOKEN_TYPES = frozenset({QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K})
I8_TOKENS = 8
# Types whose 2-byte-offset blocks (22 bytes) matvec_i8 can take two at a time (PAIRS) when a row
# has an even block count: every row then starts word-aligned and the shifts become constants.
I8_PAIR_TYPES = frozenset({QT.Q5_0})      # (Q4_0 is grouped instead, as Q8_0)
# Types whose TOKENS steps can take tokens in pairs (LANES: lanes.wgsl's words, one multiply for two tokens):
# the unpacked quants must be at most 15 in magnitude, so that 16 products with int8 activations sum under 2^15.
# SwiftShader (its Vulkan driver natively, 2-core Zen 4), 4-bit 8192x1536, 4 rows an invocation, best of 5:
# 4 tokens by dot4I8Packed 33-40 ms, in two pairs 21-26 ms, one token 11-14 ms (building the pairs in the
# matvec itself 34 ms: the words are cheaper loaded than made). lavapipe: 5.2-6.1 against 4.5-5.3, within noise.
I8_LANE_TYPES = frozenset({QT.Q4_0, QT.Q4_1, QT.Q4_K})     # (Q4_K: each piece of 32, include/pieces_i8.wgsl)
# activation format -> (elements per block, f32 metadata words per block), as quantize.wgsl lays them out
I8_BLOCKS = {"q8_0": (32, 4), "q8_k": (256, 20)}
def xq_row_words(k: int, fmt: str) -> int:
    """u32 words of one token's quantized row: k/4 words of int8 values, then the blocks' metadata."""
    per, meta = I8_BLOCKS[fmt]
    return k // 4 + k // per * meta


def lanes_words(n: int, k: int, row_words: int) -> tuple[int, int]:
    """Where lanes.wgsl puts a step's token pairs in its quantized rows' buffer, and the words of it all:
    (pair_off, total words), the pairs after the n rows, each k words."""
    pair_off = (n * row_words + 3) // 4 * 4
    return pair_off, pair_off + (n + 1) // 2 * k


def lanes_key() -> ShaderKey:
    return ShaderKey.of("lanes", WG=WG)


def quantize_key(fmt: str, norm: bool = False) -> ShaderKey:
    """quantize.wgsl for an activation format; `norm`: the row RMS-normed first (the norm before a matmul)."""
    return ShaderKey.of("quantize", WG=WG, Q8_K=fmt == "q8_k", NORM=norm)


def i8_pairs(qtype: QT, k: int) -> bool:
    """Whether matvec_i8 can read this weight's blocks two at a time (rows of an even block count), where
    the policy asks for it (KernelPolicy.i8_pairs). Same run, Gemma 3 decode, ms per token: SwiftShader
    1150-1349 with pairs vs 1434-1463 without; lavapipe the other way (4.2-4.6 tok/s with, 4.9-5.4
    without), so only on 4-lane CPU adapters."""
    return QT(qtype) in I8_PAIR_TYPES and k % 64 == 0


def act_defines(act: str, int8: bool = False) -> dict[str, bool]:
    """include/act.wgsl's defines for a gated feed-forward's activation (pyshim.models.ops.ACTIVATIONS):
    the int8 route follows llama.cpp's CPU arithmetic, its f16 GELU table included."""
    gelu = act == "gelu_tanh"
    return {"ACT_SILU": act == "silu", "ACT_GELU": gelu, "GELU_F16": gelu and int8}


def glu_key(act: str, int8: bool = False, f16: bool = False) -> ShaderKey:
    return ShaderKey.of("glu", WG=WG, **act_defines(act, int8), F16=f16)


def matvec_i8_key(qtype: QT, *, bias: bool = False, uniform_x: bool = False, rows: int = MATVEC_ROWS,
                  pairs: bool = False, tokens: int | None = None, experts: bool = False, grouped: bool = False,
                  glu: str | None = None, lanes: bool = False, wg: int = MATVEC_WG, row_group: int = 1,
                  spread: bool = False) -> ShaderKey:
    """The barrier-free int8 matvec (`uniform_x`: the quantized row bound as a 64 KiB uniform; `pairs`: see
    i8_pairs; `tokens`: that many tokens per invocation, I8_TOKEN_TYPES only, with `lanes` (an even number of
    tokens, I8_LANE_TYPES, not experts) in pairs from lanes.wgsl's words; `glu`: gate and up rows in one
    weight, act(gate) * up stored, `rows` output rows an invocation; `wg` invocations a workgroup:
    policy.matvec_wg; `row_group`: the weight's rows interleaved in groups of that many, interleave.wgsl;
    `spread`: the workgroup's even invocations' rows in its first half, KernelPolicy.phase_spread).
    GROUPED_TYPES are read in repack.wgsl's layout: the int8 route always rearranges them."""
    defines = weight_defines(qtype, QT(qtype) in GROUPED_TYPES) | ({"W_VEC4": True} if QT(qtype) in I8_VEC4_TYPES else {})
    if row_group > 1 and (QT(qtype) not in ROW_GROUP_TYPES or experts or grouped):
        raise ValueError(f"no row groups for {QT(qtype).name} with experts={experts or grouped}")
    if lanes and (not tokens or tokens % 2 or QT(qtype) not in I8_LANE_TYPES or experts or grouped):
        raise ValueError(f"no token pairs for {QT(qtype).name} with tokens={tokens}, experts={experts or grouped}")
    if spread and wg % 2:
        raise ValueError(f"spread needs an even workgroup, not {wg}")
    return ShaderKey.of("matvec_i8", **defines, WG=wg,
                        ROWS=2 * rows if glu else rows, BIAS=bias, UNIFORM_X=uniform_x,
                        X_VEC4=UNIFORM_X_VEC4 if uniform_x else None, PAIRS=pairs, TOKENS=tokens,
                        EXPERTS=experts or grouped, GROUPED=grouped, GLU=bool(glu), **(act_defines(glu, True) if glu else {}),
                        LANES=tokens // 2 if lanes else None, ROW_GROUP=row_group if row_group > 1 else None,
                        SPREAD=spread)


def router_key(gating: str, norm: bool, scales: bool = False) -> ShaderKey:    # scales: gemma4's per-expert ones
    return ShaderKey.of("router", WG=WG, GATING_SOFTMAX=gating == "softmax", GATING_SIGMOID=gating == "sigmoid", NORM=norm, SCALES=scales)


def moe_key(op: str) -> ShaderKey:
    """moe.wgsl's EXPERT_SUM or SIGMOID_GATE."""
    return ShaderKey.of("moe", WG=WG, **{op: True})


def matvec_i8_grid(m: int, n: int, rows: int = MATVEC_ROWS, tokens: int = 1, wg: int = MATVEC_WG) -> tuple[int, int, int]:
    return groups(m, wg * rows), groups(n, tokens), 1


def embed_key(qtype: QT, grouped: bool = False, row_group: int = 1) -> ShaderKey:
    return ShaderKey.of("embed", **weight_defines(qtype, grouped), WG=WG, ROW_GROUP=row_group if row_group > 1 else None)


def weight_defines(qtype: QT, grouped: bool = False) -> dict[str, bool]:
    """The defines naming a weight's decoder: its type's, or with `grouped` the repacked layout's (bound
    as vec4s, W_VEC4)."""
    if grouped:
        return {GROUPED_TYPES[QT(qtype)]: True, "W_VEC4": True}
    return {weight_define(qtype): True}


def repack_bytes(rows: int, row_bytes: int, qtype: QT) -> int:
    """Bytes of a part of `rows` rows of a grouped type once grouped: whole groups (the last one zero-padded)."""
    return -(-rows * row_bytes // group_bytes(qtype)) * group_bytes(qtype)


def repack_groups(rows: int, row_bytes: int, qtype: QT) -> int:
    """repack.wgsl's groups in such a part (its `groups` param)."""
    return repack_bytes(rows, row_bytes, qtype) // group_bytes(qtype)


def repack_key(qtype: QT) -> ShaderKey:
    return ShaderKey.of("repack", WG=WG, Q4_0=QT(qtype) == QT.Q4_0, Q6_K=QT(qtype) == QT.Q6_K)


def interleave_key(row_group: int, block_bytes: int) -> ShaderKey:
    """interleave.wgsl for blocks of `block_bytes` (even; 2 past a word: two blocks an invocation)."""
    return ShaderKey.of("interleave", WG=WG, ROW_GROUP=row_group, PAIRS=block_bytes % 4 == 2)


def repack_grid(n_groups: int) -> tuple[int, int, int]:
    """Workgroups for repack.wgsl (one invocation per group), wrapped into y past MAX_GROUPS."""
    wgs = groups(n_groups)
    x = min(wgs, MAX_GROUPS)
    return x, -(-wgs // x), 1


def weight_define(qtype: QT) -> str:
    try:
        return WEIGHT_TYPES[QT(qtype)][0]
    except KeyError:
        raise UnsupportedError(f"no GPU kernel for tensor type {QT(qtype).name}",
                               hint="supported: " + ", ".join(t.name for t in WEIGHT_TYPES)) from None


def shader_block(qtype: QT) -> tuple[int, int]:
    """(elements, bytes) of one block_apply call for this type: k must be a multiple of the first."""
    return WEIGHT_TYPES[QT(qtype)][1:]


@dataclass(frozen=True)
class ParamsLayout:
    fields: tuple[tuple[str, str], ...]     # (name, "u32" | "f32"), in WGSL order

    @property
    def nbytes(self) -> int:
        return (len(self.fields) * 4 + 15) // 16 * 16

    def pack(self, **values) -> np.ndarray:
        """The struct as uint32 words; unnamed `_pad*` fields are 0, any other missing field is an error."""
        words = np.zeros(self.nbytes // 4, dtype=np.uint32)
        names = {n for n, _ in self.fields}
        unknown = set(values) - names
        if unknown:
            raise ValueError(f"unknown params fields {sorted(unknown)}")
        for i, (name, kind) in enumerate(self.fields):
            if name not in values:
                if name.startswith("_pad") or name in OPTIONAL_PARAMS:
                    continue
                raise ValueError(f"params field {name!r} missing")
            v = values[name]
            words[i] = np.float32(v).view(np.uint32) if kind == "f32" else np.uint32(int(v))
        return words


# Params fields left 0 unless given: the matvecs' expert fields (read only with EXPERTS), their bias stride
# (0: a bias shared by every token)
OPTIONAL_PARAMS = frozenset({"expert_bytes", "pair_div", "e_first", "e_count", "e_tiles", "n_experts", "bias_stride", "r_off",
                             "eps", "head_dim", "dims", "mscale", "row_words", "scale_off", "rot", "rnorm"})
# Most experts the router kernel selects from (router.wgsl MAX_EXPERTS: its bitmask of taken experts)
MAX_EXPERTS = 256


def _layout(spec: str) -> ParamsLayout:
    """'m:u32 k:u32 eps:f32' -> ParamsLayout."""
    return ParamsLayout(tuple(tuple(item.split(":")) for item in spec.split()))


PARAMS: dict[str, ParamsLayout] = {
    "matvec": _layout("m:u32 k:u32 n:u32 row_bytes:u32 w_off:u32 x_off:u32 y_off:u32 bias_off:u32 bias_stride:u32 "
                      "y_stride:u32 expert_bytes:u32 pair_div:u32 e_first:u32 e_count:u32 _pad0:u32 _pad1:u32"),
    "matvec_i8": _layout("m:u32 k:u32 n:u32 row_bytes:u32 w_off:u32 x_off:u32 y_off:u32 bias_off:u32 y_stride:u32 "
                         "bias_stride:u32 x_row_words:u32 expert_bytes:u32 pair_div:u32 e_first:u32 e_count:u32 e_tiles:u32 "
                         "n_experts:u32 pair_off:u32 _pad1:u32 _pad2:u32"),
    "expert_group": _layout("pairs:u32 experts:u32 _pad0:u32 _pad1:u32"),
    "router": _layout("n:u32 experts:u32 used:u32 logits_off:u32 scale:f32 ids_off:u32 _pad1:u32 _pad2:u32"),
    "moe": _layout("n:u32 width:u32 used:u32 x_off:u32 g_off:u32 y_off:u32 _pad0:u32 _pad1:u32"),
    "quantize": _layout("k:u32 n:u32 x_off:u32 x_stride:u32 q_off:u32 row_words:u32 eps:f32 _pad1:u32"),
    "lanes": _layout("k:u32 n:u32 row_words:u32 pair_off:u32"),
    "embed": _layout("d:u32 n:u32 row_bytes:u32 w_off:u32 tok_off:u32 out_off:u32 row0:u32 rows:u32"),
    "rmsnorm": _layout("rows:u32 d:u32 eps:f32 x_off:u32 y_off:u32 w_off:u32 r_off:u32 _pad1:u32"),
    "rope": _layout("n:u32 heads:u32 head_dim:u32 dims:u32 mscale:f32 x_off:u32 y_off:u32 pos_off:u32 eps:f32 "
                    "scale_off:u32 rot:u32 rnorm:f32"),
    "attention": _layout("n:u32 heads:u32 kv_heads:u32 table_len:u32 window:u32 scale:f32 softcap:f32 pos_off:u32 "
                         "q_off:u32 out_off:u32 row_words:u32 seq_off:u32 table_off:u32 _pad0:u32 _pad1:u32 _pad2:u32"),
    "kv_write": _layout("n:u32 k_row:u32 v_row:u32 table_len:u32 pos_off:u32 k_off:u32 v_off:u32 head_dim:u32 dims:u32 "
                        "mscale:f32 eps:f32 seq_off:u32 table_off:u32 _pad0:u32 _pad1:u32 _pad2:u32"),
    "glu": _layout("n:u32 f:u32 gate_off:u32 gate_stride:u32 up_off:u32 up_stride:u32 out_off:u32 _pad0:u32"),
    "eltwise": _layout("n:u32 width:u32 a_off:u32 a_stride:u32 b_off:u32 b_stride:u32 y_off:u32 s:f32"),
    "argmax": _layout("len:u32 chunk:u32 x_off:u32 _pad0:u32"),
    "topk": _layout("len:u32 chunk:u32 x_off:u32 _pad0:u32"),
    "stream": _layout("n4:u32 per_thread:u32 _pad0:u32 _pad1:u32"),
    "repack": _layout("groups:u32 first:u32 _pad1:u32 _pad2:u32"),
    "interleave": _layout("blocks:u32 row_blocks:u32 block_bytes:u32 dst_off:u32"),
}
# the tiled prefill kernels share their one-token twins' params (shaders/include/*_params.wgsl)
PARAMS["matmul"] = PARAMS["matvec"]
PARAMS["attention_prefill"] = PARAMS["attention"]


def groups(n: int, per: int = WG) -> int:
    return max(1, -(-int(n) // per))


def matvec_key(qtype: QT, *, bias: bool = False, reduce: bool = False, uniform_x: bool = False,
               rows: int = MATVEC_ROWS, subgroup: bool = False, experts: bool = False, glu: str | None = None,
               f16: bool = False, reduce_wg: int = REDUCE_WG, wg: int = MATVEC_WG) -> ShaderKey:
    """The barrier-free matvec (CPU adapters; `uniform_x`: x bound as a 64 KiB uniform) or the
    workgroup-reduction one (`reduce`, real GPUs; with `subgroup`, summed by subgroupAdd); `experts`:
    rows of (token, slot) pairs through the experts the router chose (no bias); `glu`: gate and up rows in
    one weight, act(gate) * up stored (`rows` output rows an invocation or workgroup); `f16`: products and
    block sums in halves (shader-f16); `reduce_wg`: invocations of a reduction workgroup
    (pyshim.gpu.policy.reduce_wg), `wg` of a barrier-free one (policy.matvec_wg)."""
    glu_defines = {"GLU": True, **act_defines(glu)} if glu else {}
    glu_defines["F16"] = f16
    if reduce:
        return ShaderKey.of("matvec", **{weight_define(qtype): True}, WG=reduce_wg, ROWS=REDUCE_ROWS * (2 if glu else 1),
                            REDUCE=True, BIAS=bias, SUBGROUP=subgroup, EXPERTS=experts, **glu_defines)
    return ShaderKey.of("matvec", **{weight_define(qtype): True}, WG=wg, ROWS=2 * rows if glu else rows, BIAS=bias,
                        UNIFORM_X=uniform_x, X_VEC4=UNIFORM_X_VEC4 if uniform_x else None, EXPERTS=experts, **glu_defines)


# The KV cache types the kernels store (include/kv.wgsl: f16 as packed halves, q8 and q4 as int8 / 4-bit
# blocks of 32 with an f32 scale, all on any adapter) are pyshim.plan.settings.KV_TYPES.
KV_DEFINES = {"f32": None, "f16": "KV_F16", "q8": "KV_Q8", "q4": "KV_Q4"}


def kv_defines(kv_type: str) -> dict[str, bool]:
    """The define that selects the cache's storage in include/kv.wgsl (none for f32)."""
    name = KV_DEFINES[kv_type]
    return {name: True} if name else {}


def kv_write_key(kv_type: str = "f32", *, rope: bool = False, neox: bool = False, k_norm: bool = False) -> ShaderKey:
    """kv_write for a cache type; `rope`: the keys are roped on the way in (`neox` pairs), after their head
    norm with `k_norm`."""
    return ShaderKey.of("kv_write", WG=WG, **kv_defines(kv_type), ROPE=rope, NEOX=rope and neox, K_NORM=rope and k_norm)


def kv_write_grid(kv_type: str, k_row: int, v_row: int, n: int) -> tuple[int, int, int]:
    """One invocation per vec4 of the longer row and token, or per block of 32 for the block types."""
    per = KV_TYPES[kv_type].block if KV_TYPES[kv_type].block > 1 else 4
    return groups(max(k_row, v_row) // per), n, 1


def rope_key(neox: bool = False, norm: bool = False, scale: bool = False, rotate: bool = False) -> ShaderKey:
    """rope.wgsl with NEOX pairs or not; `norm`: each head RMS-normed first; `scale`: the rotated heads
    multiplied by a table of scales (a q4 or q8 cache's key scales, pyshim.models.key_scales); `rotate`:
    then turned by a Hadamard matrix (a q4 cache's), a workgroup a head."""
    return ShaderKey.of("rope", WG=WG, NEOX=neox, NORM=norm, SCALE=scale, ROTATE=rotate)


def attention_keys(head_dim: int, head_dim_v: int, softcap: bool, splits: int,
                   kv_type: str = "f32", f16: bool = False, quant: str | None = None,
                   lanes: int = 0) -> tuple[ShaderKey, ShaderKey | None]:
    """The attention pass (per head, token and split of the keys) and, with splits > 1, the combine pass;
    `f16`: q·k products in halves; `quant` (one split): the output as that int8 activation format's blocks;
    `lanes`: a workgroup of that many invocations per (head, token, split) (real GPUs; no quant), whose
    grid is attention_grid's."""
    common = dict(WG=WG, HD4=head_dim // 4, HDV4=head_dim_v // 4, SPLITS=splits)
    combine = ShaderKey.of("attention", COMBINE=True, **common) if splits > 1 else None
    if lanes:
        return ShaderKey.of("attention", SOFTCAP=softcap, **kv_defines(kv_type), **common, F16=f16, LANES=lanes), combine
    return ShaderKey.of("attention", SOFTCAP=softcap, **kv_defines(kv_type), **common, F16=f16, QUANT=quant is not None,
                        Q8_K=quant == "q8_k"), combine


def attention_grid(heads: int, n: int, splits: int, lanes: int = 0) -> tuple[int, int, int]:
    """The attention pass's workgroups: one per (head, token, split) with `lanes`, else WG heads in one."""
    return (heads if lanes else groups(heads), n, splits)


def attention_combine_grid(heads: int, head_dim_v: int, n: int) -> tuple[int, int, int]:
    """The combine pass's workgroups: an invocation per (head, token, vec4 of a head's output)."""
    return (groups(heads * head_dim_v // 4), n, 1)


def matmul_key(qtype: QT, *, bias: bool = False, tile: tuple[int, int, int, int, int] = MATMUL_TILE,
               f16: bool = False) -> ShaderKey:
    """The workgroup-tiled matmul (steps of several tokens); `tile` as pyshim.gpu.policy.MATMUL_TILE;
    `f16`: tiles and dot products in halves."""
    tm, tn, kt, rm, rn = tile
    return ShaderKey.of("matmul", **{weight_define(qtype): True}, WG=tm // rm * (tn // rn), TM=tm, TN=tn, KT=kt, RM=rm, RN=rn,
                        BIAS=bias, F16=f16)


def matmul_grid(m: int, n: int, tile: tuple[int, int, int, int, int] = MATMUL_TILE) -> tuple[int, int, int]:
    return groups(m, tile[0]), groups(n, tile[1]), 1


def attention_prefill_key(head_dim: int, head_dim_v: int, softcap: bool, kv_type: str = "f32") -> ShaderKey:
    """The key-tiled causal prefill attention; KTILE keys per tile fill ATTN_TILE_BYTES with f32 K and V rows."""
    tile = max(1, min(ATTN_TILE_KEYS, ATTN_TILE_BYTES // ((head_dim + head_dim_v) * 4)))
    return ShaderKey.of("attention_prefill", WG=WG, HD4=head_dim // 4, HDV4=head_dim_v // 4, KTILE=tile,
                        SOFTCAP=softcap, **kv_defines(kv_type))


def attention_prefill_grid(n: int, heads: int, kv_heads: int) -> tuple[int, int, int]:
    """One workgroup per KV head and WG // G query tokens (G query heads per KV head)."""
    return kv_heads, groups(n, WG // (heads // kv_heads)), 1


def attention_record_bytes(head_dim_v: int) -> int:
    """Bytes of one split's record in the partial buffer: (max, sum) in a vec4, then the output row."""
    return (head_dim_v // 4 + 1) * 16


def argmax_keys(subgroup: bool = False) -> tuple[ShaderKey, ShaderKey]:
    """The two passes of argmax: barrier-free, or a workgroup per chunk reduced by subgroup operations."""
    return tuple(ShaderKey.of("argmax", WG=WG, SUBGROUP=subgroup, **{p: True}) for p in ("PASS1", "PASS2"))


def argmax_pass1(vocab: int, subgroup: bool = False, rows: int = 1) -> tuple[int, int, tuple[int, int, int]]:
    """(logits per partial, partials per row, grid) of argmax's first pass over `rows` rows of logits."""
    chunk = ARGMAX_CHUNK_SUBGROUP if subgroup else ARGMAX_CHUNK
    parts = groups(vocab, chunk)
    return chunk, parts, ((parts, rows, 1) if subgroup else (groups(parts), rows, 1))


def rmsnorm_key(*, reduce: bool = False, subgroup: bool = False, residual: bool = False) -> ShaderKey:
    """One invocation per row (CPU adapters), or one workgroup per row (`reduce`; `subgroup`: summed by
    subgroupAdd); `residual`: a residual added to the norm."""
    if reduce:
        return ShaderKey.of("rmsnorm", WG=RMSNORM_WG, REDUCE=True, SUBGROUP=subgroup, RESIDUAL=residual)
    return ShaderKey.of("rmsnorm", WG=WG, RESIDUAL=residual)


def rmsnorm_grid(rows: int, reduce: bool = False) -> tuple[int, int, int]:
    if not reduce:
        return groups(rows), 1, 1
    x = min(rows, MAX_GROUPS)
    return x, 1, groups(rows, x)


def matvec_grid(m: int, n: int, reduce: bool = False, rows: int = MATVEC_ROWS, wg: int = MATVEC_WG) -> tuple[int, int, int]:
    if not reduce:
        return groups(m, wg * rows), n, 1
    total = groups(m, REDUCE_ROWS)              # one workgroup per REDUCE_ROWS rows, folded into z past 65535
    x = min(total, MAX_GROUPS)
    return x, n, groups(total, x)


class KernelCache:
    """Pipelines by ShaderKey, compiled once per device (WGSL errors surface as ShaderError). A key asked for
    while it compiles waits for that compilation (a step's, or pyshim.exec.gpu_runner.GpuRunner.prewarm's in
    the background) instead of starting another."""

    def __init__(self, device: GPUDevice, sources: Mapping[str, str] | None = None):
        self.device = device
        self.pre = Preprocessor(sources, compiler="naga" if device.caps.face == "native" else "tint")
        self._pipelines: dict[ShaderKey, object] = {}
        self._compiling: dict[ShaderKey, asyncio.Future] = {}

    def source(self, key: ShaderKey) -> str:
        return self.pre.build(key)

    async def get(self, key: ShaderKey):
        pipeline = self._pipelines.get(key)
        if pipeline is not None:
            return pipeline
        if key.family not in PARAMS:
            raise ShaderError(f"unknown shader family {key.family!r}")
        pending = self._compiling.get(key)
        if pending is None:
            # a task of its own, so that a waiter cancelled (a background prewarm stopped) leaves it to the others
            pending = self._compiling[key] = asyncio.ensure_future(self._compile(key))
            pending.add_done_callback(lambda task: task.cancelled() or task.exception())   # (retrieved: no warning)
        return await asyncio.shield(pending)

    async def _compile(self, key: ShaderKey):
        try:
            pipeline = await self.device.pipeline(self.source(key), label=key.label)
            self._pipelines[key] = pipeline
            return pipeline
        finally:
            del self._compiling[key]

    def __len__(self) -> int:
        return len(self._pipelines)

    def __contains__(self, key: ShaderKey) -> bool:
        """Whether `key`'s pipeline is compiled already (get() then costs nothing)."""
        return key in self._pipelines


def rope_theta(spec, freq_factors: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Per rotated pair, the angle per position (f32 [dims/2], computed in f64 then rounded) and mscale:
    what rope.wgsl multiplies by the position (see pyshim.models.rope.pair_tables)."""
    from pyshim.models.rope import pair_tables

    inv_freq, mix, mscale = pair_tables(spec, freq_factors)
    theta = inv_freq * (spec.freq_scale * (1.0 - mix) + mix)
    return theta.astype(np.float32), float(mscale)
