// The "will it fit?" panel: what Python read from the header, against this GPU's limits.

import { h, $ } from "./dom.js";
import { formatBytes } from "../store/errors.js";

function row(label, value, note = null, bad = false) {
  return [h("dt", { text: label }), h("dd", { class: bad ? "bad" : null }, value, note ? h("span", { class: "note", text: ` ${note}` }) : null)];
}

// manifest.probe: Python's probe summary; manifest.fit: its verdict {ok, reasons, needBytes, budgetBytes, limits}
// (engine/resolve.js checkFit).
export function renderFit(manifest) {
  const panel = $("fit-panel");
  panel.replaceChildren();
  const { probe, fit } = manifest ?? {};
  if (!probe && !fit) {
    panel.hidden = true;
    return;
  }
  panel.hidden = false;
  panel.dataset.verdict = fit?.ok ? "fits" : "refused";
  const memory = fit?.engine === "cpu" ? "CPU engine memory (no WebGPU here: it runs on the CPU)" : "GPU memory";
  const gpu = fit?.needBytes ? ` ${formatBytes(fit.needBytes)} of ${formatBytes(fit.budgetBytes)} ${memory} at ${probe?.context} tokens.` : "";
  const verdict = fit?.ok
    ? h("summary", { class: "verdict ok" }, h("span", { class: "badge ok", text: "Fits" }), ` Will it fit? Yes:${gpu}`)
    : h("summary", { class: "verdict bad" }, h("span", { class: "badge bad", text: "Won't run here" }), " ", (fit?.reasons ?? []).join(" "));
  const facts = h("dl", { class: "fit-facts" });
  if (probe) {
    facts.append(...row("Model", probe.name || manifest.name, `${probe.architecture ?? "unknown"}${probe.file_type ? ` · ${probe.file_type}` : ""}`));
    if (probe.parameters) facts.append(...row("Parameters", `${(probe.parameters / 1e6).toFixed(0)} M`, probe.quant));
    if (probe.supported) {
      facts.append(...row("Weights", formatBytes(probe.weight_bytes)));
      facts.append(...row("KV cache", formatBytes(probe.kv_bytes), `${probe.context} tokens, ${probe.kv_type} (trained on ${probe.context_length})`));
      // what "auto" picked, in Python's words (pyshim/plan/auto.py)
      if (probe.auto) facts.append(...row("Settings", `${probe.auto.kv_type} cache, ${probe.auto.context} tokens`, probe.auto.reason));
      if (fit) {
        facts.append(...(fit.engine === "cpu"
          ? row("CPU engine memory", `${formatBytes(fit.needBytes)} of ${formatBytes(fit.budgetBytes)}`, "WebAssembly's limit (no WebGPU here)", fit.needBytes > fit.budgetBytes)
          : row("GPU memory", `${formatBytes(fit.needBytes)} of ${formatBytes(fit.budgetBytes)}`, "assumed budget", fit.needBytes > fit.budgetBytes)));
      }
      // A weight larger than a storage binding is split by rows (pyshim/plan/memory.py): a row must fit one.
      const binding = fit?.limits?.max_storage_buffer_binding_size;
      if (probe.largest_tensor) {
        const split = binding && probe.largest_tensor.bytes > binding ? `, split by rows into ${Math.ceil(probe.largest_tensor.bytes / binding)}+ parts` : "";
        facts.append(...row("Largest tensor", formatBytes(probe.largest_tensor.bytes),
          binding ? `${probe.largest_tensor.name}; ${formatBytes(binding)} per binding${split}` : probe.largest_tensor.name,
          Boolean(binding && probe.widest_row && probe.widest_row.bytes > binding)));
      }
    }
  }
  // Folded when the answer is yes (the chat needs the room); open when it explains a refusal.
  panel.append(h("details", { open: !fit?.ok }, verdict, facts));
}
