"""The GPU executor inside the site's engine Worker: Pyodide + WebGPU (SwiftShader here) through the
browser face, against the NumPy reference run in the same Worker, on tiny random models: the f32 kernels
against the plain reference, the int8 route (SwiftShader's default) against the reference's emulation of
llama.cpp's rounding, judged as in tests/test_gpu_executor.py (assert_like_emulation)."""

from __future__ import annotations

import base64

import pytest

import harness
import tiny_models

pytestmark = pytest.mark.browser

# (qwen2moe: a mixture of experts — the router, the expert matvecs and the gated shared expert; gemma4moe:
# per-layer head sizes, weightless value norms, experts beside the dense MLP with per-expert scales — its F32
# copy, against llama.cpp's top-1 too. On SwiftShader the int8 route of the tiny Gemmas drifts from the
# emulation by ~0.05-0.1 from the second position on, gemma3's as gemma4's (its exp and tanh, the note above):
# a router's near-ties then pick other experts, so the quantized gemma4moe is checked natively only.)
CASES = [("llama", "Q4_1"), ("gemma3", "Q5_0"), ("qwen2", "Q6_K"), ("qwen2moe", "Q4_K"), ("olmoe", "F32"),
         ("gemma4moe", "F32")]
RTOL = 1e-3
# lavapipe meets 2e-4 of the logits' scale; SwiftShader's exp/tanh are less exact (WGSL allows it) and the
# tiny Gemma 3 (GELU-tanh, attention and final softcaps) measured 2.6e-4 there: bound at 5e-4.
ATOL_OF_SCALE = 5e-4

RUN = """
import base64, json
import numpy as np
from pyshim.gguf.header import read_header
from pyshim.gguf.tensors import BufferSource
from pyshim.exec.gpu_runner import load_gpu
from pyshim.exec.loading import load_reference
from pyshim.exec.runner import Step, Want
from pyshim.plan.settings import RunSettings

RTOL = {rtol}
data = base64.b64decode({b64!r})
header = read_header(data, file_size=len(data))
ids = {ids!r}
arithmetic = "int8" if {int8} else "f32"
runner = await load_gpu(header=header, source=BufferSource(data), settings=RunSettings(context={n_ctx}, prefill_chunk=4,
                        arithmetic=arithmetic), policy={policy})
got = np.concatenate([(await runner.step(Step.of(ids[at:at + 4], at, want=Want.ALL_LOGITS)))[0].logits for at in range(0, len(ids), 4)])
ref = lambda a: load_reference(header=header, source=BufferSource(data), settings=RunSettings(context={n_ctx}, arithmetic=a))
want = ref(arithmetic).logits(ids, all_logits=True)
plain = ref("f32").logits(ids, all_logits=True)
last = (len(ids) - 1) // 4 * 4
for at in range(0, last, 4):
    await runner.step(Step.of(ids[at:at + 4], at, want=Want.NONE))
greedy = (await runner.step(Step.of(ids[last:], last, want=Want.ARGMAX)))[0].token
json.dumps({{"face": runner.device.caps.face, "adapter": runner.device.caps.summary(), "int8": runner.ops.policy.int8,
            "subgroup": runner.ops.policy.subgroup,
            "max_err": float(np.abs(got - want).max()), "scale": float(np.abs(want).max()),
            "excess": float((np.abs(got - want) - RTOL * np.abs(want)).max()),
            "effect": float(np.abs(plain - want).max()),
            "same_argmax": bool((got.argmax(-1) == want.argmax(-1)).all()),
            "greedy": greedy, "argmax": int(np.argmax(want[-1])), "shape": list(got.shape),
            "top1": got.argmax(-1).tolist()}})
"""


# both arithmetic routes for each case, but the int8 route only where it rounds something (quantized weights)
RUNS = [(a, q, int8) for a, q in CASES for int8 in (False, True) if not (int8 and q == "F32")]


@pytest.mark.parametrize("arch, qtype, int8", RUNS, ids=[f"{a}-{q}-{'int8' if i else 'f32'}" for a, q, i in RUNS])
def test_gpu_executor_in_the_worker_matches_reference(site_page, tmp_path_factory, arch, qtype, int8):
    from gguf import GGMLQuantizationType as QT

    page, _, _ = site_page
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype])
    ids = tiny_models.test_ids()
    code = RUN.format(b64=base64.b64encode(path.read_bytes()).decode(), ids=ids, n_ctx=tiny_models.N_CTX, rtol=RTOL,
                      int8=int8, policy="{}")
    result = harness.engine_request(page, "exec", {"code": code})
    assert result["face"] == "browser" and result["int8"] == int8
    assert result["shape"] == [len(ids), tiny_models.N_VOCAB]
    if int8:
        assert result["same_argmax"] and result["max_err"] < result["effect"], str(result)
    else:
        assert result["excess"] <= ATOL_OF_SCALE * result["scale"], str(result)
    assert result["greedy"] == result["argmax"]
    if qtype == "F32":          # the F32 copy: llama.cpp's own top-1 at every position (its fixture)
        import json

        entry = json.loads(tiny_models.FIXTURE.read_text())["models"][f"{arch}-{qtype}"]
        assert result["top1"] == [row[0] for row in entry["top_ids"]]


