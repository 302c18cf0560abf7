"""Shared pieces of the GPU tests: one native device per module on a persistent event loop, running a
single kernel on NumPy inputs, and random GGUF blocks of every weight type."""

from __future__ import annotations

import asyncio

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

from pyshim.gpu.kernels import PARAMS, KernelCache, kv_write_grid, kv_write_key
from pyshim.gpu.shaderc import ShaderKey
from pyshim.plan.settings import KV_PAGE

# Byte offsets of the f16 scale fields inside one block, per type: random bytes there could be inf/NaN
# or huge, so they are overwritten with sane halves; every other byte stays random (all bit patterns).
F16_FIELDS = {
    QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q8_0: (0,),
    QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,),
}


def random_weight(qtype: QT, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 (rows, row_bytes) in the type's GGUF layout."""
    if qtype == QT.F32:
        return rng.standard_normal((rows, k), dtype=np.float32).view(np.uint8)
    if qtype == QT.F16:
        return rng.standard_normal((rows, k)).astype(np.float16).view(np.uint8)
    per, nbytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows, k // per, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        halves = (rng.uniform(0.002, 0.05, size=(rows, k // per)) * rng.choice([-1, 1], size=(rows, k // per)))
        blocks[:, :, off:off + 2] = halves.astype(np.float16).view(np.uint8).reshape(rows, k // per, 2)
    return blocks.reshape(rows, -1)


def page_row(cap: int) -> np.ndarray:
    """The page-table row of a sequence whose cache holds `cap` positions (a multiple of KV_PAGE; a ring
    when positions go past it): its pages in reverse order, so that a kernel not reading through the
    table puts keys in the wrong slots."""
    if cap % KV_PAGE:
        raise ValueError(f"a cache of {cap} positions is not whole pages of {KV_PAGE}")
    return np.arange(cap // KV_PAGE, dtype=np.uint32)[::-1].copy()


def kv_slot(j: int, cap: int) -> int:
    """The slot of key position j in page_row(cap)'s pages (include/kv.wgsl kv_slot)."""
    row = page_row(cap)
    return int(row[(j // KV_PAGE) % len(row)]) * KV_PAGE + j % KV_PAGE


def page_params(n: int, cap: int) -> dict:
    """The KV kernels' params locating the sequence and page table in step_map's words for n tokens."""
    return dict(seq_off=n, table_off=2 * n, table_len=cap // KV_PAGE)


def step_map(positions: np.ndarray, cap: int) -> np.ndarray:
    """What the KV kernels read as `positions` (pyshim.gpu.kv): the tokens' positions, their sequence (0),
    then the sequence's page_row(cap)."""
    n = len(positions)
    return np.concatenate([np.asarray(positions, dtype=np.uint32), np.zeros(n, np.uint32), page_row(cap)])


class GPU:
    """A device and a pipeline cache on one event loop (wgpu futures stay on the loop that made them)."""

    def __init__(self):
        from pyshim.gpu import open_device

        self.loop = asyncio.new_event_loop()
        self.device = self.run(open_device())
        self.kernels = KernelCache(self.device)

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.device.destroy()
        self.loop.close()

    def upload(self, array: np.ndarray, label: str = "in"):
        data = np.ascontiguousarray(array)
        buf = self.device.buffer(max(16, data.nbytes), label=label)
        self.device.write(buf, data)
        return buf

    def dispatch(self, key: ShaderKey, inputs: list, outputs: list[int], params: dict, grid: tuple[int, int, int]) -> list[bytes]:
        """Run one kernel: `inputs` are arrays (or buffers), `outputs` byte sizes; returns the outputs' bytes."""
        dev = self.device
        pipeline = self.run(self.kernels.get(key))
        in_bufs = [x if not isinstance(x, np.ndarray) else self.upload(x) for x in inputs]
        out_bufs = [dev.buffer(max(16, n), label="out") for n in outputs]
        uniform = dev.buffer(PARAMS[key.family].nbytes, label="params", uniform=True)
        dev.write(uniform, PARAMS[key.family].pack(**params))
        group = dev.bind_group(pipeline, in_bufs + out_bufs + [uniform], label=key.label)
        dev.submit([(pipeline, group, grid)], label=key.label)
        return [self.run(dev.read(b, n)) for b, n in zip(out_bufs, outputs)]

    def write_kv(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray, kc, vc, cap: int, kv_type: str = "f32"):
        """kv_write: K and V [count, kv_heads, hd] into the cache pages kc/vc (page_row(cap): a ring when
        positions go past cap) at `positions`; returns the step map buffer (attention reads the same one,
        with page_params(count, cap))."""
        count, n_kv, hd = k.shape
        pipe = self.run(self.kernels.get(kv_write_key(kv_type)))
        pos_buf = self.upload(step_map(positions, cap))
        uniform = self.device.buffer(PARAMS["kv_write"].nbytes, label="p", uniform=True)
        self.device.write(uniform, PARAMS["kv_write"].pack(n=count, k_row=n_kv * hd, v_row=n_kv * hd, pos_off=0, k_off=0,
                                                           v_off=0, **page_params(count, cap)))
        group = self.device.bind_group(pipe, [self.upload(k), self.upload(v), pos_buf, kc, vc, uniform])
        self.device.submit([(pipe, group, kv_write_grid(kv_type, n_kv * hd, n_kv * hd, count))])
        return pos_buf
