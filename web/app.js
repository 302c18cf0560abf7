// The page: boots the engine Worker and shows what it is doing. UI only; the work happens in the Worker.

import { EngineClient } from "./engine/client.js";

const $ = (id) => document.getElementById(id);
const STEP_NAMES = {
  manifest: "Site manifest", pyodide: "Python runtime (Pyodide)", numpy: "numpy", wheels: "pyshim and its wheels", import: "import pyshim",
};

function setStatus(state, text, hint) {
  const el = $("status");
  el.dataset.state = state;
  el.textContent = text;
  if (hint) {
    const h = document.createElement("span");
    h.className = "hint";
    h.textContent = hint;
    el.append(h);
  }
}

function showStep({ step, state, ms }) {
  let li = document.querySelector(`#steps li[data-step="${step}"]`);
  if (!li) {
    li = document.createElement("li");
    li.dataset.step = step;
    li.innerHTML = `<span class="label"></span><span class="ms"></span>`;
    li.querySelector(".label").textContent = STEP_NAMES[step] ?? step;
    $("steps").append(li);
  }
  if (state === "done") {
    li.classList.add("done");
    li.querySelector(".ms").textContent = `${(ms / 1000).toFixed(2)} s`;
  } else {
    li.querySelector(".ms").textContent = "…";
  }
}

function formatBytes(n) {
  return n >= 1e9 ? `${(n / 1e9).toFixed(2)} GB` : `${(n / 1e6).toFixed(0)} MB`;
}

async function listModels() {
  const list = $("models");
  try {
    const response = await fetch("api/models");
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const { models } = await response.json();
    $("models-note").textContent = models.length ? `${models.length} found by the dev server.` : "No GGUF files found. Run `pyshim setup` to place the default models.";
    for (const m of models) {
      const li = document.createElement("li");
      const name = Object.assign(document.createElement("div"), { className: "name", textContent: m.name });
      const meta = Object.assign(document.createElement("div"), { className: "meta" });
      meta.textContent = [m.architecture, m.quant, m.size && formatBytes(m.size), m.source].filter(Boolean).join(" · ");
      li.append(name, meta);
      if (m.error) li.append(Object.assign(document.createElement("div"), { className: "error", textContent: m.error }));
      list.append(li);
    }
  } catch (err) {
    // Without the dev server (a static host) there is no listing; that is fine.
    $("models-note").textContent = "No model listing here (the page is not served by `pyshim serve`).";
  }
}

const engine = new EngineClient();
window.pyshimEngine = engine; // for the browser tests and the console
engine.addEventListener("boot-step", (e) => showStep(e.detail));

async function main() {
  listModels();
  try {
    const boot = await engine.request("boot");
    setStatus("ready", `Python ready in ${(boot.total_ms / 1000).toFixed(1)} s`);
    $("facts").hidden = false;
    $("fact-python").textContent = `Python ${boot.versions.python}, numpy ${boot.versions.numpy}, pyshim ${boot.versions.pyshim} (Pyodide ${boot.pyodide})`;
    window.pyshimBoot = boot;
  } catch (err) {
    setStatus("error", `Python could not start: ${err.message}`, err.hint);
    window.pyshimBoot = { error: { name: err.name, message: err.message } };
    return;
  }
  try {
    const gpu = await engine.request("gpu-selftest");
    $("fact-gpu").textContent = `${gpu.adapter.summary} — WGSL self-test ${gpu.ok ? "passed" : "FAILED"}`;
  } catch (err) {
    $("fact-gpu").textContent = `${err.message}${err.hint ? ` (${err.hint})` : ""}`;
  }
}

main();
