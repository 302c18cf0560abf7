"""Gemma 4 (`gemma4`) on tiny random models shaped like its 31B (dense) and 26B-A4B (a mixture): what the
header says, the GPU executor natively and the CPU engine against the reference, streaming, the memory
plan, "will it fit?" at full size, and refusals by name of what is not run yet (E2B/E4B's shared KV layers
and per-layer embeddings). llama.cpp's logits for every weight type are checked by
tests/test_tiny_llamacpp.py, the GPU's top-1 on the F32 copies and greedy decoding by tests/test_moe.py,
Chromium by tests/test_gpu_browser.py."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.errors import UnsupportedError
from pyshim.exec.wasm_runner import load_wasm
from pyshim.gguf.header import read_header_from_file
from pyshim.gguf.spec import ModelSpec
from pyshim.plan.memory import estimate, kv_cache_bytes, paged_kv_bytes
from pyshim.plan.settings import KV_PAGE, Arithmetic, RunSettings
from runners import Drive, reference
from site_helpers import written_header
from test_gpu_executor import assert_like_emulation, gpu_runner, ref_logits

F32, INT8 = Arithmetic.F32, Arithmetic.INT8
# both shapes, and every family of weight type among them
CASES = [("gemma4", "Q4_K"), ("gemma4moe", "Q8_0"), ("gemma4", "Q6_K"), ("gemma4moe", "Q5_K"), ("gemma4moe", "Q4_0"),
         ("gemma4moe", "F32")]


def tiny(tmp_path_factory, arch, qtype_name, **kw):
    return tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype_name], **kw)


def test_the_header_gives_each_layer_its_heads_rope_and_norms(tmp_path_factory):
    spec = ModelSpec.from_header(read_header_from_file(tiny(tmp_path_factory, "gemma4moe", "Q4_K")))
    swa, full = tiny_models.GEMMA4_HEAD_DIM
    assert spec.swa_layers == tiny_models.GEMMA_SWA_LAYERS
    assert [spec.head_dims(il) for il in range(3)] == [(swa, swa), (swa, swa), (full, full)]
    assert [spec.kv_heads(il) for il in range(3)] == [4, 4, 1] and not spec.uniform_kv
    assert [spec.kv_row(il) for il in range(3)] == [(4 * swa,) * 2, (4 * swa,) * 2, (full, full)]
    assert (spec.rope.dims, spec.rope.base, spec.rope_swa.dims, spec.rope_swa.base) == (full, 10000.0, swa, 10000.0)
    assert spec.attn_scale == 1.0 and spec.v_norm and not spec.swa_rope_factors
    assert spec.final_logit_softcap == 30.0          # no key in the file: llama.cpp's default
    assert (spec.n_experts, spec.n_experts_used, spec.n_ff_expert, spec.n_ff) == (8, 2, 256, 512)
    assert spec.moe_beside_dense and spec.fused_gate_up_exps and spec.expert_norm
    assert spec.keys_as_values == (False, False, True) and spec.layer_output_scale   # the full layer has no attn_v


@pytest.mark.parametrize("key, words", [("attention.shared_kv_layers", ["reuse earlier layers' KV caches", "E2B/E4B"]),
                                        ("embedding_length_per_layer_input", ["per-layer token embeddings", "E2B/E4B"])])
def test_what_is_not_run_yet_is_refused_by_name(tmp_path_factory, key, words):
    path = tiny(tmp_path_factory, "gemma4", "Q4_0", keys={key: 2})
    with pytest.raises(UnsupportedError) as err:
        ModelSpec.from_header(read_header_from_file(path))
    assert all(w in str(err.value) for w in words) and key in str(err.value), err.value


@pytest.mark.parametrize("arch, qtype", CASES, ids=[f"{a}-{q}" for a, q in CASES])
def test_gpu_all_logits_match_reference(tmp_path_factory, loop, device, arch, qtype):
    path = tiny(tmp_path_factory, arch, qtype)
    want = ref_logits(path)
    got = gpu_runner(loop, device, path, arithmetic=F32).logits(tiny_models.test_ids(), all_logits=True)
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)


# (the K-quants run the emulation's logits exactly here; Q8_0's differ by an int8 step's flips, as on the
# other architectures: test_gpu_executor.assert_like_emulation)
@pytest.mark.parametrize("arch, qtype", CASES[:4], ids=[f"{a}-{q}" for a, q in CASES[:4]])
def test_gpu_int8_route_matches_llama_cpp_emulation(tmp_path_factory, loop, device, arch, qtype):
    path = tiny(tmp_path_factory, arch, qtype)
    want, plain = ref_logits(path, INT8), ref_logits(path)
    got = gpu_runner(loop, device, path, arithmetic=INT8).logits(tiny_models.test_ids(), all_logits=True)
    assert_like_emulation(got, want, plain)


@pytest.mark.parametrize("reduce", [False, True], ids=["cpu-kernels", "gpu-kernels"])
def test_small_steps_and_one_token_decode_wrap_the_rings(tmp_path_factory, loop, device, reduce):
    """Prompts in steps of 3 tokens then one token at a time: the sliding layers' rings of 64-wide heads
    wrap many times beside the full layer's 128-wide one; every step's logits equal the reference's."""
    path = tiny(tmp_path_factory, "gemma4moe", "Q4_K")
    ids = tiny_models.test_ids() + [5, 77, 300, 9]
    want = Drive(reference(path, context=tiny_models.N_CTX)).logits(ids, all_logits=True)
    policy = dict(reduce=True, attn_splits=5, attn_lanes=32, tiled_attention=True) if reduce else {}
    drive = gpu_runner(loop, device, path, chunk=3, policy=policy, arithmetic=F32)
    got = [drive.logits(ids[:10])] + [drive.logits([ids[pos]], pos) for pos in range(10, len(ids))]
    np.testing.assert_allclose(np.stack(got), want[9:], atol=2e-4 * np.abs(want).max(), rtol=1e-3)


