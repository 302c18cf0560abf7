"""TensorType mirrors gguf's GGMLQuantizationType; sizes and runnable types."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from pyshim.gguf.types import RUNNABLE_TYPES, TensorType, tensor_nbytes, tensor_type


def test_mirrors_gguf_enum_and_sizes():
    assert {t.name: t.value for t in TensorType} == {t.name: t.value for t in GGMLQuantizationType}
    for t in TensorType:
        assert (t.block_size, t.type_size) == GGML_QUANT_SIZES[t.gguf]
        assert t == t.gguf and tensor_type(t.value) is t
    assert tensor_type(4) is None and tensor_type(999) is None   # Q4_2 was removed from ggml


def test_commented_block_sizes_are_right():
    # the byte counts written in the enum's layout comments
    expected = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q2_K": 84, "Q3_K": 110, "Q4_K": 144,
                "Q5_K": 176, "Q6_K": 210, "Q8_K": 292}
    assert {name: TensorType[name].type_size for name in expected} == expected


def test_tensor_nbytes():
    assert tensor_nbytes(TensorType.Q4_K, (256, 10)) == 1440
    assert tensor_nbytes(TensorType.F16, (3, 5, 7)) == 210
    assert tensor_nbytes(TensorType.F32, ()) == 4
    assert tensor_nbytes(int(TensorType.Q8_0), [64]) == 68
    with pytest.raises(ValueError, match="multiple of 256"):
        tensor_nbytes(TensorType.Q6_K, (640, 2))
    with pytest.raises(ValueError):
        tensor_nbytes(TensorType.F32, (-1,))


def test_runnable_types_are_ones_gguf_can_dequantize():
    # the reference executor dequantizes with gguf.quants: every runnable type must be supported there
    rng = np.random.default_rng(0)
    for t in RUNNABLE_TYPES - {TensorType.F32, TensorType.F16}:
        raw = rng.integers(0, 256, size=(2, t.type_size * (256 // t.block_size)), dtype=np.uint8)
        with np.errstate(invalid="ignore", over="ignore"):   # random bytes make some f16 scales NaN/inf
            assert quants.dequantize(raw, t.gguf).shape == (2, 256)
    assert {t.name for t in RUNNABLE_TYPES} >= {"F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}
    assert not TensorType.IQ2_XS.runnable and TensorType.Q4_K.runnable
    assert TensorType.Q4_K.bits_per_weight == 4.5
