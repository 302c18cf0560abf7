"""Saved conversations in the real site (its own IndexedDB database): two chats with two different
stored models survive a reload and an offline reload, each reopening with its model; export then import
gives the same messages back; regenerate replaces the last reply; edit-and-resend drops what followed
the edited message; rename and delete stick; a bad import file imports nothing; a failed save keeps the
chat on screen; and at a phone's 390×844 the sidebar waits behind a button while the chat stays usable.

Replies come from the stand-in engine (site_helpers.FAKE_ENGINE_JS: "echo …" messages get "reply N to:
…", N counting replies), so these tests are about the page, not the model; test_site_chat has real ones."""

from __future__ import annotations

import json

import pytest
from gguf import GGMLQuantizationType as QT

import harness
from site_helpers import FAKE_ENGINE_JS, OFFLINE_CONSOLE_NOISE, open_site, shot, wait_status
from tiny_models import write_tiny_model

pytestmark = [pytest.mark.browser, pytest.mark.slow]
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat-models")
    return [write_tiny_model(folder, "llama", QT.Q8_0), write_tiny_model(folder, "qwen2", QT.Q8_0)]


@pytest.fixture(scope="module")
def site(chromium, dev_server, models):
    context, page, watch = open_site(chromium, dev_server, wait_gpu=False)
    page.click("[aria-controls=tab-file]")
    for path in models:
        page.set_input_files("#file-input", str(path))
        wait_status(page, path.name, "ready")
    yield context, page, watch
    context.set_offline(False)
    context.close()


def stand_in(page) -> None:
    page.wait_for_selector("#status:not([data-state=booting])", timeout=harness.BOOT_TIMEOUT_MS)
    page.evaluate(FAKE_ENGINE_JS)
    page.wait_for_function("() => window.pyshimConversations !== undefined")


def pick_model(page, name: str) -> None:
    page.click(f"#stored li:has-text('{name}') .row-main")
    page.wait_for_function("(name) => document.getElementById('chat-model').textContent === name", arg=name)
    page.wait_for_selector("#chat[data-state=ready]")


def say(page, text: str) -> str:
    """Sends `text` and waits for the reply to finish; the reply's text."""
    replies = page.locator(".msg.assistant .stats").count()
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    page.wait_for_function("(n) => document.querySelectorAll('.msg.assistant .stats').length > n && document.getElementById('stop').hidden", arg=replies)
    return page.locator(".msg.assistant .bubble").last.inner_text().strip()


def messages_on_screen(page) -> list[tuple[str, str]]:
    return page.evaluate("""() => [...document.querySelectorAll('#messages .msg')].map(li =>
        [li.classList.contains('user') ? 'user' : 'assistant', li.querySelector('.bubble').innerText.trim()])""")


def stored(page) -> list[dict]:
    """Every conversation in IndexedDB, newest first (read through the page's own store module)."""
    return page.evaluate("async () => (await import('./store/conversations.js')).listConversations()")


def list_rows(page) -> list[str]:
    page.wait_for_function("() => window.pyshimConversations !== undefined")
    return page.eval_on_selector_all("#chats li", "els => els.map(li => li.innerText)")


def open_chat(page, title: str) -> None:
    page.click(f"#chats li:has-text('{title}') .conv-open")
    page.wait_for_selector(f"#chats li.selected:has-text('{title}')")


def test_two_conversations_with_different_models_survive_a_reload_and_an_offline_reload(site, models):
    context, page, watch = site
    stand_in(page)
    a, b = (p.name for p in models)
    pick_model(page, a)
    assert say(page, "echo hello from A").endswith("echo hello from A")
    page.click("#new-chat")
    assert messages_on_screen(page) == []
    pick_model(page, b)
    say(page, "echo hello from B")
    page.wait_for_function("() => document.querySelectorAll('#chats li').length === 2")
    rows = list_rows(page)
    assert "echo hello from B" in rows[0] and b in rows[0] and "echo hello from A" in rows[1] and a in rows[1], rows
    shot(page, "20-conversations", readme=True)
    before = {c["title"]: c["messages"] for c in stored(page)}

    for offline in (False, True):
        context.set_offline(offline)
        page.reload()
        harness.wait_for_boot(page)
        page.wait_for_selector("#chats li >> nth=1")
        assert {c["title"]: c["messages"] for c in stored(page)} == before
        # the chat open before the reload is open again, with its model
        assert page.inner_text("#chat-model") == b and [m for _, m in messages_on_screen(page)][0] == "echo hello from B"
        open_chat(page, "echo hello from A")
        page.wait_for_function("(name) => document.getElementById('chat-model').textContent === name", arg=a)
        assert [r for r, _ in messages_on_screen(page)] == ["user", "assistant"]
        assert messages_on_screen(page)[0][1] == "echo hello from A"
        open_chat(page, "echo hello from B")
    context.set_offline(False)
    watch.check(allow_console_errors=OFFLINE_CONSOLE_NOISE)


