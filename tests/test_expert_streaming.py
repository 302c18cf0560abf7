"""Routed experts streamed from the store into a GPU cache of a few slots per layer (pyshim.gpu.expert_cache),
natively, on tiny random MoE models: the cache's replacement rule, then a streamed model against the same
model fully resident — every logit equal bit for bit in steps of the same length, greedy tokens equal —
with the cache's hit rate and bytes counted, on both arithmetic routes (the int8 route's Q8_0 experts are
rearranged on the GPU after each upload); and the plan that streams a model 4x its budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.errors import UnsupportedError
from pyshim.gguf.header import read_header_from_file
from pyshim.gguf.spec import ModelSpec
from pyshim.gpu import expert_cache
from pyshim.gpu.expert_cache import LayerCache
from pyshim.exec.runner import Want
from pyshim.plan import auto
from pyshim.plan.memory import estimate
from pyshim.plan.settings import Arithmetic
from runners import Drive, gpu
from site_helpers import olmoe_header_gguf

F32, INT8 = Arithmetic.F32, Arithmetic.INT8


def test_least_recently_used_expert_goes_never_one_the_step_wants():
    layer = LayerCache("blk.0", n_slots=3, n_experts=8)
    slots, misses = layer.plan(np.array([[5, 2]]))
    assert [e for e, _ in misses] == [5, 2] and slots.tolist() == [[0, 1]]
    slots, misses = layer.plan(np.array([[2, 7]]))          # 2 hits; 7 takes the free slot
    assert misses == [(7, 2)] and slots.tolist() == [[1, 2]]
    slots, misses = layer.plan(np.array([[1, 2]]))          # 5 is the least recently used: 1 takes its slot
    assert misses == [(1, 0)] and slots.tolist() == [[0, 1]]
    slots, misses = layer.plan(np.array([[7], [5]]))        # 2 is now least recent (1 was used later)
    assert misses == [(5, 1)] and slots.tolist() == [[2], [1]]
    with pytest.raises(UnsupportedError, match="4 distinct experts"):
        layer.plan(np.array([[1, 2], [3, 4]]))


def test_a_layer_fetches_on_guesses_only_while_they_come_true():
    layer = LayerCache("blk.1", n_slots=4, n_experts=16)
    fetched = []
    for e in range(0, 12, 2):                   # guesses that come true earn trust: after three, they are fetched
        fetched.append(layer.plan_ahead(np.array([[e, e + 1]])))
        _, misses = layer.plan(np.array([[e + 1], [e]]))
        assert layer.checked == (2, 2) and misses == ([] if fetched[-1] else [(e + 1, misses[0][1]), (e, misses[1][1])])
    assert [len(f) for f in fetched] == [0, 0, 0, 2, 2, 2] and layer.trust > 0.5 and not layer.guessed
    assert list(layer.held) == [9, 8, 11, 10]
    assert [e for e, _ in layer.plan_ahead(np.array([[12, 13]]))] == [12, 13] and layer.guessed == {12, 13}
    _, misses = layer.plan(np.array([[11, 14]]))      # a wrong guess: 14 evicts 10, not a guessed expert
    assert layer.checked == (2, 0) and [e for e, _ in misses] == [14] and list(layer.held) == [12, 13, 11, 14]
    assert layer.guessed == {12, 13} and len(layer.plan_ahead(np.array([[1, 2]]))) == 2   # still trusted
    layer.plan(np.array([[11, 14]]))                 # wrong again: trust lost, guesses only noted now
    assert layer.trust < 0.5 and layer.plan_ahead(np.array([[3, 4]])) == [] and layer.noted == [3, 4]
    assert list(layer.held) == [1, 2, 11, 14] and layer.guessed == {1, 2}     # wrong guesses went first
    with pytest.raises(ValueError, match="a guess named experts"):
        layer.plan_ahead(np.array([[3, 1 << 30]]))


CASES = [("qwen2moe", "Q4_K", INT8, 5), ("olmoe", "Q8_0", INT8, 4), ("mixtral", "Q5_K", F32, 4),
         ("qwen3moe", "Q6_K", INT8, 6)]


@pytest.mark.parametrize("arch, qtype, arithmetic, slots", CASES, ids=[f"{a}-{q}-{m.value}" for a, q, m, _ in CASES])
def test_streamed_experts_equal_the_resident_model(tmp_path_factory, loop, device, arch, qtype, arithmetic, slots, monkeypatch):
    # every guess at the next layer's experts fetched, right or wrong: whatever the cache holds, the same logits
    monkeypatch.setattr(expert_cache, "GUESS_TRUST", 0.0)
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype])
    streamed = Drive(loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, device=device, arithmetic=arithmetic,
                                                 expert_slots=slots)), loop)
    step = streamed.runner.capacity.max_step_tokens
    assert step == max(1, slots // streamed.runner.spec.n_experts_used)
    resident = Drive(loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, device=device, arithmetic=arithmetic,
                                                 chunk=step)), loop)
    cache = streamed.runner.ops.expert_cache
    n_experts = streamed.runner.spec.n_experts
    resident_bytes = sum(w.ref.nbytes for n, w in resident.runner.ops.slots.slots.items() if "_exps." in n)
    assert cache.nbytes < resident_bytes * (slots + 1) / n_experts, "the cache holds more than its slots"

    ids = tiny_models.test_ids()
    got, want = streamed.logits(ids, all_logits=True), resident.logits(ids, all_logits=True)
    np.testing.assert_array_equal(got, want)
    stats = cache.stats
    assert 0 < stats.hits < stats.wanted
    # a layer's stop also fetched what the next layer's router applied to its input picked (a guess can
    # be wanted by a later step's router than the one it was made for)
    assert 0 < stats.guessed == stats.checked and stats.checked_right <= stats.guess_hits <= stats.guessed
    assert stats.ahead_bytes == stats.guessed * cache.expert_bytes
    assert stats.uploaded_bytes == (stats.wanted - stats.hits + stats.guessed) * cache.expert_bytes

    seq_s, seq_r = list(ids[:6]), list(ids[:6])
    token_s, token_r = streamed.greedy(seq_s), resident.greedy(seq_r)
    decode = None
    for _ in range(24):
        assert token_s == token_r, (seq_s[6:], token_r, token_s)
        seq_s.append(token_s)
        seq_r.append(token_r)
        token_s, token_r = streamed.greedy([token_s], len(seq_s) - 1), resident.greedy([token_r], len(seq_r) - 1)
        decode = decode or streamed.runner._programs[(1, Want.ARGMAX, False)]
    # one decode program served every token, whatever the cache held: expert choice stays data
    assert streamed.runner._programs[(1, Want.ARGMAX, False)] is decode and len(decode.stops) == streamed.runner.spec.n_layers


def test_the_guess_at_the_next_layer_is_its_router_on_this_layers_input(tmp_path, loop, device, monkeypatch):
    """What a stop reads back as the guess is the next layer's router choice for this layer's router input,
    as the reference computes it (f32 route: equal but for near-ties)."""
    from pyshim.exec.reference import ReferenceOps
    from runners import reference

    path = tiny_models.write_tiny_model(tmp_path, "mixtral", QT.Q8_0)
    want: dict[str, list] = {}

    def guess_route(self, x, gate_inp, spec):
        want.setdefault(gate_inp.ref.name.rsplit(".ffn_", 1)[0], []).append(self.route(self.matmul(x, gate_inp), spec)[1])
    monkeypatch.setattr(ReferenceOps, "guess_route", guess_route)
    streamed = Drive(loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, device=device, arithmetic=F32,
                                                 expert_slots=4)), loop)
    got: dict[str, list] = {}
    prefetch = streamed.runner.ops.expert_cache.prefetch

    async def recorded(layer, ids):
        got.setdefault(layer, []).append(ids.reshape(-1, streamed.runner.spec.n_experts_used).copy())
        await prefetch(layer, ids)
    streamed.runner.ops.expert_cache.prefetch = recorded
    ids = tiny_models.test_ids()[:12]
    streamed.logits(ids, all_logits=True)
    Drive(reference(path, context=tiny_models.N_CTX, arithmetic=F32), loop).logits(ids, all_logits=True)
    n_layers = streamed.runner.spec.n_layers
    assert sorted(got) == sorted(want) == [f"blk.{il}" for il in range(1, n_layers)]
    for layer in got:
        g, w = np.sort(np.concatenate(got[layer]), axis=1), np.sort(np.concatenate(want[layer]), axis=1)
        assert g.shape == w.shape == (len(ids), streamed.runner.spec.n_experts_used)
        assert (g == w).all(axis=1).mean() >= 0.9, (layer, g, w)


@pytest.fixture(scope="module")
def olmoe_header(tmp_path_factory):
    """An OLMoE-1B-7B-shaped GGUF (3.9 GB of Q4_0) with its data left sparse: enough to plan it."""
    path = tmp_path_factory.mktemp("olmoe") / "olmoe-header.gguf"
    _, size = olmoe_header_gguf(path)
    os.truncate(path, size)
    return path


def test_auto_streams_the_experts_of_a_model_4x_its_budget_and_says_why(olmoe_header):
    header = read_header_from_file(olmoe_header)
    spec = ModelSpec.from_header(header)
    budget = int(header.file_size / 4)
    choice = auto.choose(spec, header.tensors, budget_bytes=budget)
    slots = choice.expert_slots
    assert choice.mode == "experts streamed" and spec.n_experts_used <= slots < spec.n_experts
    assert choice.estimate.total_bytes <= budget
    # the cache has what the rest leaves: one more slot would not fit
    more = estimate(spec, header.tensors, context=choice.context, kv_type=choice.kv_type, expert_slots=slots + 1)
    assert more.total_bytes > budget
    assert choice.kv_type in auto.RETRIEVAL_SAFE
    assert "streams the routed experts" in choice.reason and "4.0x" in choice.reason and f"{slots} of each layer's 64" in choice.reason
    assert auto.choose(spec, header.tensors, budget_bytes=6 * 10**9).mode == "resident"
    assert auto.choose(spec, header.tensors, budget_bytes=300 * 10**6) is None       # not even one token's experts

    out = subprocess.run([sys.executable, "-m", "pyshim.cli", "inspect", str(olmoe_header), "--json", "--budget-mb", str(budget / 1e6)],
                         capture_output=True, text=True, check=True)
    fit = json.loads(out.stdout)["best_fit"]
    assert fit["mode"] == "experts streamed" and fit["expert_slots"] == slots and fit["reason"] == choice.reason


@pytest.mark.browser
def test_streamed_experts_in_the_browser_come_from_indexeddb(tmp_path, capsys):
    """`--backend browser`: the model stored in the page's IndexedDB, the Worker's expert cache filled from
    there (JS reads only the missed experts' ranges), greedy tokens those of the resident CPU reference."""
    from pyshim.cli import main

    model = tiny_models.write_tiny_model(tmp_path, "qwen2moe", QT.Q4_K)
    argv = ["generate", str(model), "--prompt", "hello", "--max-tokens", "16", "--ignore-eos", "--json", "--expert-slots", "5"]
    assert main(argv + ["--backend", "browser"]) == 0, capsys.readouterr().err
    browser = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(argv + ["--arithmetic", browser["arithmetic"]]) == 0      # the reference keeps every expert resident
    cpu = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert browser["ids"] == cpu["ids"] and len(browser["ids"]) == 16
    cache = browser["expert_cache"]
    assert cache["slots"] == 5 and cache["experts"] == tiny_models.N_EXPERTS
    assert 0 < cache["hits"] < cache["wanted"] and cache["uploaded_bytes"] > 0, cache
    assert browser["auto"]["mode"] == "experts streamed"


def test_a_failed_read_is_an_error_and_leaves_the_cache_consistent(tmp_path, loop, device):
    """The store failing under a stream (natively: the read raising) fails the step with its error; the
    experts it was loading are not counted as held, so the next steps load them again and still equal the
    resident model."""
    from pyshim.errors import StoreReadError

    path = tiny_models.write_tiny_model(tmp_path, "mixtral", QT.Q4_0)
    streamed = Drive(loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, device=device, expert_slots=4)), loop)
    resident = Drive(loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, device=device, chunk=2)), loop)
    cache = streamed.runner.ops.expert_cache
    good = cache.fetch

    async def failing(uploads):
        raise StoreReadError("the store went away")
    cache.fetch = failing
    with pytest.raises(StoreReadError, match="went away"):
        streamed.logits(tiny_models.test_ids()[:4])
    assert all(not layer.held and len(layer.free) == 4 for layer in cache.layers.values())
    cache.fetch = good
    ids = tiny_models.test_ids()
    np.testing.assert_array_equal(streamed.logits(ids, all_logits=True), resident.logits(ids, all_logits=True))