def test_subgroup_kernels_in_the_worker_match_reference(site_page, tmp_path_factory):
    """The real-GPU kernels with subgroups (matvec, rmsnorm, argmax), forced on SwiftShader through the
    browser face: the 'subgroups' device feature and Tint's `enable subgroups;`."""
    from gguf import GGMLQuantizationType as QT

    page, _, _ = site_page
    # (gemma3 as CASES has it: with Q4_K the tiny Gemma misses ATOL_OF_SCALE on SwiftShader under every
    # variant alike, 6.6e-4 measured, its exp/tanh again)
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp("gemma3"), "gemma3", QT.Q5_0)
    ids = tiny_models.test_ids()
    code = RUN.format(b64=base64.b64encode(path.read_bytes()).decode(), ids=ids, n_ctx=tiny_models.N_CTX, rtol=RTOL,
                      int8=False, policy='{"subgroup": True}')
    result = harness.engine_request(page, "exec", {"code": code})
    assert result["face"] == "browser" and result["subgroup"] and not result["int8"], str(result)
    assert result["excess"] <= ATOL_OF_SCALE * result["scale"], str(result)
    assert result["greedy"] == result["argmax"]


ROW_GROUPS = """
import base64, json
import numpy as np
from pyshim.gguf.header import read_header
from pyshim.gguf.tensors import BufferSource
from pyshim.exec.gpu_runner import load_gpu
from pyshim.exec.runner import Step, Want
from pyshim.plan.settings import RunSettings

data = base64.b64decode({b64!r})
header = read_header(data, file_size=len(data))
ids = {ids!r}
out = {{}}
for group in (1, 8):
    runner = await load_gpu(header=header, source=BufferSource(data), settings=RunSettings(context={n_ctx}, prefill_chunk=4,
                            arithmetic="int8"), policy={{"row_group": group}})
    logits = np.concatenate([(await runner.step(Step.of(ids[at:at + 4], at, want=Want.ALL_LOGITS)))[0].logits
                             for at in range(0, len(ids), 4)])
    out[group] = (logits, sorted({{w.row_group for w in runner.ops.slots.slots.values() if w.parts}}))
    runner.close()
json.dumps({{"face": runner.device.caps.face, "groups": out[8][1], "flat": out[1][1], "scale": float(np.abs(out[1][0]).max()),
            "max_diff": float(np.abs(out[8][0] - out[1][0]).max())}})
"""


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_row_groups_in_the_worker_change_no_logit(site_page, tmp_path_factory, qtype):
    """lavapipe's row-interleaved layout (KernelPolicy.row_group_for: interleave.wgsl at load through the
    browser face's copies and submits, then matvec_i8 and embed reading it), forced on SwiftShader: Tint
    compiles it, and the int8 logits equal the file layout's bit for bit, as natively."""
    from gguf import GGMLQuantizationType as QT

    page, _, _ = site_page
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp("qwen2"), "qwen2", QT[qtype])
    code = ROW_GROUPS.format(b64=base64.b64encode(path.read_bytes()).decode(), ids=tiny_models.test_ids(), n_ctx=tiny_models.N_CTX)
    result = harness.engine_request(page, "exec", {"code": code})
    assert result["face"] == "browser" and result["flat"] == [1] and result["scale"] > 0, str(result)
    assert result["groups"] == [8 if qtype == "Q4_K" else 4], str(result)
    assert result["max_diff"] == 0.0, str(result)


GREEDY = """
import base64, json
from pyshim.gguf.header import read_header
from pyshim.gguf.tensors import BufferSource
from pyshim.exec.gpu_runner import load_gpu
from pyshim.exec.loading import load_reference
from pyshim.exec.runner import Step, Want
from pyshim.plan.settings import RunSettings

data = base64.b64decode({b64!r})
header = read_header(data, file_size=len(data))
settings = RunSettings(context={n_ctx}, arithmetic="f32")

async def greedy(runner, prompt, n):
    out = [(await runner.step(Step.of(prompt, 0, want=Want.ARGMAX)))[0].token]
    while len(out) < n:
        out.append((await runner.step(Step.of([out[-1]], len(prompt) + len(out) - 1, want=Want.ARGMAX)))[0].token)
    return out

gpu = await load_gpu(header=header, source=BufferSource(data), settings=settings)
ref = load_reference(header=header, source=BufferSource(data), settings=settings)
json.dumps({{"gpu": await greedy(gpu, {prompt!r}, {n}), "ref": await greedy(ref, {prompt!r}, {n})}})
"""


def test_gemma4_mixture_greedy_32_tokens_in_the_worker_equal_reference(site_page, tmp_path_factory):
    """Gemma 4's mixture on WebGPU in the page: 32 greedy tokens (f32), the reference's in the same Worker —
    through the sliding layers' rings wrapping and the full layer's growing cache."""
    from gguf import GGMLQuantizationType as QT

    page, _, _ = site_page
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp("gemma4moe"), "gemma4moe", QT.F32)
    code = GREEDY.format(b64=base64.b64encode(path.read_bytes()).decode(), n_ctx=tiny_models.N_CTX,
                         prompt=tiny_models.test_ids()[:6], n=32)
    result = harness.engine_request(page, "exec", {"code": code})
    assert result["gpu"] == result["ref"] and len(result["ref"]) == 32, result
