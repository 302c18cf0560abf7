// Building DOM without innerHTML: every string becomes a text node, so no text (a file name, a
// server's message, a model's reply) can ever become markup or script.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value == null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export const $ = (id) => document.getElementById(id);

export function formatDuration(seconds) {
  if (seconds == null || !isFinite(seconds)) return "";
  if (seconds < 60) return `${Math.max(1, Math.round(seconds))} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} min`;
}

export const formatRate = (bytesPerSec) => (bytesPerSec ? `${(bytesPerSec / 1e6).toFixed(1)} MB/s` : "");

const MAX_TOASTS = 3;
const TOAST_MS = 6000;
const ERROR_TOAST_MS = 15000;   // errors also stay on the model's row, so the toast can go

// A dismissable message: what happened, and on its own line what to do about it.
export function toast(kind, message, hint = null) {
  const box = $("toasts");
  const close = h("button", { class: "icon-button", "aria-label": "Dismiss", text: "×" });
  const item = h("div", { class: `toast ${kind}`, role: kind === "error" ? "alert" : "status" },
    h("div", {}, h("strong", { text: message }), hint ? h("div", { class: "hint", text: hint }) : null), close);
  close.addEventListener("click", () => item.remove());
  box.append(item);
  while (box.children.length > MAX_TOASTS) box.firstElementChild.remove();
  setTimeout(() => item.remove(), kind === "error" ? ERROR_TOAST_MS : TOAST_MS);
  return item;
}

// Copies `text` to the clipboard (a textarea and execCommand where the Clipboard API is refused) and says so.
export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const area = h("textarea", { class: "offscreen", "aria-hidden": "true" });
    area.value = text;
    document.body.append(area);
    area.select();
    const ok = document.execCommand("copy");
    area.remove();
    if (!ok) {
      toast("error", "The browser refused to copy", "select the text and copy it with the keyboard");
      return false;
    }
  }
  toast("ok", "Copied");
  return true;
}
