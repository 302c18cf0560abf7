"""The CPU engine's kernels in Chromium: every test of tests/test_wasm_kernels.py again, against the same
NumPy arithmetic, with the module instantiated by the page's own web/engine/cpu.js (V8, not wasmtime) and
each kernel called from Python through page.evaluate. One page for the module."""

from __future__ import annotations

import base64

import pytest

import test_wasm_kernels
from test_wasm_kernels import *  # noqa: F401,F403 — the same tests, collected here with this module's `eng`

pytestmark = pytest.mark.browser

INSTANTIATE_JS = """async (relaxed) => {
  const cpu = await import(new URL("engine/cpu.js", document.baseURI).href);
  window.__pyshimCpu = await cpu.instantiate(1, { relaxed });
  return [window.__pyshimCpu.threads, window.__pyshimCpu.relaxed, cpu.relaxedSimdSupported()];
}"""
WRITE_JS = "([ptr, b64]) => window.__pyshimCpu.write(ptr, Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)))"
READ_JS = """([ptr, n]) => {
  const bytes = window.__pyshimCpu.read(ptr, n);
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}"""
CALL_JS = "([name, args]) => window.__pyshimCpu.call(name, ...args)"


class PageShim:
    """The module face test_wasm_kernels.Engine uses (alloc, write, read, call), over the page's engine."""

    def __init__(self, page):
        self.page = page

    def alloc(self, nbytes: int) -> int:
        return int(self.page.evaluate("(n) => window.__pyshimCpu.alloc(n)", int(nbytes)))

    def write(self, ptr: int, data) -> None:
        self.page.evaluate(WRITE_JS, [int(ptr), base64.b64encode(memoryview(data).cast("B")).decode()])

    def read(self, ptr: int, nbytes: int) -> bytes:
        return base64.b64decode(self.page.evaluate(READ_JS, [int(ptr), int(nbytes)]))

    def call(self, name: str, *args):
        return self.page.evaluate(CALL_JS, [name, [a if isinstance(a, float) else int(a) for a in args]])


class PageEngine(test_wasm_kernels.Engine):
    def __init__(self, page):
        self.m = PageShim(page)


@pytest.fixture(scope="module", params=[False, True], ids=["simd128", "relaxed"])
def eng(request, chromium, dev_server):
    """The page's plain build, and its relaxed-SIMD one (Chromium has relaxed SIMD: the probe must say so)."""
    context = chromium.new_context()
    page = context.new_page()
    page.goto(dev_server.url + "manifest.webmanifest")       # any same-origin document: nothing else loads
    assert page.evaluate(INSTANTIATE_JS, request.param) == [1, request.param, True]
    yield PageEngine(page)
    context.close()
