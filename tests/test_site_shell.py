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


def test_manifest_is_installable():
    manifest = json.loads((WEB / "manifest.webmanifest").read_text())
    assert manifest["display"] == "standalone" and manifest["start_url"]
    sizes = {icon["sizes"] for icon in manifest["icons"]}
    assert {"192x192", "512x512"} <= sizes
    for icon in manifest["icons"]:
        assert (WEB / icon["src"]).is_file(), icon["src"]
