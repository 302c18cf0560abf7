// The conversation list in the sidebar: each saved chat with its title, model and date; open, rename,
// delete, delete all, export (JSON to import again, Markdown to read) and import. The chat itself
// (ui/chat.js) saves a conversation as it changes; this list only reads and manages them.

import * as chats from "../store/conversations.js";
import { h, $, toast } from "./dom.js";
import { currentConversation, forgetConversation, openConversation } from "./chat.js";

const OPEN_KEY = "pyshim.openConversation";   // the chat a reload comes back to
const CONFIRM_MS = 4000;                        // "Delete all" asks for a second click within this

let renaming = null;      // id of the row being renamed

function when(ms) {
  const d = new Date(ms);
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) : d.toLocaleDateString([], { month: "short", day: "numeric", year: "numeric" });
}

function row(c, openId) {
  const meta = [c.model?.name, when(c.updated)].filter(Boolean).join(" · ");
  const current = c.id === openId;
  const title = renaming === c.id ? renameBox(c)
    : h("button", { type: "button", class: "conv-open", "aria-current": current ? "true" : null, onclick: () => open(c.id) },
      h("span", { class: "conv-title", text: c.title }), h("span", { class: "meta", text: meta }));
  return h("li", { class: current ? "selected" : null, dataset: { id: c.id } }, title,
    h("div", { class: "conv-actions" },
      h("button", { type: "button", class: "ghost small", "aria-label": `Rename “${c.title}”`, title: "Rename", text: "Rename", onclick: () => { renaming = c.id; refreshList(); } }),
      h("button", { type: "button", class: "ghost small danger", "aria-label": `Delete “${c.title}”`, title: "Delete", text: "Delete", onclick: () => remove(c.id) })));
}

function renameBox(c) {
  const input = h("input", { type: "text", class: "conv-rename", "aria-label": "New name for this chat", maxlength: 120 });
  input.value = c.title;
  let done = false;
  const finish = async (save) => {
    if (done) return;
    done = true;
    renaming = null;
    const name = input.value.trim();
    if (save && name && name !== c.title) {
      const saved = await chats.saveConversation({ ...c, title: name, titled: true }).catch((err) => { toast("error", err.message, err.hint); return null; });
      const open = currentConversation();
      if (saved && open?.id === c.id) Object.assign(open, { title: saved.title, titled: true });
    }
    await refreshList();
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") { e.preventDefault(); finish(true); }
    if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); finish(false); }
  });
  input.addEventListener("blur", () => finish(true));
  queueMicrotask(() => { input.focus(); input.select(); });
  return input;
}

export async function refreshList() {
  let list;
  try {
    list = await chats.listConversations();
  } catch (err) {
    $("chats-note").textContent = `${err.message}${err.hint ? ` — ${err.hint}` : ""}`;
    return [];
  }
  const openId = currentConversation()?.id;
  $("chats").replaceChildren(...list.map((c) => row(c, openId)));
  $("chats-empty").hidden = list.length > 0;
  for (const id of ["chats-export", "chats-export-md", "chats-delete-all"]) $(id).disabled = list.length === 0;
  if (openId) localStorage.setItem(OPEN_KEY, openId);
  window.pyshimConversations = list;    // for tests and the console
  return list;
}

async function open(id) {
  const c = await chats.getConversation(id);
  if (!c) {
    toast("error", "That chat is no longer stored", "another tab may have deleted it");
    await refreshList();
    return;
  }
  await openConversation(c);
  closeDrawerOnSmallScreens();
}

async function remove(id) {
  try {
    await chats.deleteConversation(id);
  } catch (err) {
    toast("error", err.message, err.hint);
  }
  forgetConversation(id);
  await refreshList();
}

let confirmTimer = null;

async function deleteAll() {
  const button = $("chats-delete-all");
  if (!confirmTimer) {      // the first click arms it: a second one within CONFIRM_MS deletes
    button.textContent = "Click again to delete all";
    confirmTimer = setTimeout(() => { confirmTimer = null; button.textContent = "Delete all"; }, CONFIRM_MS);
    return;
  }
  clearTimeout(confirmTimer);
  confirmTimer = null;
  button.textContent = "Delete all";
  try {
    await chats.deleteAllConversations();
  } catch (err) {
    toast("error", err.message, err.hint);
  }
  forgetConversation(null);
  await refreshList();
}

function saveFile(name, type, text) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = h("a", { href: url, download: name, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

async function exportAll(markdown) {
  const list = await chats.listConversations();
  const day = new Date().toISOString().slice(0, 10);
  if (markdown) saveFile(`pyshim-chats-${day}.md`, "text/markdown", chats.toMarkdown(list));
  else saveFile(`pyshim-chats-${day}.json`, "application/json", chats.exportJSON(list));
}

async function importFile(file) {
  try {
    const added = await chats.importConversations(await file.text());
    toast("ok", `Imported ${added.length} chat${added.length === 1 ? "" : "s"} from ${file.name}.`);
  } catch (err) {
    toast("error", err.message, err.hint);
  }
  await refreshList();
}

// Small screens keep the sidebar behind a button (#sidebar-toggle); opening a chat closes it.
function closeDrawerOnSmallScreens() {
  if (matchMedia("(max-width: 820px)").matches) setDrawer(false);
}

export function setDrawer(open) {
  document.body.classList.toggle("drawer-open", open);
  $("sidebar-toggle").setAttribute("aria-expanded", String(open));
}

export async function initConversations() {
  $("chats-export").addEventListener("click", () => exportAll(false));
  $("chats-export-md").addEventListener("click", () => exportAll(true));
  $("chats-delete-all").addEventListener("click", deleteAll);
  $("chats-import-file").addEventListener("change", (e) => {
    const [file] = e.target.files;
    if (file) importFile(file);
    e.target.value = "";
  });
  $("sidebar-toggle").addEventListener("click", () => setDrawer(!document.body.classList.contains("drawer-open")));
  $("new-chat").addEventListener("click", closeDrawerOnSmallScreens);
  // Back to the chat that was open before the reload, if it is still stored.
  const last = localStorage.getItem(OPEN_KEY);
  const saved = last ? await chats.getConversation(last).catch(() => null) : null;
  if (saved) await openConversation(saved);
  await refreshList();
}
