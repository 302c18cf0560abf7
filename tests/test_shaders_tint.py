"""Every shader variant compiles in Chromium's Tint too (naga alone is not enough: the two differ).

One page (any same-origin document of the dev server is a secure context with navigator.gpu); each
expanded source goes through createShaderModule and getCompilationInfo, and the ones chosen through
createComputePipelineAsync (by default a cover of every define; with --full all of them)."""

from __future__ import annotations

import pytest

import harness
from pyshim.gpu.variants import shader_variants
from pyshim.gpu.shaderc import Preprocessor, ShaderKey

pytestmark = pytest.mark.browser

COMPILE_JS = """async ([sources, pipelines]) => {
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
    if (pipelines.includes(label)) {
      try {
        await device.createComputePipelineAsync({label, layout: "auto", compute: {module, entryPoint: "main"}});
      } catch (e) { errors.push(String(e.message || e)); }
    }
    const scope = await device.popErrorScope();
    if (scope) errors.push(scope.message);
    if (errors.length) failures.push([label, errors.join(" | ")]);
  }
  device.destroy();
  return {adapter: adapter.info.architecture || adapter.info.vendor, failures};
}"""


def pipeline_cover(keys: list[ShaderKey]) -> list[ShaderKey]:
    """Variants whose pipelines together build every define value of every family at least once (a family
    without defines once): a pipeline takes SwiftShader seconds to build, a module's validation milliseconds."""
    chosen = []
    for family in dict.fromkeys(k.family for k in keys):
        variants = [k for k in keys if k.family == family]
        missing = {d for k in variants for d in k.defines}
        chosen.append(variants[0])
        missing -= set(variants[0].defines)
        while missing:
            best = max(variants, key=lambda k: len(missing & set(k.defines)))
            chosen.append(best)
            missing -= set(best.defines)
    return chosen


def compile_in_tint(chromium, dev_server, keys: list[ShaderKey], pipelines: list[ShaderKey]) -> dict:
    pre = Preprocessor()
    sources = [[key.label, pre.build(key)] for key in keys]
    context = chromium.new_context()
    try:
        page, _ = harness.open_page(context, dev_server.url + "/manifest.webmanifest")
        harness.require_adapter(page)
        result = page.evaluate(COMPILE_JS, [sources, [key.label for key in pipelines]])
    finally:
        context.close()
    assert result["adapter"], "no WebGPU adapter in the page"
    return result


def test_every_variant_validates_in_tint_and_a_cover_builds_pipelines(chromium, dev_server):
    """Every variant through Tint's front end (parse, resolve, uniformity, validation: where naga and Tint
    disagree); pipelines (Tint's backend, layout: "auto", the adapter's limits) for a cover of the defines."""
    keys = shader_variants(f16=False)      # (SwiftShader has no shader-f16: naga checks those, test_kernels.py)
    cover = pipeline_cover(keys)
    assert len({k.family for k in cover}) == len({k.family for k in keys}) and len(cover) < len(keys) / 3
    result = compile_in_tint(chromium, dev_server, keys, cover)
    assert result["failures"] == [], result["failures"]


@pytest.mark.full
def test_every_variant_builds_a_pipeline_in_tint(chromium, dev_server):
    keys = shader_variants(f16=False)
    result = compile_in_tint(chromium, dev_server, keys, keys)
    assert result["failures"] == [], result["failures"]
