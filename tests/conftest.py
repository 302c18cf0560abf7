"""Shared fixtures. Browser fixtures start the real dev server and Debian's Chromium through
playwright/harness.py, once per test module (Pyodide takes seconds to boot)."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "playwright"))

import harness  # noqa: E402  (playwright/ is deliberately not a package)

# wgpu-native (Mesa) complains on every adapter request when this is unset, as it is under CI.
os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="xdg-"))


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="also run the tests marked `full`: the long siblings of default cases (`make test-full`)")


def pytest_configure(config):
    """Under xdist the controller makes the page's pyshim wheel once, before its workers start: each worker's
    dev_server would otherwise rebuild the same files while another worker's server hands them out."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        if (ROOT / "web" / "vendor" / "manifest.json").is_file():
            from pyshim.setup import vendoring

            vendoring.refresh_pyshim()
            os.environ["PYSHIM_WHEEL_FRESH"] = "1"


def pytest_collection_modifyitems(config, items):
    """`full` tests repeat a default case at greater length or on another model (every shader variant's
    pipeline, Gemma 3 beside SmolLM2 in the browser...): skipped, and counted as skipped, unless --full."""
    if config.getoption("--full") or os.environ.get("PYSHIM_FULL") == "1":
        return
    skip = pytest.mark.skip(reason="a longer sibling of a default case: run with --full (make test-full)")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def dev_server():
    if not (ROOT / "web" / "vendor" / "manifest.json").is_file():
        pytest.fail("web/vendor is missing: run `pyshim setup` (the README's test command does it)")
    # The browser installs pyshim from its wheel: rebuild it so the page runs this checkout's code.
    if os.environ.get("PYSHIM_WHEEL_FRESH") != "1":
        from pyshim.setup import vendoring

        vendoring.refresh_pyshim()
    with harness.DevServer() as server:
        yield server


@pytest.fixture(scope="module")
def chromium():
    # Module scope on purpose: Playwright's sync API keeps an asyncio loop running while it is open,
    # and the native-GPU tests need asyncio.run(); closing it after each browser module frees the loop.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = harness.launch_chromium(p)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def site_page(chromium, dev_server):
    """The site's index page with its engine Worker booted; one per test module."""
    context = chromium.new_context()
    page, watch = harness.open_page(context, dev_server.url)
    boot = harness.wait_for_boot(page)
    yield page, watch, boot
    context.close()


@pytest.fixture(scope="module")
def loop():
    """An event loop for a native-GPU test module (the runners' async API)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def device(loop):
    """The native wgpu device (lavapipe here), one per test module."""
    from pyshim.gpu import open_device

    dev = loop.run_until_complete(open_device())
    yield dev
    dev.destroy()
