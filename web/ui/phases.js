// What the engine is doing before a reply's first token, in words: the phases the Engine's onProgress
// reports (engine/engine.js), each with its progress. `null`: nothing worth showing.

import { formatRate } from "./dom.js";
import { formatBytes } from "../store/errors.js";

const LABELS = {
  queued: "Waiting for the engine",
  remote: "Waiting for the server",
  boot: "Starting the engine",
  header: "Reading the model's header",
  load: "Moving the weights from storage to the GPU",
  compile: "Compiling the GPU shaders",
  prefill: "Reading the conversation",
};

function detailOf(p) {
  const of = p.total ? ` of ${p.total}` : "";
  switch (p.phase) {
    case "load":
      return [p.total && `${formatBytes(p.loaded)} of ${formatBytes(p.total)}`, formatRate(p.bytesPerSec)].filter(Boolean).join(" · ");
    case "compile":
      return p.total ? `${p.loaded}${of} pipeline${p.total === 1 ? "" : "s"}` : "";
    case "prefill":
      return p.total ? `${p.loaded}${of} token${p.total === 1 ? "" : "s"}` : "";
    case "queued":
      return "the first reply of a model loads it onto the GPU";
    default:
      return "";
  }
}

export function phaseView(p) {
  const label = LABELS[p?.phase];
  if (!label) return null;
  const fraction = p.total ? Math.min(1, p.loaded / p.total) : null;
  return { label, detail: detailOf(p), fraction };
}
