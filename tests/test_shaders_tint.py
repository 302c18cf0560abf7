"""Every shader variant compiles in Chromium's Tint too (naga alone is not enough: the two differ).

One page (any same-origin document of the dev server is a secure context with navigator.gpu); each
expanded source goes through createShaderModule, getCompilationInfo and createComputePipelineAsync."""

from __future__ import annotations

import pytest

import harness
from pyshim.gpu.kernels import shader_variants
from pyshim.gpu.shaderc import Preprocessor

pytestmark = pytest.mark.browser

COMPILE_JS = """async (sources) => {
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return {adapter: null};
  // as pyshim.gpu.browser requests the device: the subgroup variants need the feature, the CPU-adapter
  // matmul tile the adapter's workgroup memory (24 KiB)
  const device = await adapter.requestDevice({requiredFeatures: adapter.features.has("subgroups") ? ["subgroups"] : [],
    requiredLimits: {maxComputeWorkgroupStorageSize: adapter.limits.maxComputeWorkgroupStorageSize}});
  const failures = [];
  for (const [label, code] of sources) {
    device.pushErrorScope("validation");
    const module = device.createShaderModule({label, code});
    const info = await module.getCompilationInfo();
    const errors = info.messages.filter(m => m.type === "error").map(m => `${m.lineNum}:${m.linePos} ${m.message}`);
    try {
      await device.createComputePipelineAsync({label, layout: "auto", compute: {module, entryPoint: "main"}});
    } catch (e) { errors.push(String(e.message || e)); }
    const scope = await device.popErrorScope();
    if (scope) errors.push(scope.message);
    if (errors.length) failures.push([label, errors.join(" | ")]);
  }
  device.destroy();
  return {adapter: adapter.info.architecture || adapter.info.vendor, failures};
}"""


def test_every_variant_compiles_in_tint(chromium, dev_server):
    pre = Preprocessor()
    sources = [[key.label, pre.build(key)] for key in shader_variants()]
    context = chromium.new_context()
    try:
        page, _ = harness.open_page(context, dev_server.url + "/manifest.webmanifest")
        harness.require_adapter(page)
        result = page.evaluate(COMPILE_JS, sources)
    finally:
        context.close()
    assert result["adapter"], "no WebGPU adapter in the page"
    assert result["failures"] == [], result["failures"]