def test_regenerate_replaces_the_last_reply(site):
    _, page, _ = site
    stand_in(page)
    open_chat(page, "echo hello from A")
    first = messages_on_screen(page)[-1][1]
    page.click(".msg.assistant:last-child [data-action=regenerate]")
    page.wait_for_function("(old) => { const b = [...document.querySelectorAll('.msg.assistant .bubble')].at(-1);"
                           " return b && b.innerText.trim() !== old && document.getElementById('stop').hidden"
                           " && document.querySelector('.msg.assistant:last-child .stats'); }", arg=first)
    after = messages_on_screen(page)
    assert [r for r, _ in after] == ["user", "assistant"] and after[-1][1] != first and after[-1][1].endswith("echo hello from A")
    page.wait_for_function("async () => (await (await import('./store/conversations.js')).listConversations())"
                           ".find(c => c.title === 'echo hello from A').messages.length === 2")
    (conv,) = [c for c in stored(page) if c["title"] == "echo hello from A"]
    assert conv["messages"][-1]["content"] == after[-1][1]


def test_edit_and_resend_truncates_after_the_edited_message(site):
    _, page, _ = site
    stand_in(page)
    open_chat(page, "echo hello from A")
    say(page, "echo second turn")
    assert len(messages_on_screen(page)) == 4
    page.click(".msg.user >> nth=0 >> [data-action=edit]")
    page.fill(".edit-text", "echo edited first")
    page.press(".edit-text", "Enter")
    page.wait_for_function("() => document.querySelectorAll('#messages .msg').length === 2 && document.getElementById('stop').hidden"
                           " && document.querySelector('.msg.assistant .stats')")
    on_screen = messages_on_screen(page)
    assert on_screen[0] == ["user", "echo edited first"]
    assert on_screen[1][1].endswith("to: echo edited first")
    page.wait_for_function("async () => (await (await import('./store/conversations.js')).listConversations())"
                           ".some(c => c.messages.length === 2 && c.messages[0].content === 'echo edited first')")
    # the title follows the first message (it was never renamed)
    assert any(c["title"] == "echo edited first" for c in stored(page))


def set_temperature(page, value: str) -> None:
    page.click("#settings-toggle")
    page.fill("#set-temperature", value)
    page.dispatch_event("#set-temperature", "change")
    page.click("#settings-toggle")


def test_each_conversation_keeps_its_settings(site):
    _, page, _ = site
    stand_in(page)
    open_chat(page, "echo edited first")
    set_temperature(page, "0.1")
    say(page, "echo cool")
    assert page.evaluate("() => window.lastGenerate.sampling.temperature") == 0.1
    open_chat(page, "echo hello from B")
    set_temperature(page, "1.3")
    open_chat(page, "echo edited first")
    assert page.input_value("#set-temperature") == "0.1"
    say(page, "echo still cool")
    assert page.evaluate("() => window.lastGenerate.sampling.temperature") == 0.1
    open_chat(page, "echo hello from B")
    assert page.input_value("#set-temperature") == "1.3"
    temperatures = {c["title"]: c["settings"]["temperature"] for c in stored(page)}
    assert temperatures["echo edited first"] == 0.1 and temperatures["echo hello from B"] == 1.3, temperatures


def test_copy_a_reply_and_a_code_block(site):
    context, page, _ = site
    stand_in(page)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=page.evaluate("() => location.origin"))
    page.click("#new-chat")
    say(page, "show me code")                # the stand-in's reply ends in a python block
    page.click(".msg.assistant:last-child [data-action=copy]")
    page.wait_for_selector(".toast:has-text('Copied')")
    reply = page.evaluate("() => navigator.clipboard.readText()")
    assert reply.startswith("Here is **bold**") and reply.endswith('print("hi")\n```')     # the markdown as the model wrote it
    page.click(".msg.assistant:last-child .copy-code")
    assert page.evaluate("() => navigator.clipboard.readText()") == 'print("hi")'
    assert "Copy" not in page.locator(".msg.assistant .bubble").last.inner_text()    # the button's word is CSS, not reply text


def test_export_then_import_gives_the_same_messages(site, tmp_path):
    _, page, _ = site
    stand_in(page)
    before = sorted((c["title"], json.dumps(c["messages"])) for c in stored(page))
    with page.expect_download() as download:
        page.click("#chats-export")
    exported = tmp_path / download.value.suggested_filename
    download.value.save_as(exported)
    assert exported.suffix == ".json" and json.loads(exported.read_text())["format"] == "pyshim-conversations"
    with page.expect_download() as md:
        page.click("#chats-export-md")
    markdown = md.value.path().read_text()
    assert "# echo hello from B" in markdown and "**You:**" in markdown and "reply" in markdown

    count = len(before)
    page.click("#chats-delete-all")          # armed: a second click deletes
    assert page.locator("#chats li").count() == count
    page.click("#chats-delete-all")
    page.wait_for_selector("#chats li", state="detached")
    assert stored(page) == [] and messages_on_screen(page) == []
    assert page.is_visible("#chats-empty")

    page.set_input_files("#chats-import-file", str(exported))
    page.wait_for_function("(n) => document.querySelectorAll('#chats li').length === n", arg=count)
    assert sorted((c["title"], json.dumps(c["messages"])) for c in stored(page)) == before
    # the same file again comes in as copies: nothing is overwritten
    page.set_input_files("#chats-import-file", str(exported))
    page.wait_for_function("(n) => document.querySelectorAll('#chats li').length === 2 * n", arg=count)

    bad = tmp_path / "not-chats.json"
    bad.write_text(json.dumps({"format": "something-else", "conversations": []}))
    page.set_input_files("#chats-import-file", str(bad))
    page.wait_for_selector(".toast.error:has-text('not a pyshim chat export')")
    assert len(stored(page)) == 2 * count


