"""ModelSpec from {arch}.* keys (llama.cpp's defaults and per-architecture rules) and the memory estimate."""

from __future__ import annotations

import math
import struct

import pytest
from gguf import GGUFValueType as VT

from ggufgen import kv, kv_array, kv_str, kv_str_array, kv_u32, raw_gguf, tensor_info
from pyshim.setup.catalog import MODELS, model_path
from pyshim.errors import BadRequestError, GGUFFormatError, UnsupportedError
from pyshim.gguf.header import MissingKeyError, read_header, read_header_from_file
from pyshim.plan import auto
from pyshim.plan.memory import estimate, fits, group_bytes, kv_bytes_per_token, kv_cache_bytes, weights_by_type
from pyshim.plan.settings import KV_TYPES
from pyshim.gguf.types import TensorType
from pyshim.gguf.spec import ARCHITECTURES, ModelSpec

BASE = {"block_count": 4, "context_length": 2048, "embedding_length": 256, "feed_forward_length": 512,
        "attention.head_count": 8, "attention.layer_norm_rms_epsilon": 1e-5}
TENSORS = ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "output.weight")


def packed(key: str, value) -> bytes:
    if isinstance(value, bool):
        return kv(key, VT.BOOL, struct.pack("<?", value))
    if isinstance(value, int):
        return kv_u32(key, value)
    if isinstance(value, float):
        return kv(key, VT.FLOAT32, struct.pack("<f", value))
    if isinstance(value, str):
        return kv_str(key, value)
    if all(isinstance(v, str) for v in value):
        return kv_str_array(key, value)
    if all(isinstance(v, bool) for v in value):
        return kv_array(key, VT.BOOL, bytes(value), len(value))
    return kv_array(key, VT.INT32, struct.pack(f"<{len(value)}i", *value), len(value))


def spec_of(arch: str, keys: dict | None = None, *, drop=(), tensors=TENSORS, general: dict | None = None) -> ModelSpec:
    values = {k: v for k, v in {**BASE, **(keys or {})}.items() if k not in drop}
    kvs = [kv_str("general.architecture", arch)] + [packed(f"{arch}.{k}", v) for k, v in values.items()]
    kvs += [packed(k, v) for k, v in (general or {}).items()]
    infos = [tensor_info(name, (32,), TensorType.F32, 128 * i) for i, name in enumerate(tensors)]
    return ModelSpec.from_header(read_header(raw_gguf(kvs, infos)))


def test_defaults_follow_llama_cpp():
    spec = spec_of("llama", drop=("attention.layer_norm_rms_epsilon",))
    assert (spec.n_kv_heads, spec.head_dim_k, spec.head_dim_v) == (8, 32, 32)   # kv heads = heads, head = embd/heads
    assert spec.rope == spec.rope_swa
    assert (spec.rope.dims, spec.rope.base, spec.rope.neox, spec.rope.scaling, spec.rope.factor) == (32, 10000.0, False, "none", 1.0)
    assert spec.rope.n_ctx_orig == 2048 and spec.norm_eps == 1e-5
    assert spec.attn_scale == 1 / math.sqrt(32) and spec.embedding_scale == 1.0
    assert spec.sliding_window == 0 and spec.swa_layers == (False,) * 4
    assert not spec.tied_output and spec.ffn_activation == "silu" and spec.n_experts == 0


@pytest.mark.parametrize("arch,neox", [("llama", False), ("qwen2", True), ("qwen3", True), ("gemma3", True), ("phi3", True)])
def test_rope_pairing_per_architecture(arch, neox):
    assert spec_of(arch).rope.neox is neox


def test_unknown_architecture_names_it_and_the_supported_ones():
    with pytest.raises(UnsupportedError) as info:
        spec_of("mamba")
    assert "'mamba'" in str(info.value) and all(a in str(info.value) for a in ARCHITECTURES)


