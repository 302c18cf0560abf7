"""Dense layers streamed from the store through two rotating sets of GPU buffers (pyshim.gpu.layer_stream),
natively, on tiny random models: every logit equal bit for bit to the same model resident, in prompt steps
and in decode, with one, two or an odd number of layers streamed (the set the next step's first layer
goes into is the one the last layer used), on both arithmetic routes (Q8_0 re-grouped after each upload);
and the uploads counted: once per streamed layer per step, whatever the step's length."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.exec.runner import Want
from pyshim.plan.settings import Arithmetic
from runners import Drive, gpu

F32, INT8 = Arithmetic.F32, Arithmetic.INT8
CASES = [("llama", "Q4_0", INT8, 1), ("qwen2", "Q8_0", INT8, 2), ("gemma3", "Q4_K", F32, 3), ("llama", "Q6_K", F32, 2)]


@pytest.mark.parametrize("arch, qtype, arithmetic, streamed", CASES, ids=[f"{a}-{q}-{m.value}-{n}" for a, q, m, n in CASES])
def test_streamed_layers_equal_the_resident_model(tmp_path_factory, loop, device, arch, qtype, arithmetic, streamed):
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype])
    load = lambda **kw: Drive(loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, device=device,  # noqa: E731
                                                          arithmetic=arithmetic, chunk=8, **kw)), loop)
    streamed_drive, resident = load(streamed_layers=streamed), load()
    stream = streamed_drive.runner.ops.layer_stream
    n_layers = streamed_drive.runner.spec.n_layers
    assert stream.layers == list(range(n_layers - streamed, n_layers))
    resident_bytes = sum(w.ref.nbytes for n, w in resident.runner.ops.slots.slots.items()
                         if n.startswith("blk.") and len(w.shape) >= 2)
    assert stream.nbytes <= 2 * resident_bytes / n_layers * 1.01 + 2 * 272 * 8, "more than two layers' buffers"

    ids = tiny_models.test_ids()
    np.testing.assert_array_equal(streamed_drive.logits(ids, all_logits=True), resident.logits(ids, all_logits=True))
    steps = -(-len(ids) // 8)
    # each step uploads every streamed layer once (the first of them kept from the step before when it fits)
    assert stream.stats.uploads <= steps * streamed + 1
    before = stream.stats.uploads
    seq = list(ids[:10])
    for pos in range(10, 20):
        got = streamed_drive.step([seq[-1]], pos - 1, Want.LOGITS).logits
        want = resident.step([seq[-1]], pos - 1, Want.LOGITS).logits
        np.testing.assert_array_equal(got, want)
        seq.append(int(np.argmax(want)))
    # a decode token uploads the layers of every set that more than one streamed layer shares
    users = [[layer for layer in stream.layers if stream.set_of(layer) == s] for s in range(2)]
    assert (stream.stats.uploads - before) / 10 == sum(len(u) for u in users if len(u) > 1)