@pytest.mark.parametrize("arch, qtype", [("gemma4", "Q5_K"), ("gemma4moe", "Q4_K")])
def test_cpu_engine_matches_reference(tmp_path_factory, arch, qtype):
    path = tiny(tmp_path_factory, arch, qtype)
    want = ref_logits(path)
    runner = load_wasm(path, settings=RunSettings(context=tiny_models.N_CTX, arithmetic=F32))
    got = Drive(runner).logits(tiny_models.test_ids(), all_logits=True)
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)


def test_memory_plan_counts_each_layers_cache(tmp_path_factory, loop, device):
    """The plan's KV bytes are each layer's own (heads of 64 and 128, four KV heads and one), as allocated."""
    path = tiny(tmp_path_factory, "gemma4moe", "Q4_K")
    header = read_header_from_file(path)
    spec = ModelSpec.from_header(header)
    n, ring = tiny_models.N_CTX, tiny_models.GEMMA_WINDOW + 4 - 1        # a sliding layer: its window and a step
    plan = estimate(spec, header.tensors, context=n, chunk=4)
    swa, full = tiny_models.GEMMA4_HEAD_DIM
    swa_row, full_row = 2 * 4 * 4 * swa, 2 * 4 * 1 * full       # k and v, f32, per position
    assert plan.kv_bytes == kv_cache_bytes(spec, n, chunk=4) == 2 * swa_row * ring + full_row * n
    # the GPU's pages: whole pages of 16 positions (the sliding layers' rings one page each)
    used = gpu_runner(loop, device, path, chunk=4).runner.ops.memory()
    assert used["kv"] == paged_kv_bytes(spec, n, chunk=4) == 2 * swa_row * KV_PAGE + full_row * n
    assert abs(used["weights"] - plan.weight_bytes) <= 0.01 * plan.weight_bytes


@pytest.mark.parametrize("stream", [{"expert_slots": 3}, {"streamed_layers": 2}], ids=["experts", "layers"])
def test_streamed_experts_and_layers_give_the_resident_logits(tmp_path_factory, loop, device, stream):
    """26B-A4B is 4x a browser's GPU budget: its experts (or its last layers) stream from the store. The
    router's per-expert scales follow each chosen expert into its cache slot."""
    path = tiny(tmp_path_factory, "gemma4moe", "Q8_0")
    ids = tiny_models.test_ids()
    streamed = gpu_runner(loop, device, path, arithmetic=F32, **stream)
    step = streamed.runner.capacity.max_step_tokens      # (experts: steps of as many tokens as the cache serves)
    want = gpu_runner(loop, device, path, arithmetic=F32, chunk=step).logits(ids, all_logits=True)
    np.testing.assert_array_equal(streamed.logits(ids, all_logits=True), want)
    assert (streamed.runner.ops.expert_cache or streamed.runner.ops.layer_stream) is not None


