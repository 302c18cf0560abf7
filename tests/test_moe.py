"""Mixtures of experts on tiny random models of every MoE architecture (qwen2moe with its gated shared
expert, qwen3moe, olmoe, Mixtral-style llama; gemma4's in its greedy and llama.cpp top-1 checks, with the
dense gemma4 there too, the rest in tests/test_gemma4.py): the GPU executor natively against the reference, on both
arithmetic routes, whole and split by experts; greedy decoding; the memory plan; llama.cpp's top-1 on
the F32 copies (the fixture, tests/test_tiny_llamacpp.py, checks the reference on every type)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.gpu.kernels import I8_TOKEN_TYPES
from pyshim.gguf.header import read_header_from_file
from pyshim.gguf.spec import ModelSpec
from pyshim.plan.memory import estimate, per_token
from pyshim.plan.settings import Arithmetic
from runners import Drive, assert_greedy_like_reference, gpu, reference
from test_gpu_executor import assert_like_emulation, gpu_runner, ref_logits

F32, INT8 = Arithmetic.F32, Arithmetic.INT8
# every MoE architecture, and every weight type at least once among them
CASES = [("qwen2moe", "Q4_0"), ("qwen3moe", "Q4_K"), ("olmoe", "Q8_0"), ("mixtral", "Q5_K"), ("qwen3moe", "Q6_K"),
         ("olmoe", "Q4_1"), ("mixtral", "Q5_0"), ("qwen2moe", "F16"), ("olmoe", "F32")]
FX = json.loads(tiny_models.FIXTURE.read_text())


def tiny(tmp_path_factory, arch, qtype_name):
    return tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype_name])


def expert_dispatches(drive: Drive) -> list:
    return [d for p in drive.runner._programs.values() for d in p.dispatches if "EXPERTS" in dict(d.key.defines)]


@pytest.mark.parametrize("arch, qtype", CASES, ids=[f"{a}-{q}" for a, q in CASES])
def test_all_logits_match_reference(tmp_path_factory, loop, device, arch, qtype):
    path = tiny(tmp_path_factory, arch, qtype)
    want = ref_logits(path)
    drive = gpu_runner(loop, device, path, arithmetic=F32)
    got = drive.logits(tiny_models.test_ids(), all_logits=True)
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)
    assert expert_dispatches(drive), "the experts ran through something other than the expert matvecs"


@pytest.mark.parametrize("arch, qtype", CASES[:7], ids=[f"{a}-{q}" for a, q in CASES[:7]])
def test_int8_all_logits_match_llama_cpp_emulation(tmp_path_factory, loop, device, arch, qtype):
    path = tiny(tmp_path_factory, arch, qtype)
    want, plain = ref_logits(path, INT8), ref_logits(path)
    drive = gpu_runner(loop, device, path, arithmetic=INT8)
    got = drive.logits(tiny_models.test_ids(), all_logits=True)
    assert any(d.key.family == "matvec_i8" for d in expert_dispatches(drive))
    if QT[qtype] in I8_TOKEN_TYPES:     # the prompt's pairs grouped by expert, several per weight block
        assert any("GROUPED" in dict(d.key.defines) for d in expert_dispatches(drive))
    assert_like_emulation(got, want, plain)


@pytest.mark.parametrize("arch, qtype, reduce", [("olmoe", "Q8_0", False), ("qwen2moe", "Q4_K", True),
                                                 ("mixtral", "Q4_0", True)])
def test_split_by_experts_chunked_prefill_then_decode(tmp_path_factory, loop, device, arch, qtype, reduce):
    """Expert tensors split into parts of whole experts (a 150 kB binding: 2-4 experts a part), prompts in
    steps of 3 tokens, then one token at a time, on the CPU-adapter kernels (int8 route) or the real-GPU
    ones (`reduce`: workgroup reductions, split attention): every step's logits equal the reference's."""
    path = tiny(tmp_path_factory, arch, qtype)
    ids = tiny_models.test_ids() + [5, 77, 300, 9]
    int8 = not reduce
    want = Drive(reference(path, context=tiny_models.N_CTX, arithmetic=INT8 if int8 else F32)).logits(ids, all_logits=True)
    plain = Drive(reference(path, context=tiny_models.N_CTX)).logits(ids, all_logits=True)
    policy = dict(reduce=True, attn_splits=5, attn_lanes=32, tiled_attention=True) if reduce else {}
    drive = gpu_runner(loop, device, path, chunk=3, max_binding=150_000, policy=policy, arithmetic=INT8 if int8 else F32)
    exps = [w for name, w in drive.runner.ops.slots.slots.items() if "_exps." in name]
    assert exps and all(len(w.parts) > 1 for w in exps)
    split = 10
    got = [drive.logits(ids[:split])]
    for pos in range(split, len(ids)):
        got.append(drive.logits([ids[pos]], pos))
    got = np.stack(got)
    if int8:
        assert_like_emulation(got, want[split - 1:], plain[split - 1:])
    else:
        np.testing.assert_allclose(got, want[split - 1:], atol=2e-4 * np.abs(want).max(), rtol=1e-3)
    # expert choice is data: one decode program served every position, whatever the router picked
    assert sum(1 for (n, *_) in drive.runner._programs if n == 1) == 1


@pytest.mark.parametrize("arch", tiny_models.MOE_ARCHS + tiny_models.GEMMA4_ARCHS)
def test_gpu_top1_is_llama_cpps_on_the_f32_copies(tmp_path_factory, loop, device, arch):
    entry = FX["models"][f"{arch}-F32"]
    path = tiny(tmp_path_factory, arch, "F32")
    assert tiny_models.sha256(path) == entry["sha256"]
    got = gpu_runner(loop, device, path, arithmetic=F32).logits(FX["ids"], all_logits=True)
    assert np.array_equal(got.argmax(axis=1), np.array(entry["top_ids"])[:, 0])


@pytest.mark.parametrize("arch, qtype", [("qwen2moe", "Q4_K"), ("olmoe", "Q4_0"), ("gemma4moe", "Q4_K")])
def test_greedy_32_tokens_equal_reference(tmp_path_factory, loop, device, arch, qtype):
    path = tiny(tmp_path_factory, arch, qtype)
    ref = reference(path, context=tiny_models.N_CTX, arithmetic=INT8)
    drive = gpu_runner(loop, device, path, arithmetic=INT8)
    assert_greedy_like_reference(ref, drive.runner, tiny_models.test_ids()[:6], 32, loop)


def test_memory_plan_counts_experts_and_active_bytes(tmp_path_factory, loop, device):
    path = tiny(tmp_path_factory, "qwen2moe", "Q4_K")
    header = read_header_from_file(path)
    spec = ModelSpec.from_header(header)
    plan = estimate(spec, header.tensors, context=tiny_models.N_CTX, chunk=4)
    drive = gpu_runner(loop, device, path, chunk=4)
    drive.logits(tiny_models.test_ids())
    used = drive.runner.ops.memory()
    assert abs(used["weights"] - plan.weight_bytes) <= 0.01 * plan.weight_bytes
    # a decode token reads the shared weights, one embedding row and the 4 experts of 8 it is routed to
    token = per_token(spec, header.tensors)
    experts = sum(t.nbytes for t in header.tensors if "_exps." in t.name)
    embd = header.tensor("token_embd.weight").nbytes
    assert not spec.tied_output
    assert token.read_bytes == plan.weight_bytes - embd + embd // spec.n_vocab - experts + experts * 4 // 8
    assert drive.runner.weight_bytes == token.read_bytes
    assert token.active_params < token.total_params


def test_router_ids_and_weights_on_the_gpu_equal_the_reference(tmp_path_factory, loop, device):
    """The router kernel alone: softmax, top-k (descending), renormalization — against ReferenceOps.route."""
    from pyshim.exec.reference import ReferenceOps
    from pyshim.gpu.ops import GpuOps
    from pyshim.models.ops import RouterSpec

    ops: GpuOps = gpu_runner(loop, device, tiny(tmp_path_factory, "olmoe", "F32")).runner.ops
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((5, 64)).astype(np.float32) * 3
    for spec in (RouterSpec(64, 8, "softmax", norm=True), RouterSpec(64, 6, "softmax", norm=False, scale=2.5),
                 RouterSpec(64, 4, "sigmoid", norm=True)):
        want_w, want_ids = ReferenceOps.route(None, logits, spec)
        got_w, got_ids = loop.run_until_complete(_run_route(ops, logits, spec))
        assert np.array_equal(got_ids, want_ids)
        np.testing.assert_allclose(got_w, want_w, rtol=2e-6, atol=1e-7)


async def _run_route(ops, logits, spec):
    """The router's one dispatch, recorded by ops.route, run with its outputs in buffers of their own."""
    from pyshim.gpu.program import Tensor

    n, e = logits.shape
    buf = ops.allocator.buffer(logits.nbytes, "logits")
    ops.device.write(buf, logits)
    program = ops.begin(n)
    ops.route(Tensor(buf, 0, (n, e)), spec)
    ops.end()
    (dispatch,) = program.dispatches
    out_i, out_w = (ops.allocator.buffer(n * spec.n_used * 4, label) for label in ("ids", "weights"))
    dispatch.bindings = [buf, out_i, out_w]
    await program.build(ops.device, ops.kernels, ops.pool)
    ops.device.submit(program.ready, label="route")
    w = np.frombuffer(await ops.device.read(out_w, n * spec.n_used * 4), np.float32).reshape(n, spec.n_used)
    i = np.frombuffer(await ops.device.read(out_i, n * spec.n_used * 4), np.uint32).reshape(n, spec.n_used)
    return w, i.astype(np.int64)
