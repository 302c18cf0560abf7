// The page: boots the engine Worker, shows its status, and wires the models and chat panels.
// UI only; Python and the GPU live in the Worker, the bytes in IndexedDB (web/store).

import { EngineClient } from "./engine/client.js";
import { h, $ } from "./ui/dom.js";
import { initModels } from "./ui/models.js";
import { initChat, setEngine, setModel, settings, showDownload } from "./ui/chat.js";
import { initConversations, refreshList } from "./ui/conversations.js";
import { selectModel } from "./ui/models.js";

const STEP_NAMES = {
  manifest: "Site manifest", pyodide: "Python runtime (Pyodide)", numpy: "numpy", wheels: "pyshim and its wheels", import: "import pyshim",
};

function setStatus(state, text, hint) {
  $("engine-pill").dataset.state = state;
  $("status").dataset.state = state;
  $("status").textContent = text;
  $("engine-pill").title = hint ?? "Engine details";
}

function showStep({ step, state, ms }) {
  let li = document.querySelector(`#steps li[data-step="${step}"]`);
  if (!li) {
    li = h("li", { dataset: { step } }, h("span", { class: "label", text: STEP_NAMES[step] ?? step }), h("span", { class: "ms" }));
    $("steps").append(li);
  }
  li.classList.toggle("done", state === "done");
  li.querySelector(".ms").textContent = state === "done" ? `${(ms / 1000).toFixed(2)} s` : "…";
}

// The adapter in words: name, whether it is a software fallback, whether it has shader-f16.
function adapterLine(adapter) {
  const name = adapter.description || [adapter.vendor, adapter.architecture].filter(Boolean).join(" ") || "GPU";
  const f16 = adapter.features?.includes("shader-f16") ? "f16" : "no f16";
  return `${name}${adapter.is_fallback ? " (software fallback)" : ""} · ${f16}`;
}

async function registerServiceWorker() {
  if (!("serviceWorker" in navigator)) {
    $("fact-offline").textContent = "this browser has no service workers: the site needs the network";
    return;
  }
  try {
    await navigator.serviceWorker.register("sw.js", { type: "module" });
    await navigator.serviceWorker.ready;
    $("fact-offline").textContent = "the site and Python are cached: it opens without the network";
    window.pyshimOffline = true;
  } catch (err) {
    $("fact-offline").textContent = `offline mode unavailable: ${err.message}`;
    window.pyshimOffline = false;
  }
}

const engine = new EngineClient();
window.pyshimEngine = engine; // for the browser tests and the console
window.pyshimApp = { setEngine }; // lets a test put a stand-in engine behind the chat
engine.addEventListener("boot-step", (e) => showStep(e.detail));

let resolveAdapter;
const adapter = new Promise((resolve) => { resolveAdapter = resolve; });

async function bootEngine() {
  try {
    const boot = await engine.request("boot");
    setStatus("python", `Python ready in ${(boot.total_ms / 1000).toFixed(1)} s · checking the GPU…`);
    $("facts").hidden = false;
    $("fact-python").textContent = `Python ${boot.versions.python}, numpy ${boot.versions.numpy}, pyshim ${boot.versions.pyshim} (Pyodide ${boot.pyodide})`;
    window.pyshimBoot = boot;
  } catch (err) {
    setStatus("error", `Python could not start: ${err.message}`, err.hint);
    window.pyshimBoot = { error: { name: err.name, message: err.message } };
    resolveAdapter(null);
    return;
  }
  try {
    const gpu = await engine.request("gpu-selftest");
    resolveAdapter(gpu.adapter);
    window.pyshimAdapter = gpu.adapter;
    const python = `Python ready in ${(window.pyshimBoot.total_ms / 1000).toFixed(1)} s`;
    setStatus(gpu.ok ? "ready" : "error", gpu.ok ? `${python} · ${adapterLine(gpu.adapter)}` : `GPU self-test failed on ${adapterLine(gpu.adapter)}`);
    $("fact-gpu").textContent = `${gpu.adapter.summary} — WGSL self-test ${gpu.ok ? "passed" : "FAILED"}`;
  } catch (err) {
    resolveAdapter(null);
    // No WebGPU (turned off, blocklisted, an old browser): models run on the WebAssembly CPU engine instead
    setStatus("cpu", `Python ready · no WebGPU here: models run on the CPU (WebAssembly)`, err.hint ?? err.message);
    $("fact-gpu").textContent = `none — ${err.message}${err.hint ? ` (${err.hint})` : ""}; the CPU engine runs models`;
  }
  const caps = await engine.request("capabilities");
  setEngine(engine, caps.generate);
}

function main() {
  $("engine-pill").addEventListener("click", () => { $("engine-details").hidden = !$("engine-details").hidden; });
  initChat({ onSaved: refreshList, selectModel });
  setEngine(engine, false);
  // The models first (they select the last stored one), then the chat that was open, with its own model.
  initModels({ engine, adapter, settings, onSelect: setModel, onDownloadProgress: showDownload })
    .then(initConversations, (err) => console.error(err));
  bootEngine();
  registerServiceWorker();
}

main();
