"""The kernel policy from an adapter's features and limits alone (pyshim.gpu.policy): what CPU adapters and
the GPUs of the common vendors get, from Capabilities made up for each (no device needed)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pyshim.errors import UnsupportedError
from pyshim.gpu.device import Capabilities
from pyshim.gpu.policy import DOT4_FEATURE, SUBGROUP_ID_FEATURE, KernelPolicy
from pyshim.plan.settings import Arithmetic

LIMITS = {"max_compute_workgroup_storage_size": 32768, "max_compute_invocations_per_workgroup": 256}


def caps(*, fallback: bool, f16: bool, subgroups: tuple[int, int] | None, dot4: bool = True) -> Capabilities:
    features = {DOT4_FEATURE} if dot4 else set()
    if f16:
        features.add("shader-f16")
    if subgroups:
        features |= {"subgroups", SUBGROUP_ID_FEATURE}
    lo, hi = subgroups or (0, 0)
    return Capabilities(face="browser", vendor="v", architecture="a", description="d", backend="WebGPU",
                        is_fallback=fallback, features=frozenset(features), limits=dict(LIMITS),
                        subgroup_min_size=lo, subgroup_max_size=hi)


def test_cpu_adapters_keep_the_int8_route_and_no_f16():
    swiftshader = KernelPolicy.for_device(caps(fallback=True, f16=False, subgroups=(4, 4)))
    lavapipe = KernelPolicy.for_device(caps(fallback=True, f16=True, subgroups=(4, 128)))
    for policy in (swiftshader, lavapipe):
        assert policy.int8 and not policy.reduce and not policy.f16 and policy.attn_lanes == 0
    assert swiftshader.matvec_rows == 4 and lavapipe.matvec_rows == 4
    # the f32 route keeps 2 rows on lavapipe (its loops are not written out)
    assert KernelPolicy.for_device(caps(fallback=True, f16=True, subgroups=(4, 128)), Arithmetic.F32).matvec_rows == 2
    assert swiftshader.norm_in_quantize and not lavapipe.norm_in_quantize     # measured (pyshim.gpu.policy)


def test_lavapipe_takes_its_measured_rows_by_type_and_width_and_nothing_else_does():
    """One-token int8 matvecs (measured: pyshim.gpu.policy): on lavapipe odd Q6_K rows and Q4_K rows at most
    2048 wide take 8, long Q6_K rows and a wider fused gate-and-up 2 (of each); SwiftShader and GPUs keep
    their rows for every matvec."""
    from gguf import GGMLQuantizationType as QT

    lavapipe = KernelPolicy.for_device(caps(fallback=True, f16=True, subgroups=(4, 128)))
    assert lavapipe.matvec_rows == 4
    rows = lavapipe.one_token_rows
    assert rows(QT.Q6_K, 8960) == 8                                 # 35 blocks a row
    assert rows(QT.Q6_K, 9216) == rows(QT.Q6_K, 1536) == 4          # 36, 6
    assert rows(QT.Q6_K, 10240) == rows(QT.Q6_K, 18944) == 2        # the 4-8B models' ffn_down
    assert rows(QT.Q6_K, 8960, glu=True) == 4                       # (a gate-and-up of Q6_K: not measured)
    assert rows(QT.Q4_K, 1536) == rows(QT.Q4_K, 2048) == rows(QT.Q4_K, 1536, glu=True) == 8
    assert rows(QT.Q4_K, 2304) == rows(QT.Q4_K, 18944) == 4
    assert rows(QT.Q4_K, 2560, glu=True) == rows(QT.Q4_K, 3584, glu=True) == 2
    assert rows(QT.Q4_0, 1536) == rows(QT.Q8_0, 18944, glu=True) == 4
    # every row count it takes is among the variants the naga and Tint compile checks go through
    from pyshim.gpu.kernels import matvec_i8_key
    from pyshim.gpu.variants import shader_variants

    keys = set(shader_variants())
    for qtype, k, glu in ((QT.Q6_K, 8960, False), (QT.Q6_K, 18944, False), (QT.Q4_K, 1536, False), (QT.Q4_K, 1536, True),
                          (QT.Q4_K, 3584, True)):
        assert matvec_i8_key(qtype, uniform_x=True, rows=rows(qtype, k, glu), glu="silu" if glu else None) in keys
    # its rows interleaved in groups (KernelPolicy.row_group_for): Q4_K's of 8, Q6_K's of 4; an invocation a
    # group at every width
    group = lavapipe.row_group_for
    assert group(QT.Q4_K, 1536) == group(QT.Q4_K, 18944) == 8
    assert group(QT.Q6_K, 1536) == group(QT.Q6_K, 8960) == group(QT.Q6_K, 18944) == 4
    assert group(QT.Q4_0, 1536) == group(QT.Q8_0, 1536) == group(QT.Q5_K, 1536) == 1
    assert replace(lavapipe, row_group=1).row_group_for(QT.Q4_K, 1536) == 1
    for qtype, k, glu in ((QT.Q4_K, 1536, False), (QT.Q4_K, 8960, False), (QT.Q4_K, 3584, True), (QT.Q6_K, 8960, False)):
        g = group(qtype, k)
        assert rows(qtype, k, glu, row_group=g) == g
        assert matvec_i8_key(qtype, uniform_x=True, rows=g, glu="silu" if glu else None, row_group=g) in keys
    # invocations ordered by phase (KernelPolicy.phase_spread) where consecutive ones start at alternating
    # places of repack.wgsl's 8-block groups: the 1.5B's Q6_K ffn_down (35 blocks a row, groups of 4), a Q6_K
    # in the file's layout 74 blocks wide, 2 rows an invocation (the 7B's, streamed); not where all start alike
    # (36 or 6 blocks in groups of 4), nor at four places (43 blocks, 2 rows), nor for ungrouped types
    spread = lavapipe.phase_spread
    assert spread(QT.Q6_K, 8960, 4, 4) and spread(QT.Q6_K, 18944, 2)
    assert not spread(QT.Q6_K, 9216, 4, 4) and not spread(QT.Q6_K, 1536, 4, 4) and not spread(QT.Q6_K, 18944, 4, 4)
    assert not spread(QT.Q6_K, 11008, 2) and not spread(QT.Q4_K, 8960, 8, 8)
    assert spread(QT.Q8_0, 32 * 35, 4) and not spread(QT.Q8_0, 32 * 36, 4)
    assert not replace(lavapipe, spread=False).phase_spread(QT.Q6_K, 8960, 4, 4)
    for rows, g in ((4, 4), (2, 1)):
        assert matvec_i8_key(QT.Q6_K, uniform_x=True, rows=rows, row_group=g, spread=True) in keys
    swiftshader = KernelPolicy.for_device(caps(fallback=True, f16=False, subgroups=(4, 4)))
    gpu = KernelPolicy.for_device(caps(fallback=False, f16=True, subgroups=(32, 32)))
    for policy in (swiftshader, gpu):
        assert policy.row_group_for(QT.Q4_K, 1536) == policy.row_group_for(QT.Q6_K, 1536) == 1
        assert not policy.phase_spread(QT.Q6_K, 8960, 4, 4)
        for qtype, k, glu in ((QT.Q6_K, 8960, False), (QT.Q6_K, 18944, False), (QT.Q4_K, 1536, True), (QT.Q4_K, 3584, True)):
            assert policy.one_token_rows(qtype, k, glu) == policy.matvec_rows


def test_lavapipe_alone_takes_smaller_matvec_workgroups():
    """(measured: pyshim.gpu.policy) lavapipe runs a workgroup on one core; SwiftShader spreads its own."""
    lavapipe = KernelPolicy.for_device(caps(fallback=True, f16=True, subgroups=(4, 128)))
    swiftshader = KernelPolicy.for_device(caps(fallback=True, f16=False, subgroups=(4, 4)))
    gpu = KernelPolicy.for_device(caps(fallback=False, f16=True, subgroups=(32, 32)))
    assert (lavapipe.matvec_wg, swiftshader.matvec_wg, gpu.matvec_wg) == (16, 64, 64)
    assert KernelPolicy.for_device(caps(fallback=True, f16=True, subgroups=(4, 128)), Arithmetic.F32).matvec_wg == 64
    assert KernelPolicy.for_device(caps(fallback=True, f16=True, subgroups=(4, 128)), matvec_wg=64).matvec_wg == 64


@pytest.mark.parametrize("subgroups, wg", [((32, 32), 32), ((64, 64), 64), ((8, 32), 32), ((4, 16), 32), (None, 32)],
                         ids=["nvidia", "amd", "intel", "narrow", "none"])
def test_gpus_get_reductions_f16_and_a_workgroup_from_their_subgroups(subgroups, wg):
    policy = KernelPolicy.for_device(caps(fallback=False, f16=True, subgroups=subgroups))
    assert policy.reduce and not policy.int8 and policy.f16 and policy.attn_splits > 1 and policy.attn_lanes > 1
    assert policy.subgroup == (subgroups is not None)
    assert policy.reduce_wg == wg


def test_a_gpu_without_shader_f16_keeps_f32_and_f16_cannot_be_forced():
    assert not KernelPolicy.for_device(caps(fallback=False, f16=False, subgroups=(32, 32))).f16
    with pytest.raises(UnsupportedError, match="shader-f16"):
        KernelPolicy.for_device(caps(fallback=True, f16=False, subgroups=(4, 4)), f16=True)


def test_the_int8_route_on_a_gpu_keeps_one_attention_invocation_a_head():
    # (its quantize may be folded into that attention pass; the lanes form has no such output)
    gpu = caps(fallback=False, f16=True, subgroups=(32, 32))
    assert KernelPolicy.for_device(gpu).attn_lanes == 32
    assert KernelPolicy.for_device(gpu, Arithmetic.INT8, reduce=False).attn_lanes == 0