def gemma4_26b_header(path) -> tuple[bytes, int]:
    """(header bytes, the full file's size) of a GGUF with Gemma 4 26B-A4B's shape as its config gives it
    (30 layers, 5 sliding : 1 full; heads 256 wide with 8 KV heads, 512 with 2; 128 experts of 704, 8 a
    token, beside a dense MLP of 2112; vocabulary 262144) in Q4_K (the down projections, whose rows are not
    whole 256-blocks, in Q5_0, as llama.cpp's quantizer falls back), F32 norms and router, without its data."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, GGUFWriter

    n_layers, d, heads, vocab, experts, ff, ff_exp = 30, 2816, 16, 262144, 128, 2112, 704
    local = [il % 6 != 5 for il in range(n_layers)]
    writer = GGUFWriter(str(path), "gemma4")
    writer.add_name("Gemma-4-26B-A4B-shaped header")
    writer.add_context_length(262144)
    writer.add_embedding_length(d)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(ff)
    writer.add_expert_feed_forward_length(ff_exp)
    writer.add_expert_count(experts)
    writer.add_expert_used_count(8)
    writer.add_head_count(heads)
    writer.add_array("gemma4.attention.head_count_kv", [8 if s else 2 for s in local])
    writer.add_key_length(512)
    writer.add_value_length(512)
    writer.add_uint32("gemma4.attention.key_length_swa", 256)
    writer.add_uint32("gemma4.attention.value_length_swa", 256)
    writer.add_rope_dimension_count(512)
    writer.add_uint32("gemma4.rope.dimension_count_swa", 256)
    writer.add_rope_freq_base(1e6)
    writer.add_float32("gemma4.rope.freq_base_swa", 1e4)
    writer.add_sliding_window(1024)
    writer.add_array("gemma4.attention.sliding_window_pattern", local)
    writer.add_uint32("gemma4.embedding_length_per_layer_input", 0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocab)

    def tensor(name: str, shape, kind=T.Q4_K) -> None:
        per_block, block_bytes = GGML_QUANT_SIZES[kind]
        writer.add_tensor_info(name, shape, np.float32, int(np.prod(shape)) // per_block * block_bytes, raw_dtype=kind)

    tensor("token_embd.weight", (vocab, d))
    tensor("output_norm.weight", (d,), T.F32)
    tensor("rope_freqs.weight", (256,), T.F32)
    for il, s in enumerate(local):
        p, hd, kv = f"blk.{il}.", (256 if s else 512), (8 if s else 2)
        tensor(p + "attn_q.weight", (heads * hd, d))
        tensor(p + "attn_k.weight", (kv * hd, d))
        if s:
            tensor(p + "attn_v.weight", (kv * hd, d))
        tensor(p + "attn_output.weight", (d, heads * hd))
        for name in ("ffn_gate", "ffn_up"):
            tensor(p + name + ".weight", (ff, d))
        tensor(p + "ffn_down.weight", (d, ff), T.Q5_0)
        tensor(p + "ffn_gate_inp.weight", (experts, d), T.F32)
        tensor(p + "ffn_gate_up_exps.weight", (experts, 2 * ff_exp, d))
        tensor(p + "ffn_down_exps.weight", (experts, d, ff_exp), T.Q5_0)
        for name, n in (("attn_q_norm.weight", hd), ("attn_k_norm.weight", hd), ("ffn_down_exps.scale", experts),
                        ("layer_output_scale.weight", 1)):
            tensor(p + name, (n,), T.F32)
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "pre_ffw_norm_2", "post_ffw_norm_1",
                     "post_ffw_norm_2"):
            tensor(p + name + ".weight", (d,), T.F32)
        tensor(p + "ffn_gate_inp.scale", (d,), T.F32)
    return written_header(writer, path)


def test_a_26b_a4b_shaped_file_streams_its_experts_in_the_sites_4_gb(tmp_path):
    """Will it fit, from the header alone: the 26B-A4B shape (~15 GB at Q4_K) in the site's 4 GiB streams its
    routed experts (the shared weights, the dense MLPs and a cache of experts stay), with each layer's own
    cache: a full layer's 2 KV heads of 512 and a sliding one's 8 of 256, capped at its window."""
    from pyshim.plan.probe import probe

    data, size = gemma4_26b_header(tmp_path / "gemma4-26b.gguf")
    gpu = {"max_storage_buffer_binding_size": 1 << 30, "max_buffer_size": 1 << 30}
    out = probe(data, size, kv_type="auto", budget_bytes=4 << 30, judge=True, limits=gpu)
    assert out["supported"] and out["architecture"] == "gemma4", out.get("reason")
    assert 14e9 < size < 16e9 and out["experts"] == {"count": 128, "used": 8}
    assert out["weight_bytes"] < 4 << 30            # what stays on the GPU: the shared weights and the experts' cache
    assert out["auto"]["mode"] == "experts streamed" and out["fit"]["ok"], out["auto"]
    assert out["total_bytes"] <= 4 << 30 and out["expert_slots"] >= 16
    per_value = {"f32": 4, "f16": 2, "q8": 36 / 32, "q4": 20 / 32}[out["kv_type"]]
    n = out["context"]
    cache = lambda ring: per_value * 2 * (25 * 8 * 256 * min(n, ring) + 5 * 2 * 512 * n)    # noqa: E731
    # (a sliding layer holds its window and the positions a step writes ahead: at most a prefill chunk's)
    assert cache(1024) <= out["kv_bytes"] <= cache(1024 + 256 - 1), (out["kv_bytes"], cache(1024))