def test_missing_and_mistyped_keys():
    with pytest.raises(MissingKeyError, match="'qwen2.embedding_length'"):
        spec_of("qwen2", drop=("embedding_length",))
    with pytest.raises(GGUFFormatError, match="'llama.block_count' should be an integer"):
        spec_of("llama", {"block_count": "four"})
    with pytest.raises(GGUFFormatError, match="at most 512 layers"):
        spec_of("llama", {"block_count": 100_000})
    with pytest.raises(GGUFFormatError, match="cannot be shared"):
        spec_of("llama", {"attention.head_count_kv": 3})
    with pytest.raises(GGUFFormatError, match="rotate whole heads"):
        spec_of("llama", {"rope.dimension_count": 16})
    assert spec_of("qwen2", {"rope.dimension_count": 16}).rope.dims == 16   # partial rope is fine elsewhere


def test_head_and_per_layer_keys():
    spec = spec_of("qwen3", {"attention.head_count_kv": [2, 2, 2, 2], "attention.key_length": 64, "attention.value_length": 48})
    assert (spec.n_kv_heads, spec.head_dim_k, spec.head_dim_v, spec.rope.dims) == (2, 64, 48, 64)
    assert spec.kv_row(0) == spec.kv_row(3) == (128, 96) and spec.uniform_kv
    with pytest.raises(UnsupportedError, match="differs between layers"):
        spec_of("qwen3", {"attention.head_count_kv": [2, 4, 2, 4]})


def test_rope_scaling():
    yarn = spec_of("qwen2", {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 512,
                             "rope.scaling.yarn_beta_fast": 8.0, "rope.scaling.attn_factor": 0.5}).rope
    assert (yarn.scaling, yarn.factor, yarn.n_ctx_orig, yarn.attn_factor) == ("yarn", 4.0, 512, 0.5)
    assert yarn.yarn_beta_fast == 32.0   # llama.cpp reads yarn_beta_* for DeepSeek-like models only
    linear = spec_of("llama", {"rope.scale_linear": 2.0}).rope           # the old key, default type "linear"
    assert (linear.scaling, linear.factor) == ("linear", 2.0)
    assert spec_of("llama", {"rope.scaling.type": "none", "rope.scaling.factor": 1.0}).rope.scaling == "none"
    with pytest.raises(UnsupportedError, match="'ntk'"):
        spec_of("llama", {"rope.scaling.type": "ntk"})


def test_rope_factor_tensors():
    assert spec_of("llama", tensors=TENSORS + ("rope_freqs.weight",)).rope_factor_tensors == ("rope_freqs.weight",)
    phi = spec_of("phi3", tensors=("token_embd.weight", "rope_factors_long.weight", "rope_factors_short.weight"))
    assert phi.rope_factor_tensors == ("rope_factors_long.weight", "rope_factors_short.weight")


def test_phi3_sliding_window_is_disabled_like_llama_cpp():
    spec = spec_of("phi3", {"attention.sliding_window": 2047},
                   tensors=("token_embd.weight", "blk.0.attn_qkv.weight", "blk.0.ffn_up.weight", "output.weight"))
    assert spec.sliding_window == 0 and not any(spec.swa_layers)
    assert spec.fused_qkv and spec.fused_gate_up


def test_gemma3_sliding_window_patterns():
    default = spec_of("gemma3", {"block_count": 12, "attention.sliding_window": 512})
    assert default.swa_layers == (True,) * 5 + (False,) + (True,) * 5 + (False,)
    assert default.sliding_window == 512 and default.n_swa_layers == 10
    assert default.rope_swa.base == 10000.0 and default.rope_for_layer(5) is default.rope and default.rope_for_layer(0) is default.rope_swa
    assert default.embedding_scale == 16.0 and default.ffn_activation == "gelu"
    explicit = spec_of("gemma3", {"attention.sliding_window": 4, "attention.sliding_window_pattern": [True, True, False, True],
                                  "rope.freq_base_swa": 5000.0})
    assert explicit.swa_layers == (True, True, False, True) and explicit.rope_swa.base == 5000.0
    assert spec_of("gemma3", {"attention.sliding_window": 4, "attention.sliding_window_pattern": 2}).swa_layers == (True, False) * 2
    assert all(spec_of("gemma3", {"attention.sliding_window": 4, "attention.sliding_window_pattern": 0}).swa_layers)
    assert not any(spec_of("gemma3").swa_layers)   # no window key: every layer global


