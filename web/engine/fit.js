// "Will it fit?": the GPU memory the page may use. WebGPU does not say how much memory a GPU has, so the
// budget is an assumption the user can change (settings). The verdict itself is Python's
// (pyshim/plan/probe.py: the model against this budget and the adapter's limits, by the executor's own
// layout rules), asked through the Worker's probe-bytes (resolve.js checkFit).

import { DEFINITIONS } from "./protocol.js";

export const DEFAULT_BUDGET_BYTES = 4 * 2 ** 30;   // a modest laptop GPU, or half of an 8 GB unified memory
export const DEFAULT_CONTEXT = DEFINITIONS.default_context;
const BUDGET_KEY = "pyshim.gpuBudgetMiB";          // settings (and tests) override the assumption here

export function budgetBytes() {
  const mib = Number(globalThis.localStorage?.getItem(BUDGET_KEY));
  return mib > 0 ? mib * 2 ** 20 : DEFAULT_BUDGET_BYTES;
}

export function setBudgetMiB(mib) {
  if (mib > 0) localStorage.setItem(BUDGET_KEY, String(mib));
  else localStorage.removeItem(BUDGET_KEY);
}
