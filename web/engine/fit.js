// "Will it fit?": Python's header summary (probe) against the adapter's limits and a memory budget.
//
// WebGPU does not say how much memory a GPU has, so the budget is an assumption the user can change
// (settings); the hard limits (largest buffer, largest storage binding) come from the adapter.

import { formatBytes } from "../store/errors.js";

export const DEFAULT_BUDGET_BYTES = 4 * 2 ** 30;   // a modest laptop GPU, or half of an 8 GB unified memory
export const DEFAULT_CONTEXT = 4096;
const BUDGET_KEY = "pyshim.gpuBudgetMiB";          // settings (and tests) override the assumption here

export function budgetBytes() {
  const mib = Number(globalThis.localStorage?.getItem(BUDGET_KEY));
  return mib > 0 ? mib * 2 ** 20 : DEFAULT_BUDGET_BYTES;
}

export function setBudgetMiB(mib) {
  if (mib > 0) localStorage.setItem(BUDGET_KEY, String(mib));
  else localStorage.removeItem(BUDGET_KEY);
}

// summary: probe()'s answer; adapter: gpu-selftest's adapter dict (null when WebGPU is missing).
// Returns {ok, reasons: [sentence…], needBytes, budgetBytes, limits}.
export function judge(summary, adapter, budget = budgetBytes()) {
  const reasons = [];
  if (!summary.supported) reasons.push(summary.reason || `pyshim cannot run ${summary.architecture ?? "this"} models yet`);
  const needBytes = summary.total_bytes ?? (summary.weight_bytes ?? 0) + (summary.kv_bytes ?? 0);
  const limits = adapter?.limits ?? null;
  if (!adapter) {
    reasons.push("this browser gives no WebGPU adapter, so nothing can run on the GPU here");
  } else if (summary.supported) {
    if (needBytes > budget) {
      reasons.push(`weights (${formatBytes(summary.weight_bytes)}), a ${summary.context}-token KV cache (${formatBytes(summary.kv_bytes)}) ` +
        `and activations (${formatBytes(summary.activation_bytes ?? 0)}) ` +
        `need ${formatBytes(needBytes)}, more than the ${formatBytes(budget)} of GPU memory assumed available`);
    }
    const binding = limits?.max_storage_buffer_binding_size;
    if (binding && summary.largest_tensor?.bytes > binding) {
      reasons.push(`its largest tensor (${summary.largest_tensor.name}, ${formatBytes(summary.largest_tensor.bytes)}) is bigger ` +
        `than this GPU's largest storage binding (${formatBytes(binding)})`);
    }
  }
  return { ok: reasons.length === 0, reasons, needBytes, budgetBytes: budget, limits };
}