def test_rename_and_delete_stick(site):
    _, page, _ = site
    stand_in(page)
    title = stored(page)[0]["title"]
    page.click(f"#chats li:has-text('{title}') >> nth=0 >> button:has-text('Rename')")
    page.fill(".conv-rename", "Trip planning")
    page.press(".conv-rename", "Enter")
    page.wait_for_selector("#chats li:has-text('Trip planning')")
    page.click("#chats li:has-text('Trip planning') .conv-open")
    say(page, "echo more")                    # a renamed chat keeps its name as it grows
    count = len(stored(page))
    page.reload()
    harness.wait_for_boot(page)
    page.wait_for_selector("#chats li:has-text('Trip planning')")
    page.click("#chats li:has-text('Trip planning') button:has-text('Delete')")
    page.wait_for_selector("#chats li:has-text('Trip planning')", state="detached")
    assert len(stored(page)) == count - 1 and all(c["title"] != "Trip planning" for c in stored(page))
    assert messages_on_screen(page) == []     # the open chat was the deleted one: a new chat is open


def test_a_failed_save_keeps_the_chat_on_screen(site, models):
    _, page, _ = site
    stand_in(page)
    page.click("#new-chat")
    pick_model(page, models[0].name)
    page.evaluate("""() => {
        window.realPut = IDBObjectStore.prototype.put;
        IDBObjectStore.prototype.put = function (value) {
            if (this.name === 'conversations') throw new DOMException('the disk is full', 'QuotaExceededError');
            return window.realPut.call(this, value);
        };
    }""")
    try:
        text = say(page, "echo while the disk is full")
        page.wait_for_selector(".toast.error:has-text('storage is full')")
        assert text.endswith("echo while the disk is full") and len(messages_on_screen(page)) == 2
        assert not any(c["title"] == "echo while the disk is full" for c in stored(page))
    finally:
        page.evaluate("() => { IDBObjectStore.prototype.put = window.realPut; }")
    say(page, "echo after space was freed")   # the next save writes the whole chat
    page.wait_for_function("async () => (await (await import('./store/conversations.js')).listConversations())"
                           ".some(c => c.title === 'echo while the disk is full' && c.messages.length === 4)")


def test_small_screen_keeps_the_sidebar_behind_a_button(chromium, dev_server, site, models):
    context = chromium.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    try:
        page, watch = harness.open_page(context, dev_server.url)
        harness.wait_for_boot(page)
        boxes = page.evaluate("""() => Object.fromEntries(['sidebar', 'sidebar-toggle', 'chat', 'composer', 'prompt', 'send'].map(id => {
            const r = document.getElementById(id).getBoundingClientRect();
            return [id, {x: r.x, y: r.y, w: r.width, h: r.height}];
        }))""")
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= PHONE["width"], f"the page scrolls sideways: {width}px wide"
        assert boxes["sidebar"]["w"] == 0 and boxes["sidebar-toggle"]["w"] > 0, boxes      # hidden behind the button
        assert boxes["chat"]["w"] >= PHONE["width"] - 24 and boxes["chat"]["x"] >= 0, boxes   # the chat takes the width
        for part in ("composer", "prompt", "send"):                                         # and its composer is on screen
            box = boxes[part]
            assert box["y"] >= 0 and box["y"] + box["h"] <= PHONE["height"] and box["x"] + box["w"] <= PHONE["width"], (part, box)
        shot(page, "21-phone-chat", readme=True)
        page.click("#sidebar-toggle")
        assert page.get_attribute("#sidebar-toggle", "aria-expanded") == "true"
        drawer = page.evaluate("() => { const r = document.getElementById('sidebar').getBoundingClientRect(); return {x: r.x, w: r.width}; }")
        assert drawer["x"] >= 0 and drawer["w"] >= PHONE["width"] - 24, drawer
        page.wait_for_selector("#stored-panel", state="visible")
        shot(page, "22-phone-sidebar", readme=True)
        page.click("#sidebar-toggle")
        page.wait_for_selector("#sidebar", state="hidden")
        watch.check()
    finally:
        context.close()