@pytest.mark.browser
def test_a_model_deleted_under_a_stream_is_a_clear_error_and_the_engine_goes_on(chromium, dev_server, tmp_path):
    """The page's Worker streams a tiny MoE's experts from IndexedDB; the model is deleted from the store
    (as another tab would) in the middle of a reply: the reply fails with a StoreReadError that says what
    happened, the next request on it is refused before any work (the model is gone), and the engine then
    runs the model stored again."""
    import harness
    from site_helpers import open_site, serve_bytes

    model = tiny_models.write_tiny_model(tmp_path, "qwen2moe", QT.Q4_K)
    data = model.read_bytes()
    context, page, _ = open_site(chromium, dev_server)
    try:
        for name in ("moe-a.gguf", "moe-b.gguf"):
            context.route(f"**/streamed/{name}", lambda route: serve_bytes(route, data))
        ids = tiny_models.test_ids()

        def complete(model_id, prompt, tokens=6, delete_at_token=False):
            # (every expert of a token takes a slot: with 4 slots for 4 experts a token, each new one is a miss)
            return page.evaluate("""async ([id, prompt, tokens, deleteAtToken]) => {
                const store = await import('./store/store.js');
                let deleted = null;
                const onEvent = (event) => { if (event === 'token' && deleteAtToken && !deleted) deleted = store.deleteModel(id); };
                try { return {ok: true, r: await window.pyshimEngine.request('complete', {model_id: id, prompt_ids: prompt,
                        settings: {expert_slots: 4, kv_type: 'auto'}, sampling: {temperature: 0, max_tokens: tokens, ignore_eos: true}},
                        {onEvent})}; }
                catch (e) { return {ok: false, name: e.name, message: e.message, hint: e.hint}; }
                finally { await deleted; } }""", [model_id, prompt, tokens, delete_at_token])

        first = page.evaluate(harness.STORE_JS, [dev_server.url + "streamed/moe-a.gguf", None])
        assert first["status"] == "ready", first
        done = complete(first["id"], ids[:5])
        assert done["ok"] and done["r"]["expert_cache"]["uploaded_bytes"] > 0, done
        failed = complete(first["id"], ids[5:20], tokens=40, delete_at_token=True)
        assert not failed["ok"] and failed["name"] == "StoreReadError", failed
        assert "could not be read from the browser's store" in failed["message"] and "store it again" in failed["hint"]
        gone = complete(first["id"], ids[5:20])
        assert not gone["ok"] and gone["name"] == "ModelNotFoundError" and "not in the store" in gone["message"], gone
        second = page.evaluate(harness.STORE_JS, [dev_server.url + "streamed/moe-b.gguf", None])
        again = complete(second["id"], ids[5:20])
        assert again["ok"] and len(again["r"]["token_ids"]) == 6, again
    finally:
        context.close()