def test_gemma3_scales_and_softcaps():
    assert spec_of("gemma3", {"attention.key_length": 64}).attn_scale == 1 / 8
    big = spec_of("gemma3", {"block_count": 62, "attention.key_length": 128, "embedding_length": 5376, "attention.head_count": 32})
    assert big.attn_scale == 1 / math.sqrt(5376 / 32)   # the 27B model: query_pre_attn_scalar = n_embd / n_head
    capped = spec_of("gemma3", {"final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0})
    assert capped.final_logit_softcap == 30.0 and capped.attn_logit_softcap is None
    assert spec_of("llama", {"final_logit_softcapping": 30.0}).final_logit_softcap is None


MOE_TENSORS = TENSORS + ("blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight",
                         "blk.0.ffn_down_exps.weight")
EXPERTS = {"expert_count": 8, "expert_used_count": 2}


def test_moe_fields_follow_llama_cpp():
    # Mixtral (llama with experts) and OLMoE: the expert width is feed_forward_length, whatever else is there
    moe = spec_of("llama", {**EXPERTS, "expert_feed_forward_length": 1024}, tensors=MOE_TENSORS)
    assert (moe.n_experts, moe.n_experts_used, moe.n_ff_expert) == (8, 2, 512)
    assert (moe.expert_gating, moe.expert_norm, moe.n_ff_shared) == ("softmax", True, 0)
    assert spec_of("olmoe", EXPERTS, tensors=MOE_TENSORS).expert_norm is False
    assert spec_of("olmoe", EXPERTS, tensors=MOE_TENSORS).qk_norm_full
    # the Qwen MoEs: expert_feed_forward_length, else feed_forward_length / experts used
    assert spec_of("qwen3moe", {**EXPERTS, "expert_feed_forward_length": 1024}, tensors=MOE_TENSORS).n_ff_expert == 1024
    assert spec_of("qwen3moe", EXPERTS, tensors=MOE_TENSORS).n_ff_expert == 256
    shared = spec_of("qwen2moe", {**EXPERTS, "expert_shared_feed_forward_length": 2048},
                     tensors=MOE_TENSORS + ("blk.0.ffn_up_shexp.weight",))
    assert (shared.n_ff_shared, shared.expert_norm) == (2048, False)
    # a gating key that agrees with the architecture is fine
    assert spec_of("qwen3moe", {**EXPERTS, "expert_gating_func": 1, "expert_weights_norm": True}, tensors=MOE_TENSORS).n_experts == 8


@pytest.mark.parametrize("arch, keys, tensors, named", [
    ("qwen3moe", {"expert_gating_func": 2}, MOE_TENSORS, "sigmoid"),
    ("olmoe", {"expert_weights_norm": True}, MOE_TENSORS, "renormalized"),
    ("qwen3moe", {"expert_weights_scale": 2.5}, MOE_TENSORS, "scaled by 2.5"),
    ("qwen3moe", {}, MOE_TENSORS + ("blk.0.exp_probs_b.bias",), "selection bias"),
    ("qwen3moe", {}, MOE_TENSORS + ("blk.0.ffn_down_exps.scale",), "per-expert output scales"),
    ("llama", {}, TENSORS + ("blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate.0.weight"), "one tensor per expert"),
    ("qwen2", {}, MOE_TENSORS, "mixture-of-experts qwen2 models are not supported"),
])
def test_moe_layouts_pyshim_does_not_compute_are_refused_by_name(arch, keys, tensors, named):
    with pytest.raises(UnsupportedError, match=named):
        spec_of(arch, {**EXPERTS, **keys}, tensors=tensors)


def test_moe_architectures_need_experts():
    with pytest.raises(GGUFFormatError, match="expert_count"):
        spec_of("qwen3moe", tensors=MOE_TENSORS)
    with pytest.raises(GGUFFormatError, match="of only 8"):
        spec_of("qwen3moe", {**EXPERTS, "expert_used_count": 9}, tensors=MOE_TENSORS)


def test_vocab_size_sources():
    tokens = {"tokenizer.ggml.tokens": ["a", "b", "c"]}
    assert spec_of("llama", {"vocab_size": 1234}, general=tokens).n_vocab == 3   # like llama.cpp: the vocabulary wins
    assert spec_of("llama", {"vocab_size": 1234}).n_vocab == 1234
    assert spec_of("llama").n_vocab == 0   # nothing says; token_embd is 1-D here


# ---- real models ------------------------------------------------------------------------------


def real_spec(name):
    path = model_path(name)
    if not path.is_file():
        pytest.fail(f"{name} is missing: run `pyshim setup --test-models`")
    header = read_header_from_file(path)
    return header, ModelSpec.from_header(header)


@pytest.mark.models
def test_real_models():
    _, smol = real_spec("smollm2")
    assert (smol.architecture, smol.n_layers, smol.n_embd, smol.n_heads, smol.n_kv_heads, smol.head_dim_k) == ("llama", 30, 576, 9, 3, 64)
    assert (smol.n_ff, smol.n_vocab, smol.context_length, smol.rope.base, smol.rope.neox) == (1536, 49152, 8192, 100000.0, False)
    assert smol.tied_output and not smol.qkv_bias

    _, gemma = real_spec("gemma3")
    assert (gemma.architecture, gemma.n_layers, gemma.n_heads, gemma.n_kv_heads, gemma.head_dim_k, gemma.n_vocab) == ("gemma3", 18, 4, 1, 256, 262144)
    assert [i for i, local in enumerate(gemma.swa_layers) if not local] == [5, 11, 17]
    assert (gemma.sliding_window, gemma.rope.base, gemma.rope_swa.base, gemma.attn_scale) == (512, 1e6, 1e4, 1 / 16)
    assert gemma.embedding_scale == math.sqrt(640) and gemma.tied_output and gemma.qk_norm and gemma.post_norms
    assert gemma.norm_eps == pytest.approx(1e-6)

    _, qwen = real_spec("qwen2.5")
    assert (qwen.architecture, qwen.n_layers, qwen.n_heads, qwen.n_kv_heads, qwen.n_vocab) == ("qwen2", 24, 14, 2, 151936)
    assert qwen.rope.neox and qwen.qkv_bias and not qwen.tied_output


@pytest.mark.models
def test_real_memory_estimates():
    header, smol = real_spec("smollm2")
    est = estimate(smol, header.tensors, context=2048)
    assert est.kv_bytes_per_token == 30 * 3 * (64 + 64) * 4
    assert est.kv_bytes == 2048 * est.kv_bytes_per_token
    assert est.weight_bytes == sum(t.nbytes for t in header.tensors)
    assert header.data_offset + est.weight_bytes <= MODELS["smollm2"].size
    assert est.largest_tensor.name == "token_embd.weight" and est.largest_tensor.type == TensorType.Q8_0
    assert list(est.weights_by_type) == ["Q4_1", "Q8_0", "F32"]
    assert est.weights_by_type["Q8_0"].count == 1 and est.weights_by_type["F32"].count == 61

    header, gemma = real_spec("gemma3")
    # 15 local layers hold 512 positions, 3 global ones the whole context
    per_position = 1 * (256 + 256) * 2
    assert kv_cache_bytes(gemma, 32768, "f16") == per_position * (15 * 512 + 3 * 32768)
    assert kv_cache_bytes(gemma, 100, "f16") == per_position * 100 * 18


def test_kv_types_and_fits():
    spec = spec_of("llama", {"attention.head_count_kv": 2})
    per_token = {kind: kv_bytes_per_token(spec, kind) for kind in KV_TYPES}
    assert per_token == {"f32": 4 * 2 * 64 * 4, "f16": 4 * 2 * 64 * 2, "q8": 4 * 2 * 64 * 36 // 32, "q4": 4 * 2 * 64 * 20 // 32}
    assert per_token["q4"] <= 0.16 * per_token["f32"]
    with pytest.raises(BadRequestError, match="bf8"):
        kv_bytes_per_token(spec, "bf8")
    header = read_header(raw_gguf([kv_str("general.architecture", "llama")],
                                  [tensor_info("a", (1024, 256), TensorType.Q4_0, 0), tensor_info("b", (64,), TensorType.F32, 147456)]))
    assert weights_by_type(header.tensors) == {"Q4_0": (1, 147456), "F32": (1, 256)}
    est = estimate(spec, header.tensors, context=100)
    # a 100-token step: per token 3 x n_ff + 2 x n_embd + q + k + v floats, and one row of logits
    assert est.chunk == 256 and est.activation_bytes == 4 * (100 * (3 * 512 + 2 * 256 + 8 * 32 + 64 + 64) + spec.n_vocab)
    assert est.total_bytes == 147456 + 256 + 100 * per_token["f32"] + est.activation_bytes
    assert fits(est, budget_bytes=est.total_bytes).ok
    assert not fits(est, budget_bytes=est.total_bytes - 1).ok
    # A tensor larger than a binding is split by rows (as the GPU executor does): only a row must fit one,
    # with a Q4_0 part's padding to whole groups of the int8 route's layout (144 bytes)
    small = estimate(spec, header.tensors, context=100, chunk=8)       # steps of 8 tokens: small activations
    row = 576 + group_bytes(TensorType.Q4_0)
    limit = max(small.kv_layer_bytes, small.largest_activation, row)
    assert small.widest_row == ("a", row) and limit < small.largest_tensor.nbytes and fits(small, max_binding_bytes=limit).ok
    narrow = fits(est, budget_bytes=est.total_bytes - 1, max_binding_bytes=575)
    assert not narrow.ok and "shorter context" in narrow.reasons[0] and "'a'" in narrow.reasons[1]
    assert any("KV cache" in r for r in narrow.reasons) and any("prefill chunk" in r for r in narrow.reasons)


def test_auto_prefers_the_longest_context_then_less_rounding():
    spec = spec_of("llama", {"attention.head_count_kv": 2, "context_length": 4096})
    header = read_header(raw_gguf([kv_str("general.architecture", "llama")],
                                  [tensor_info("a", (1024, 256), TensorType.Q4_0, 0), tensor_info("b", (64,), TensorType.F32, 147456)]))
    total = {t: estimate(spec, header.tensors, context=4096, kv_type=t).total_bytes for t in KV_TYPES}
    assert total["f32"] > total["f16"] > total["q8"] > total["q4"]

    def pick(budget):
        choice = auto.choose(spec, header.tensors, budget_bytes=budget, context=4096, fixed_context=False)
        return None if choice is None else (choice.context, choice.kv_type)

    assert pick(total["f32"]) == (4096, "f32")
    assert pick(total["f32"] - 1) == (4096, "f16")
    assert pick(total["f16"] - 1) == (4096, "q8")
    # q4 kept retrieval up to 4096 (auto.SAFE_UP_TO): where q8 does not fit there, q4 does
    assert pick(total["q8"] - 1) == (4096, "q4")
    # half the context: f32 and f16 (a quarter of f32's 4096 bytes, more than q4's sixth) would not fit, q8 does
    assert pick(total["q4"] - 1) == (2048, "q8")
    assert pick(estimate(spec, header.tensors, context=2048, kv_type="q8").total_bytes - 1) == (2048, "q4")
    assert pick(estimate(spec, header.tensors, context=512, kv_type="q8").total_bytes) == (512, "q8")
    assert pick(estimate(spec, header.tensors, context=512, kv_type="q8").total_bytes - 1) == (512, "q4")
    assert pick(estimate(spec, header.tensors, context=512, kv_type="q4").total_bytes - 1) is None
    # past the longest context q4 was measured at, auto does not take it; a named type is always kept
    assert auto.kv_types_at("auto", 4096) == ("f32", "f16", "q8", "q4")
    assert auto.kv_types_at("auto", 8192) == ("f32", "f16", "q8") and auto.kv_types_at("q4", 32768) == ("q4",)
