"""The GPU executor behind the Runner contract: natively through wgpu, in the browser through
navigator.gpu (the same code over the other device face, pyshim.gpu.browser).

A step's answer decides its program: the forward pass recorded once per (tokens in the step, what comes
back) and kept built (the one-token ones always, KEEP_PROGRAMS others by recent use). What comes back is
as little as the caller asked for: the argmax is computed on the GPU (4 bytes read back), top-k too (k
pairs), logits only when asked for (the last row, or every row of a scoring step, split into steps whose
logits fit one storage binding).
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from pyshim.exec.runner import Capacity, HeldTokens, Output, Progress, RunnerStats, Slice, Step, Want, check_step, report
from pyshim.gpu.device import GPUDevice
from pyshim.gpu.kernels import TOPK
from pyshim.gpu.ops import GpuOps
from pyshim.gpu.policy import KernelPolicy
from pyshim.gpu.program import Program, physical
from pyshim.plan import auto
from pyshim.plan.memory import per_token
from pyshim.plan.settings import KV_PAGE as PAGE, RunSettings

KEEP_PROGRAMS = 8       # step shapes (other than one token) kept built; more are rebuilt on use
DECODE_WANTS = (Want.LOGITS, Want.ARGMAX)   # the one-token programs prepare() builds
# Prompt sizes whose pipelines prewarm() compiles, besides the largest step: a matrix's int8 activations are a
# uniform while a step's rows fit 64 KiB (pyshim.gpu.ops), so short steps take other variants than long ones,
# and where that ends depends on the width (the 1.5B's 1536-wide matrices up to 32 tokens, its 8960-wide one
# up to 5; a 7B's 3584 up to 13). 8 and 32 tokens cover a chat's usual first prompts and follow-ups.
PREWARM_TOKENS = (8, 32)


class GpuRunner:
    auto: dict | None = None     # set by the loader when kv_type was "auto" (pyshim.exec.runner.Runner)
    runs_on = "gpu"              # what the page's `device` setting calls it

    def __init__(self, spec, header, ops: GpuOps, model, settings: RunSettings, n_ctx: int, *, owns_device: bool = True):
        self.spec, self.header, self.ops, self.model, self.settings = spec, header, ops, model, settings
        self.owns_device = owns_device
        self.arithmetic = ops.policy.arithmetic
        max_step = ops.max_chunk
        if ops.expert_cache is not None:     # a step may want at most `slots` distinct experts of a layer
            max_step = max(1, min(max_step, ops.expert_cache.n_slots // spec.n_experts_used))
        self.capacity = Capacity(n_ctx=n_ctx, max_seqs=ops.kv.n_seqs, max_step_tokens=max_step, top_k=TOPK)
        self.stats = RunnerStats()
        self.held = HeldTokens.for_spec(spec, n_ctx)
        # by (tokens, want, batched decode step or not), least recently used first; a program serves any
        # sequence (which, the step map says: pyshim.gpu.kv)
        self._programs: OrderedDict[tuple[int, Want, bool], Program] = OrderedDict()
        # Told of the pipelines a program's first use compiles (a prompt's first prefill compiles the
        # tiled kernels: many seconds on a CPU adapter), so a page can say why the first reply waits.
        self.on_compile: Progress | None = None

    @property
    def n_ctx(self) -> int:
        return self.capacity.n_ctx

    @property
    def device(self) -> GPUDevice:
        return self.ops.device

    @property
    def weight_bytes(self) -> int:
        """Bytes of GGUF weights a decode token reads (pyshim.plan.memory.per_token: one embedding row, and
        of a mixture of experts only the experts a token is routed to)."""
        return per_token(self.spec, self.header.tensors).read_bytes

    @property
    def policy(self) -> KernelPolicy:
        return self.ops.policy

    async def prepare(self, progress: Progress | None = None) -> None:
        """One-time work before anything is timed: rearrange the grouped weights (their bytes must be
        uploaded by now), record and build the one-token (decode) programs. `progress(done, total)` counts
        their distinct pipelines not compiled yet as they compile, from (0, total) to (total, total); it is
        not called when none is left to compile."""
        await self.ops.repack()
        # Recorded first, so the pipelines of every program are known (and counted) before any is compiled.
        keys = [(1, want, False) for want in DECODE_WANTS]
        recorded = {key: self._record(1, key[1]) for key in keys if key not in self._programs}
        await self._compile(recorded.values(), progress)
        for key, program in recorded.items():
            await self._build(key, program)

    async def prewarm(self) -> int:
        """Compile, before the first prompt asks for them, the pipelines of prompt steps (of PREWARM_TOKENS and
        of the largest step, top-k answered, as a sampled reply takes them; prepare() compiles the one-token
        steps'). The page runs this once a model is loaded ahead, while the visitor types
        (pyshim.serve.prewarm): the first reply then waits for none of them (on SwiftShader SmolLM2's took
        3.2 s of its first 36-token prompt's 5.4 s). The programs are only recorded (milliseconds), then
        released; a step that asks for a pipeline under way waits for that compilation (KernelCache).
        Returns how many it compiled."""
        top = self.capacity.max_step_tokens
        sizes = sorted({min(n, top) for n in (*PREWARM_TOKENS, top)} - {1})
        programs = [self._record(n, Want.TOP_K) for n in sizes]
        before = len(self.ops.kernels)
        try:
            await self._compile(programs, None)
            return len(self.ops.kernels) - before
        finally:
            for program in programs:
                program.release(self.ops.allocator, self.device)

    async def _compile(self, programs, progress: Progress | None) -> None:
        """Compile the pipelines `programs` use that are not compiled yet, reporting (0, total) .. (total,
        total); nothing when all are."""
        kernels = self.ops.kernels
        keys = dict.fromkeys(d.key for program in programs for d in program.dispatches)
        missing = [key for key in keys if key not in kernels]
        if not missing:
            return
        await report(progress, 0, len(missing))
        for done, key in enumerate(missing, 1):
            await kernels.get(key)
            await report(progress, done, len(missing))

    def share(self, src: int, dst: int, n: int) -> bool:
        """Sequence `dst` takes `src`'s keys and values for positions [0, n) — the same KV pages, by
        reference, instead of running those tokens again (a system prompt that concurrent requests share);
        a shared page is copied when one of them writes into it. A sliding-window layer's ring is copied,
        when it still holds the window's keys before n (False when `src` has written past that)."""
        if src == dst or n < 1:
            return False
        kv = self.ops.kv
        if kv.ring_len and self.held.top(src) > n - self.spec.sliding_window + 1 + kv.ring_len * PAGE:
            return False        # src's ring went on past n: the keys a query at n attends to are gone
        copies = kv.share(src, dst, n)
        if copies:
            self.device.copy(copies)
        self.held.copied(src, dst, n)
        return True

    def reset(self, seq: int = 0) -> None:
        """`held` forgets the sequence and its KV pages go back to the pool."""
        self.held.forget(seq)
        self.ops.kv.release(seq)

    def close(self) -> None:
        """Release the device when the runner opened it (a device handed in stays its owner's)."""
        if self.owns_device:
            self.device.destroy()

    def _hand_over(self) -> tuple:
        """Free everything but the weights (programs, KV cache, activations: GpuOps.release_state) and hand
        over what another runner of the model keeps: (ops, device ownership). This runner is spent."""
        for program in self._programs.values():
            self.ops.drop(program)
        self._programs.clear()
        self.ops.release_state()
        owns, self.owns_device = self.owns_device, False
        return self.ops, owns

    async def program(self, n: int, want: Want, batched: bool = False) -> Program:
        """The built program for steps of `n` tokens of one sequence answering `want` (recorded on first
        use; a step that wants nothing runs the logits program and reads nothing back); `batched`: a
        batched decode step's, token i some sequence's next one, `want` answered for every one."""
        want = Want.LOGITS if want is Want.NONE else want
        key = (n, want, batched)
        if key not in self._programs:
            program = self._record(n, want, batched)
            await self._compile([program], self.on_compile)
            await self._build(key, program)
        self._programs.move_to_end(key)
        return self._programs[key]

    def _record(self, n: int, want: Want, batched: bool = False) -> Program:
        """The forward pass for steps of `n` tokens answering `want`, recorded (not built yet)."""
        ops = self.ops
        program = ops.begin(n, batched)
        logits = self.model.forward(ops, ops.tokens(n), ops.positions(n), want is Want.ALL_LOGITS or batched)
        program.output = logits
        if want is Want.ARGMAX:
            program.argmax = ops.record_argmax(logits, rows=n if batched else 1)
        elif want is Want.TOP_K:
            program.topk = ops.record_topk(logits)
        ops.end()
        return program

    async def _build(self, key: tuple, program: Program) -> None:
        ops = self.ops
        await program.build(ops.device, ops.kernels, ops.pool)
        self._programs[key] = program
        self._evict()

    def _evict(self) -> None:
        """Keep the one-token programs and the KEEP_PROGRAMS most recently used others: every prompt length
        makes a program (params arena and some 600 bind groups), and a long chat sees many lengths. The
        one dropped is the least recently used, never one of the step being run."""
        others = [key for key in self._programs if key[0] != 1]
        for key in others[:max(0, len(others) - KEEP_PROGRAMS)]:
            self.ops.drop(self._programs.pop(key))

    def rebind(self, parts) -> int:
        """After weight slot parts were pointed at other buffers (pyshim.gpu.slots.WeightSlots.rebind): make
        again the bind groups that bind them, in every built program (how a weight streamed from the store
        takes a slot's place between steps). Returns how many were made."""
        return sum(program.rebind(self.device, parts) for program in self._programs.values())

    async def _submit(self, tokens, start, want: Want, read=None, *, seq: int = 0,
                      seqs: tuple[int, ...] | None = None) -> tuple[Program, bytes | None]:
        """Run a step of `tokens` of sequence `seq` from position `start` (with `seqs`, a batched decode
        step: `start` lists each token's position); `read(program)` names what to copy back after it
        ((buffer, size, offset), or None for nothing): the step's writes, dispatches and readback go to the
        device together (in the browser one FFI call), the wait comes last."""
        await self.ops.repack()        # no-op after the first step
        program = await self.program(len(tokens), want, seqs is not None)
        dev, ops = self.device, self.ops
        n = len(tokens)
        positions = np.asarray(start if seqs is not None else np.arange(start, start + n), dtype=np.uint32)
        owners = np.asarray(seqs if seqs is not None else [seq] * n, dtype=np.uint32)
        writes = [(ops.tokens_buf, 0, np.asarray(tokens, dtype=np.uint32))] + self._step_map(positions, owners)
        label, at = f"step_n{len(tokens)}", 0
        ahead = None                        # (layer, ids) guessed for the next MoE layer: fetched while the GPU works
        for stop in program.stops:          # streamed weights: the host puts them in place
            if stop.at > at or writes:
                dev.replay(program.encoded, at, stop.at, label=f"{label}@{at}", writes=writes)
            writes, at = (), stop.at
            if ahead is not None:
                await ops.expert_cache.prefetch(*ahead)
                await ops.repack()          # before a miss of the next stop may take one of those slots
                ahead = None
            if stop.stream_layer is not None:
                await ops.layer_stream.before_layer(stop.stream_layer, ops.kernels, ops.pool, dev)
                continue
            guess = stop.guess is not None and ops.expert_cache.ahead     # (recorded just after the ids)
            words = stop.ids.size + (stop.guess.size if guess else 0)
            ids = np.frombuffer(await self._read(physical(stop.ids.buf), words * 4, stop.ids.off * 4), dtype=np.uint32)
            if guess:
                ids, ahead = ids[:stop.ids.size], (stop.guess_layer, ids[stop.ids.size:])
            slot_ids = await ops.expert_cache.resolve(stop.layer, ids.reshape(stop.ids.shape))
            await ops.repack()              # the int8 route's Q8_0 experts just written
            dev.write(physical(stop.slot_ids.buf), slot_ids, stop.slot_ids.off * 4)
        what = read(program) if read is not None else None
        if what is None:
            dev.replay(program.encoded, at, label=label, writes=writes)
            answer = None
        else:
            answer = dev.replay_read(program.encoded, at, None, what, label=label, writes=writes)
        if ahead is not None:               # (a guess at no later stop: none is recorded so)
            await ops.expert_cache.prefetch(*ahead)
            await ops.repack()
        if ops.layer_stream is not None:    # the next step's first streamed layer, while the GPU works
            await ops.layer_stream.after_step(ops.kernels, ops.pool, dev)
        return program, (None if answer is None else await self._waited(answer))

    def _step_map(self, positions: np.ndarray, owners: np.ndarray) -> list:
        """The step map's writes for tokens at `positions` of sequences `owners`: their pages found first
        (new ones, copies of shared ones: those copies are queued now, before the step), the page tables
        written when they changed (pyshim.gpu.kv)."""
        kv, held = self.ops.kv, self.held
        spans: dict[int, list[int]] = {}
        for pos, seq in zip(positions.tolist(), owners.tolist()):
            lo, hi = spans.get(seq, (pos, pos + 1))
            spans[seq] = [min(lo, pos), max(hi, pos + 1)]
        copies = kv.prepare([(seq, lo, hi) for seq, (lo, hi) in spans.items()],
                            idle=lambda: [s for s in range(kv.n_seqs) if not held.in_use(s)], on_reclaim=held.forget)
        if copies:
            self.device.copy(copies)
        buf = self.ops.positions_buf
        writes = [(buf, 0, positions), (buf, 4 * kv.seq_off, owners)]
        if kv.pages.dirty:
            writes.append((buf, 4 * kv.table_off, kv.table_words()))
            kv.pages.dirty = False
        return writes

    async def _read(self, buffer, size: int, offset: int = 0) -> bytes:
        return await self._waited(self.device.read(buffer, size, offset))

    async def _waited(self, answer) -> bytes:
        """Await a readback, counting its wait and bytes in the runner's stats."""
        dev = self.device
        waited, read = dev.read_wait_s, dev.bytes_read
        data = await answer
        self.stats.wait_s += dev.read_wait_s - waited
        self.stats.bytes_read += dev.bytes_read - read
        return data

    async def step(self, step: Step) -> list[Output]:
        check_step(step, self.capacity, self.spec.n_vocab)
        if self._batched(step):
            with ExitStack() as held:
                for s in step.slices:
                    held.enter_context(self.held.writing(s))
                outputs = await self._batch(step)
        else:
            outputs = []
            for s in step.slices:
                with self.held.writing(s):
                    outputs.append(await self._slice(s, step))
        self.stats.steps += 1
        return outputs

    def _batched(self, step: Step) -> bool:
        """Whether a step runs as one batched decode program: one token of each of several distinct
        sequences, asking for their greedy ids or logits, with no weights streamed mid-step."""
        return (step.one_token_each and len(step.slices) <= self.ops.max_chunk and self.ops.expert_cache is None
                and self.ops.layer_stream is None)

    async def _batch(self, step: Step) -> list[Output]:
        """One token of each sequence in one program: the weights are read once for all of them."""
        seqs = tuple(s.seq for s in step.slices)
        tokens, starts = [s.tokens[0] for s in step.slices], [s.start for s in step.slices]
        if step.want is Want.NONE:
            await self._submit(tokens, starts, step.want, seqs=seqs)
            return [Output() for _ in seqs]
        if step.want is Want.ARGMAX:
            _, data = await self._submit(tokens, starts, step.want, lambda p: (p.argmax, 4 * len(seqs), 0), seqs=seqs)
            return [Output(token=int(t)) for t in np.frombuffer(data, dtype=np.uint32)[:len(seqs)]]
        program, data = await self._submit(tokens, starts, step.want, _logits, seqs=seqs)
        rows = np.frombuffer(data, dtype=np.float32).reshape(program.output.shape)
        return [Output(logits=row.copy()) for row in rows]

    async def _slice(self, s: Slice, step: Step) -> Output:
        if step.want is Want.ALL_LOGITS:
            # an all-logits step holds [n, vocab] f32 in one binding: as many rows per GPU step as fit
            rows = max(1, min(self.ops.max_chunk, self.ops.max_binding // (4 * self.spec.n_vocab)))
            out = []
            for at in range(0, len(s.tokens), rows):
                program, data = await self._submit(s.tokens[at:at + rows], s.start + at, Want.ALL_LOGITS, _logits, seq=s.seq)
                out.append(np.frombuffer(data, dtype=np.float32).reshape(program.output.shape))
            return Output(logits=np.concatenate(out))
        if step.want is Want.NONE:
            await self._submit(s.tokens, s.start, step.want, seq=s.seq)
            return Output()
        if step.want is Want.ARGMAX:
            _, data = await self._submit(s.tokens, s.start, step.want, lambda p: (p.argmax, 4, 0), seq=s.seq)
            return Output(token=int(np.frombuffer(data, dtype=np.uint32)[0]))
        if step.want is Want.TOP_K:
            _, data = await self._submit(s.tokens, s.start, step.want, lambda p: (p.topk, step.k * 8, 0), seq=s.seq)
            pairs = np.frombuffer(data, dtype=np.uint32).reshape(step.k, 2)
            return Output(values=pairs[:, 0].view(np.float32).copy(), ids=pairs[:, 1].astype(np.int64))
        program, data = await self._submit(s.tokens, s.start, step.want, _logits, seq=s.seq)
        return Output(logits=np.frombuffer(data, dtype=np.float32).reshape(program.output.shape)[-1])

    async def dispatches_per_token(self) -> int:
        """Compute dispatches a greedy decode step encodes (its program built if it was not)."""
        return len((await self.program(1, Want.ARGMAX)).dispatches)

    def layer_stream_stats(self) -> dict | None:
        """With layers streamed (pyshim.gpu.layer_stream): how many and what their uploads took since load."""
        stream = self.ops.layer_stream
        if stream is None:
            return None
        return {"streamed_layers": len(stream.layers), "layers": self.spec.n_layers, "gpu_bytes": stream.nbytes,
                "layer_bytes": stream.layer_bytes, **stream.stats.as_dict()}

    def kv_stats(self) -> dict:
        """The KV cache's pages: how many, how many free, each sequence's, and how many sequences had theirs
        taken back for others."""
        kv = self.ops.kv
        return {**kv.stats(), "kv_type": kv.kv_type, "gpu_bytes": kv.nbytes,
                "held": [kv.pages.held(seq) for seq in range(kv.n_seqs)]}

    def expert_cache_stats(self) -> dict | None:
        """With experts streamed (pyshim.gpu.expert_cache): the cache's size and what it did since load."""
        cache = self.ops.expert_cache
        if cache is None:
            return None
        return {"slots": cache.n_slots, "experts": self.spec.n_experts, "gpu_bytes": cache.nbytes, **cache.stats.as_dict()}

    def memory(self) -> dict:
        """Device memory: what the executor allocated so far (buffers are made at load and as step shapes
        are first built, so after a run this is its peak) and what the plan (pyshim.plan.memory) predicts
        for its largest step."""
        from pyshim.plan.memory import estimate

        plan = estimate(self.spec, self.header.tensors, context=self.n_ctx, kv_type=self.ops.kv_type, chunk=self.ops.max_chunk,
                        seqs=self.ops.kv.n_seqs, kv_pages=self.ops.kv.n_pages)
        return {"peak_gpu_bytes": self.ops.memory()["total"], "planned_gpu_bytes": plan.total_bytes}


def _logits(program: Program) -> tuple:
    """What a logits step reads back: its output tensor's rows."""
    out = program.output
    return physical(out.buf), out.size * 4, out.off * 4


async def load_gpu(path: str | Path | None = None, *, header=None, source=None, settings: RunSettings = RunSettings(),
                   device: GPUDevice | None = None, upload_now: bool = True, max_binding: int | None = None,
                   policy: dict | None = None, max_seqs: int | None = None) -> GpuRunner:
    """A GpuRunner for a GGUF file (`path`), or for a parsed header plus a byte source (Pyodide).
    `upload_now=False` leaves the weights' bytes to the caller (`runner.ops.uploads`: the browser);
    `max_binding` lowers the storage binding limit (forces tensors split by rows); `policy` overrides
    kernel choices (pyshim.gpu.policy.KernelPolicy fields: tests); `max_seqs`: the sequences its KV cache
    holds (default settings.parallel; a step of one token of each runs as one batched program), in
    settings.kv_pages pages (default: every sequence's whole context)."""
    from pyshim.gguf.model import open_model
    from pyshim.gguf.tensors import WeightStore, tensor_refs_from_header
    from pyshim.gpu import open_device
    from pyshim.models import build_model

    header, source, spec = open_model(path, header=header, source=source)
    spec = settings.spec_for(spec)
    settings, choice = auto.resolve(settings, spec, header.tensors)
    n_ctx = settings.context_for(spec.context_length)
    owns_device = device is None
    device = device or await open_device()
    kernel_policy = KernelPolicy.for_device(device.caps, settings.arithmetic, **(policy or {}))
    store = WeightStore(tensor_refs_from_header(header), source)
    ops = GpuOps(device, store, spec, n_ctx, kernel_policy,
                 kv_type=settings.kv_type, max_chunk=settings.prefill_chunk, max_binding=max_binding, upload_now=upload_now,
                 expert_slots=settings.expert_slots, streamed_layers=settings.streamed_layers,
                 max_seqs=max_seqs or settings.parallel, kv_pages=settings.kv_pages)
    model = build_model(spec, ops, store if settings.scaled_keys else None, settings.rotated_keys)
    runner = GpuRunner(spec, header, ops, model, settings, n_ctx, owns_device=owns_device)
    runner.auto = choice and choice.as_dict()
    return runner


async def reload_gpu(runner: GpuRunner, settings: RunSettings) -> GpuRunner | None:
    """`runner`'s model under other settings that leave its weights as they are — another context, KV type,
    number of KV pages or parallel sequences, prefill chunk or rope scaling: a runner over the same device,
    weight buffers and compiled pipelines with a KV cache and programs of its own, so a settings change
    costs what the KV cache and a few pipelines cost, not a new upload of the weights (minutes for a 7B
    from the browser's store). `runner` is spent and must not be used or closed again: its KV cache,
    activations and programs are freed before the new ones are made (both never take memory at once), and
    if making them fails the device is let go too (when `runner` owned it), as a failed load leaves nothing.
    None, with `runner` untouched, where the settings change the weights (the arithmetic, layers or experts
    streamed — "auto" may choose those for a longer context): load the model afresh then.

    A KV cache of scaled keys (q4) reads the key projections from the weight store's byte source, which
    must hold them (the browser's reads them from its store first)."""
    from pyshim.gguf.spec import ModelSpec
    from pyshim.models import build_model

    old = runner.ops
    spec = settings.spec_for(ModelSpec.from_header(runner.header))
    settings, choice = auto.resolve(settings, spec, runner.header.tensors)
    arithmetic = KernelPolicy.for_device(runner.device.caps, settings.arithmetic).arithmetic
    if (arithmetic is not old.policy.arithmetic or settings.expert_slots != runner.settings.expert_slots
            or settings.streamed_layers != runner.settings.streamed_layers):
        return None
    bound = len(old.slots.slots)
    ops, owns_device = runner._hand_over()
    try:
        n_ctx = settings.context_for(spec.context_length)
        ops = GpuOps(ops.device, ops.slots.store, spec, n_ctx, ops.policy, kv_type=settings.kv_type,
                     max_chunk=settings.prefill_chunk, max_seqs=settings.parallel, kv_pages=settings.kv_pages, weights_of=ops)
        store = ops.slots.store
        model = build_model(spec, ops, store if settings.scaled_keys else None, settings.rotated_keys)
        if len(ops.slots.slots) != bound:       # (the same architecture binds the same weights: nothing to upload)
            raise RuntimeError(f"the model bound {len(ops.slots.slots) - bound} weights it had not bound before")
    except BaseException:
        if owns_device:
            ops.device.destroy()
        raise
    new = GpuRunner(spec, runner.header, ops, model, settings, n_ctx, owns_device=owns_device)
    new.auto = choice and choice.as_dict()
    return new
