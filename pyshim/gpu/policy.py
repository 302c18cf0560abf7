"""Which kernel variants run on a device: chosen once from the adapter's features and limits.

Two kinds of adapter want different kernels. CPU adapters (SwiftShader in Chromium, lavapipe natively:
`isFallbackAdapter` / a CPU adapter type) pay dearly for workgroup barriers and per-element float work,
so they get barrier-free matvecs and rmsnorms, unsplit attention and — where WGSL has dot4I8Packed — the
int8 route (llama.cpp's CPU arithmetic). Real GPUs get workgroup reductions (summed by subgroupAdd where
the device has subgroups), key-split attention and the key-tiled prefill attention. Among CPU adapters,
one whose subgroups are exactly 4 lanes wide (SwiftShader: 128-bit SSE lanes; lavapipe reports 4-128)
was measured faster with 4 rows per matvec invocation and int8 blocks read in pairs.

Where the device has shader-f16 and is not a CPU adapter, the f32 route's arithmetic runs in halves where
the kernels offer it (F16: matvec, tiled matmul, decode attention, the gated activation; sums across blocks,
softmax and values stay f32): CPU adapters emulate f16, and lavapipe, which lists it, tests it only.

Tests force any variant through `KernelPolicy.for_device(caps, **overrides)`; what no default path uses is
not offered (shaders/README.md says what was measured and dropped).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from pyshim.errors import BadRequestError, UnsupportedError
from pyshim.gpu.device import Capabilities
from pyshim.plan.memory import GROUPED_TYPES as GROUPED_TENSOR_TYPES, REPACK_GROUP_BLOCKS
from pyshim.plan.settings import Arithmetic

# Output rows per invocation of the barrier-free matvec. lavapipe, whole SmolLM2 decode steps in process
# CPU time: 2 rows 132-142 ms per token, 1 row 160-168, 4 or 8 rows 187-196.
MATVEC_ROWS = 2
# 4-lane CPU adapters (SwiftShader): 4 rows per invocation was the fastest or near it for every type in
# playwright/bench_kernels.py (and FACTS.md's f32 matvec), though that machine's noise is large.
NARROW_SIMD_ROWS = 4
NARROW_SIMD_LANES = 4
# The int8 route on wider CPU adapters (lavapipe) too, since its rows are written out (matvec_i8.wgsl):
# decode steps, 2 -> 4 rows, Qwen2.5-1.5B-shaped Q4_K_M 277-305 -> 265-272 ms, SmolLM2 (Q4_1) 44 -> 39,
# Qwen2.5-0.5B and Gemma 3 270M level.
CPU_I8_ROWS = 4
# ... except where lavapipe measured other rows for one-token matvecs (KernelPolicy.one_token_rows; whole
# decode steps alternating in one process, best / median ms, unless said):
# - Q6_K rows of an odd block count (the 1.5B's ffn_down, 8960 wide: 35) take 8: with the grouped layout those
#   ran at 2.5-3.3 G elements/s with 4 rows against 4-5 for even counts (34, 36) and 4.0-5.5 with 8 rows
#   (1536x8960, weights out of cache: 4.3-5.0 -> 3.1-3.4 ms). A layout that keeps each block in one run fixed
#   the odd counts as well but cost the even ones 5-15% (the 7B's ffn_down and head), so the rows change.
# - Q4_K rows at most 2048 wide (a 1-2B model's every matrix but ffn_down) take 8, the fused gate-and-up 8 of
#   each: Qwen2.5-1.5B's shape 262/273 -> 245/253, Llama-3.2-1B's 195/203 -> 188/193, Qwen2.5-0.5B and Gemma 3
#   270M 2-4% faster, SmolLM2 level. Q6_K's rows at those widths level.
# - A wider fused gate-and-up takes 2 of each (4 rows, as a plain matvec): 8 were 20% slower than 4 at 3584
#   (the 7B's, 940/1028 -> 1153/1216 ms) and 2 were faster still: the 7B 906/941 -> 857/888, Gemma-3-4B's
#   (2560) 588/617 -> 576/600, Phi-3.5-mini's (3072) level. Plain Q4_K matvecs that wide keep 4 (3584x3584
#   alone: 2 rows 9.0 G elements/s, 4 10.4, 8 10.4).
# - Q6_K rows at least 10240 wide (a 4-8B model's ffn_down) take 2: the 7B 899/925 -> 849/888, Gemma-3-4B
#   574/584 -> 558/565; Llama-3.2-1B's 8192 level.
CPU_I8_ODD_Q6_K_ROWS = 8
CPU_I8_SHORT_K = 2048
CPU_I8_SHORT_K_ROWS = 8
CPU_I8_LONG_Q6_K = 10240
CPU_I8_LONG_ROWS = 2
# lavapipe's Q4_K weights are interleaved by rows in groups of 8 (KernelPolicy.row_group_for,
# include/row_group.wgsl: an invocation's rows read as one run of memory), and a one-token matvec takes a
# group an invocation (the fused gate-and-up a group of each), at every width; the file layout's rows
# above then serve only weights left in it. Weights streamed from memory (24-140 copies, as a decode
# step reads them), G elements/s, file layout's best rows against interleaved with 8: the 1.5B's 8960x1536
# gate-and-up 7.3-7.6 -> 8.9-9.4, the 7B's 18944x3584 8.5 -> 10.0, 1536x1536 5.9-6.0 -> 6.5-6.7,
# 1536x8960 level (8.9-9.4 with 4 rows, 9.2-9.4 interleaved with 8).
CPU_I8_ROW_GROUP = 8
# Q6_K in groups of 4 (4 rows an invocation), at every width: the 1.5B's ffn_down (1536x8960, odd block
# count) 5.6-5.8 -> 6.6-7.0 (8 rows before), the 7B's head shape (3584 wide) 5.6-5.8 -> 6.3-6.6, the 1.5B's
# (1536 wide) 5.4-5.6 -> 5.6-5.7 (an Intel Xeon host). The 7B's ffn_down (18944 wide) read as fast in the
# file's layout with 2 rows there, and kept it until an AMD EPYC host (2026-12-07) read that layout at
# 3.5-3.8 G elements/s against 5.4-6.5 in groups of 4 (2 rows of 74 blocks: consecutive invocations start
# half a repack group apart, see KernelPolicy.phase_spread); whole 7B steps 1299/1352 -> 1178/1228 ms
# (best / first quartile, alternating in one process).
CPU_I8_Q6_K_ROW_GROUP = 4
# Invocations per workgroup of the barrier-free matvecs. lavapipe runs each workgroup on one of its threads
# (one a core), 8 invocations a SIMD pass: 64 invocations of 8 rows are 512 rows, so a 1536-row matrix
# was 3 workgroups on 2 cores, a 256-row one 1. With 16, one-token, weights out of cache: Q6_K 1536x8960
# 4.2 -> 5.4-5.6 G elements/s, Q4_K 1536x1536 4.9 -> 7.1, 256x1536 1.2 -> 2.2, the 151936-row head 4.7 ->
# 5.4, the GLU level. SwiftShader level with 8-64 (it spreads a workgroup's invocations itself). The int8
# route only: lavapipe's f32 route was tuned with 64 (shaders/README.md) and is not measured with 16.
MATVEC_WG = 64
CPU_MATVEC_WG = 16
# Rows per invocation of the int8 kernels that unpack a block once for several tokens (matvec_i8 TOKENS:
# prefill, a batched decode step). lavapipe since the K-quants' pieces (include/pieces_i8.wgsl): 128-token
# prefill, 8 -> 4 rows, SmolLM2-135M (Q4_0) 46 -> 63-67 tok/s, Gemma 3 42 -> 50, Qwen2.5-0.5B 14.0 -> 18.5
# (2 rows 50, 3 rows 58, 6 rows 46 on the first), a batched decode step of 4 SmolLM2 sequences 225 -> 150-155
# ms. SwiftShader keeps 8 (32-token prefill in Chromium, SmolLM2 / Gemma 3: 8.4 / 6.8 tok/s with 8 rows,
# 7.4 / 6.3 with 4; kernels.py has the tiles it was chosen from).
TOKEN_ROWS = 4
TOKEN_ROWS_NARROW = 8
# Splits of the key range per (head, token) in decode attention: on real GPUs a handful of heads would
# otherwise keep only a handful of invocations busy over the whole context (untuned: no GPU at hand);
# CPU adapters have few cores and skip the combine pass.
ATTN_SPLITS_GPU = 16
# Invocations per (head, token, split) of decode attention on real GPUs (attention.wgsl LANES): a head's
# dims spread over a workgroup. One invocation per head walking its keys alone took 3.1 of a 6.9 ms
# Qwen2.5-1.5B decode step on an H200 at a 9-token context.
ATTN_LANES_GPU = 32
# The reduction matvec's workgroup (matvec.wgsl REDUCE): REDUCE_WG invocations, or a subgroup's width where
# that is wider (pyshim.gpu.policy.reduce_wg), up to MAX_REDUCE_WG. Untuned: no GPU was at hand.
REDUCE_WG = 32
MAX_REDUCE_WG = 128
# The workgroup-tiled matmul (matmul.wgsl) for the f32 route's steps of several tokens, its tile shape:
# (TM weight rows, TN tokens, KT elements of k per step, RM rows and RN tokens per invocation). On real
# GPUs untuned (none at hand): 16 KiB of workgroup memory, WebGPU's guaranteed limit.
MATMUL_TILE = (32, 32, 64, 4, 4)
# On CPU adapters (24 KiB: SwiftShader and lavapipe allow 32). ms per 64-token matmul, Q4_1 1536x576 /
# Q4_K 640x2048: lavapipe (process CPU, tests/bench_prefill.py --kernels) 33.8 / 53.2, against 37.6 / 91.3
# for the barrier-free matvec and 43.5 / 72.1 for MATMUL_TILE; 8x8 or 4x16 per invocation and 256-wide k
# steps were slower. SwiftShader (GPU-process CPU, playwright/bench_prefill_kernels.py) 270-283 / 347-393
# against 373-382 / 530 for the matvec (4 rows), 303-343 / 468 for MATMUL_TILE, and 198 / 390-403 for the
# int8 matvec.
MATMUL_TILE_CPU = (32, 64, 64, 4, 8)
# The WGSL language feature dot4I8Packed and pack4xI8 need (Chromium lists it in
# navigator.gpu.wgslLanguageFeatures; natively it is probed, gpu/native.py).
DOT4_FEATURE = "wgsl:packed_4x8_integer_dot_product"
# The norm before a matmul folded into the int8 route's quantize (quantize.wgsl NORM) only where measured
# no slower: SwiftShader, SmolLM2 decode 768/851 ms a token with it vs 768/752 without (same page), and
# 61 passes fewer; lavapipe 580-630 vs 227-238 ms: there, alternating between two bind groups of that
# pipeline costs ~4 ms a switch (the same dispatch repeated does not), for reasons not found.
# The subgroup reductions need subgroupAdd and the subgroup_id/num_subgroups builtins: Chromium lists the
# latter as a WGSL language feature, native ones are probed.
SUBGROUP_ID_FEATURE = "wgsl:subgroup_id"


def subgroups_usable(caps: Capabilities) -> bool:
    """Whether the subgroup-reduction kernels compile on this device (the 'subgroups'/'subgroup' feature,
    which the faces request at device creation, and the subgroup_id builtin)."""
    return caps.has_subgroups and SUBGROUP_ID_FEATURE in caps.features


def int8_usable(caps: Capabilities) -> bool:
    return DOT4_FEATURE in caps.features


@dataclass(frozen=True)
class KernelPolicy:
    int8: bool                   # quantized matmuls by integer dot products on int8-rounded activations
    reduce: bool                 # workgroup-reduction matvec and rmsnorm (else barrier-free)
    subgroup: bool               # those reductions summed by subgroupAdd
    matvec_rows: int             # rows per invocation of the barrier-free matvecs
    i8_pairs: bool               # matvec_i8 reads Q5_0 blocks two at a time (rows of an even block count)
    matmul_tile: tuple[int, int, int, int, int]
    tiled_attention: bool        # the key-tiled prefill attention for steps of several tokens
    attn_splits: int             # key-range splits of decode attention (1: no combine pass)
    attn_lanes: int = 0          # invocations per (head, token, split) of decode attention (0: one)
    f16: bool = False            # the f32 route's matvecs, tiled matmul, decode attention and activation in f16
    reduce_wg: int = REDUCE_WG   # invocations of a reduction matvec's workgroup
    norm_in_quantize: bool = True   # the int8 route's quantize norms its input itself (one pass fewer a norm)
    token_rows: int = TOKEN_ROWS    # rows per invocation of the int8 kernels that take several tokens
    i8_lanes: bool = False       # those take 4-bit weights' tokens in pairs (lanes.wgsl), one multiply for two
    cpu_i8_rows: bool = False    # one-token matvecs take lavapipe's rows by type and width (one_token_rows)
    matvec_wg: int = MATVEC_WG   # invocations per workgroup of the barrier-free matvecs
    row_group: int = 1           # the int8 route's Q4_K rows interleaved in groups this big (Q6_K: row_group_for); 1: none
    spread: bool = False         # int8 matvecs may order invocations by their rows' phase (phase_spread)

    def one_token_rows(self, qtype, k: int, glu: bool = False, row_group: int = 1) -> int:
        """Rows per invocation of a one-token int8 matvec of `qtype` weights `k` wide (`glu`: the fused
        gate-and-up's rows of each; `row_group`: the weight's rows interleaved in groups of that many)."""
        if row_group > 1:
            return row_group
        if not self.cpu_i8_rows:
            return self.matvec_rows
        q4_k, q6_k = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K
        if qtype == q4_k:
            return CPU_I8_SHORT_K_ROWS if k <= CPU_I8_SHORT_K else CPU_I8_LONG_ROWS if glu else self.matvec_rows
        if qtype != q6_k or glu:
            return self.matvec_rows
        if (k // GGML_QUANT_SIZES[q6_k][0]) % 2 == 1:
            return CPU_I8_ODD_Q6_K_ROWS
        return CPU_I8_LONG_ROWS if k >= CPU_I8_LONG_Q6_K else self.matvec_rows

    def row_group_for(self, qtype, k: int) -> int:
        """Rows a group of the int8 route's row-interleaved layout for a 2-D `qtype` matrix `k` wide (1: the
        file's layout): where `row_group` asks for it, Q4_K's groups are that many, Q6_K's
        CPU_I8_Q6_K_ROW_GROUP."""
        if self.row_group <= 1 or not self.int8:
            return 1
        if qtype == GGMLQuantizationType.Q4_K:
            return self.row_group
        if qtype == GGMLQuantizationType.Q6_K:
            return CPU_I8_Q6_K_ROW_GROUP
        return 1

    def phase_spread(self, qtype, k: int, rows: int, row_group: int = 1) -> bool:
        """Whether an int8 matvec of `qtype` weights `k` wide, `rows` an invocation (in row groups of
        `row_group`), takes matvec_i8's SPREAD: a grouped type (repack.wgsl's groups of REPACK_GROUP_BLOCKS)
        whose consecutive invocations start at two alternating places within a group (the 1.5B's Q6_K
        ffn_down, 35 blocks a row in groups of 4 rows; a 7B's streamed one, 74 blocks, 2 rows an invocation).
        SPREAD gives a workgroup's first half the even invocations' rows, so each of lavapipe's 8-lane SIMD
        passes reads in one phase. Measured on an AMD EPYC host (2026-12-07), weights streamed: Q6_K
        1536x8960 in groups of 4, 5.0-5.2 -> 6.0-6.2 G elements/s (36 blocks a row: 6.2-6.5 either way);
        3584x18944 in the file's layout, 2 rows, 3.5-3.8 -> 5.6-5.7; whole 1.5B steps 225.5/228.8 ->
        217.0/221.7 ms (best / first quartile, alternating in one process), the same tokens; its 32-token
        prompt (8 tokens an invocation) 3768/3972 -> 3686/3824 ms (best / median of 6)."""
        if not self.spread or GGMLQuantizationType(qtype) not in GROUPED_TENSOR_TYPES or self.matvec_wg % 2:
            return False
        nb = k // GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][0]
        phases = [_first_block(i, rows, row_group, nb) % REPACK_GROUP_BLOCKS for i in range(2 * REPACK_GROUP_BLOCKS)]
        return len(set(phases[0::2])) == 1 and len(set(phases[1::2])) == 1 and phases[0] != phases[1]

    @property
    def arithmetic(self) -> Arithmetic:
        return Arithmetic.INT8 if self.int8 else Arithmetic.F32

    @classmethod
    def for_device(cls, caps: Capabilities, arithmetic: Arithmetic | None = None, **overrides) -> "KernelPolicy":
        """The adapter's defaults; `arithmetic` INT8 or F32 forces the route (EXACT is the reference's only);
        `overrides` force any field (tests). `subgroup=True` implies the reduction kernels, on any adapter
        with subgroups (how CPU adapters test them)."""
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise BadRequestError(f"unknown kernel policy fields {sorted(unknown)}")
        cpu = caps.is_fallback
        narrow = cpu and caps.subgroup_min_size == caps.subgroup_max_size == NARROW_SIMD_LANES
        reduce = overrides.pop("reduce", (not cpu) or bool(overrides.get("subgroup")))
        subgroup = overrides.pop("subgroup", not cpu and subgroups_usable(caps)) and reduce
        if subgroup and not subgroups_usable(caps):
            raise UnsupportedError("this device has no subgroups (or no subgroup_id builtin)", hint="leave subgroup unset")
        if arithmetic is Arithmetic.EXACT:
            raise BadRequestError("the llama.cpp-exact arithmetic runs on the cpu backend only",
                                  hint="use --arithmetic int8 on the GPU (llama.cpp's rounding)")
        if arithmetic is Arithmetic.INT8 and not int8_usable(caps):
            raise UnsupportedError("this adapter's WGSL has no dot4I8Packed, which the int8 route needs",
                                   hint="use the f32 arithmetic")
        # the int8 route's kernels are barrier-free ones: with the reduction kernels it falls back to f32
        int8 = (cpu and int8_usable(caps)) if arithmetic is None else arithmetic is Arithmetic.INT8
        lavapipe_i8 = cpu and not narrow and int8 and not reduce   # a wide-SIMD CPU adapter's int8 route: its measured choices
        policy = cls(
            int8=int8 and not reduce, reduce=reduce, subgroup=subgroup,
            matvec_rows=NARROW_SIMD_ROWS if narrow else CPU_I8_ROWS if cpu and int8 and not reduce else MATVEC_ROWS,
            i8_pairs=narrow,
            matmul_tile=_tile(caps, MATMUL_TILE_CPU if cpu else MATMUL_TILE),
            tiled_attention=not cpu, attn_splits=1 if cpu else ATTN_SPLITS_GPU,
            # (the int8 route keeps one invocation a head: its quantize may be folded into that pass)
            attn_lanes=0 if cpu or (int8 and not reduce) else ATTN_LANES_GPU,
            f16=caps.has_f16 and not cpu, reduce_wg=reduce_wg(caps), norm_in_quantize=narrow,
            token_rows=TOKEN_ROWS_NARROW if narrow else TOKEN_ROWS, i8_lanes=narrow,
            cpu_i8_rows=lavapipe_i8, matvec_wg=CPU_MATVEC_WG if lavapipe_i8 else MATVEC_WG,
            row_group=CPU_I8_ROW_GROUP if lavapipe_i8 else 1, spread=lavapipe_i8,
        )
        if overrides.get("f16") and not caps.has_f16:
            raise UnsupportedError("this device has no shader-f16", hint="leave f16 unset")
        return replace(policy, **overrides)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _first_block(i: int, rows: int, row_group: int, nb: int) -> int:
    """The block (in the order a weight's buffer holds them) where invocation i's first row starts: rows of nb
    blocks, interleaved in groups of row_group (include/row_group.wgsl)."""
    row = i * rows
    return row * nb if row_group <= 1 else row // row_group * row_group * nb + row % row_group


def reduce_wg(caps: Capabilities) -> int:
    """A reduction matvec's workgroup: one subgroup where subgroups are at least REDUCE_WG wide (AMD's 64:
    the subgroup sum is then the whole reduction, one shared slot), else REDUCE_WG (32: one NVIDIA warp,
    several Intel or Apple subgroups); at most the adapter's invocations per workgroup."""
    size = caps.subgroup_max_size if caps.subgroup_max_size >= REDUCE_WG and not caps.is_fallback else REDUCE_WG
    size = 1 << (int(size).bit_length() - 1)                 # a power of 2 (the tree's halving)
    return max(1, min(size, MAX_REDUCE_WG, caps.limits.get("max_compute_invocations_per_workgroup", 256)))


def _tile(caps: Capabilities, tile: tuple[int, int, int, int, int]) -> tuple[int, int, int, int, int]:
    """`tile` where its workgroup memory fits the adapter, else the guaranteed-size MATMUL_TILE."""
    if (tile[0] + tile[1]) * tile[2] * 4 > caps.limits.get("max_compute_workgroup_storage_size", 16384):
        return MATMUL_TILE
    return tile
