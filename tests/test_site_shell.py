"""The service worker precaches the whole app shell: the first visit is not controlled by it, so any
site module missing from sw.js's SHELL list would be missing offline after one visit."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "web"
NOT_SHELL = {"vendor", "bench"}   # vendor/ is precached from its manifests; bench/ is not part of the app


def shell_list() -> set[str]:
    source = (WEB / "sw.js").read_text()
    body = re.search(r"const SHELL = \[(.*?)\];", source, re.S).group(1)
    return set(re.findall(r'"([^"]+)"', body))


def test_every_site_file_is_in_the_shell():
    on_disk = {p.relative_to(WEB).as_posix() for p in WEB.rglob("*")
               if p.is_file() and p.relative_to(WEB).parts[0] not in NOT_SHELL and p.name != "sw.js"}
    shell = shell_list()
    assert on_disk - shell == set(), "add these to SHELL in web/sw.js (else they are missing offline)"
    generated = ("vendor/manifest.json", "vendor/definitions.js")      # written by `pyshim setup`
    vendored = {s for s in shell if s.startswith("vendor/") and s not in generated}   # placed by `pyshim setup`
    missing = {s for s in vendored if not (WEB / s).is_file()}
    assert missing == set() or not (WEB / "vendor").is_dir(), "SHELL names vendored files that `pyshim setup` does not place"
    assert {s for s in shell - on_disk - vendored if s not in ("./", *generated)} == set(), "SHELL names files that do not exist"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, which the format puts first."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_manifest_is_installable():
    """What Chromium requires to offer installing the site (the browser half, a service worker that
    controls the page, is tests/test_site_audit.py's; the offline reload, tests/test_site_offline.py's)."""
    manifest = json.loads((WEB / "manifest.webmanifest").read_text())
    assert manifest.get("name") or manifest.get("short_name")
    assert manifest["display"] in ("standalone", "fullscreen", "minimal-ui") and manifest["start_url"]
    pngs = [icon for icon in manifest["icons"] if icon.get("type") == "image/png"]
    assert {"192x192", "512x512"} <= {icon["sizes"] for icon in pngs}
    for icon in manifest["icons"]:
        assert (WEB / icon["src"]).is_file(), icon["src"]
    for icon in pngs:
        width, height = png_size(WEB / icon["src"])
        assert icon["sizes"] == f"{width}x{height}", f"{icon['src']} is {width}x{height}, the manifest says {icon['sizes']}"
    assert any("maskable" in icon.get("purpose", "").split() for icon in manifest["icons"]), "no maskable icon"
    index = (WEB / "index.html").read_text()
    assert re.search(r'<link rel="manifest" href="manifest\.webmanifest">', index)
    assert re.search(r'<meta name="theme-color" content="#[0-9a-fA-F]{3,8}">', index)
    assert 'addEventListener("fetch"' in (WEB / "sw.js").read_text(), "an installable site's service worker has a fetch handler"
