"""`pyshim setup`'s checks: lock-verified Pyodide wheels, wheel building, model assembly."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from pyshim.setup import model_files

from pyshim.setup import vendoring
from pyshim.setup.catalog import PackagedModel
from pyshim.errors import ChecksumError

NUMPY = "numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl"


def make_source_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(vendoring.PYODIDE_WHEELS_PREFIX + name, data)
    return path


def lock_for(files: dict[str, bytes]) -> dict:
    names = {"numpy": NUMPY, "micropip": "micropip-0.9.0-py3-none-any.whl", "packaging": "packaging-24.2-py3-none-any.whl"}
    return {"packages": {n: {"file_name": f, "sha256": hashlib.sha256(files[f]).hexdigest()} for n, f in names.items()}}


@pytest.fixture
def pyodide_files():
    return {NUMPY: b"numpy wheel bytes", "micropip-0.9.0-py3-none-any.whl": b"micropip", "packaging-24.2-py3-none-any.whl": b"packaging"}


def test_matching_wheels_pass(tmp_path, pyodide_files):
    source = make_source_wheel(tmp_path / "src.whl", pyodide_files)
    assert vendoring.verify_pyodide_packages(source, lock_for(pyodide_files)) == pyodide_files


def test_tampered_wheel_is_refused_and_nothing_installed(tmp_path, pyodide_files, monkeypatch):
    lock = lock_for(pyodide_files)
    tampered = dict(pyodide_files, **{NUMPY: b"numpy wheel bytes, with a backdoor"})
    source = make_source_wheel(tmp_path / "src.whl", tampered)
    dest = tmp_path / "pyodide"
    dest.mkdir()
    (dest / "pyodide-lock.json").write_text(json.dumps(lock))
    monkeypatch.setattr(vendoring, "pypi", lambda req, **kw: source)
    with pytest.raises(ChecksumError) as info:
        vendoring.vendor_pyodide_packages(dest)
    message = str(info.value)
    assert NUMPY in message and "SHA-256" in message and "nothing was installed" in message
    assert sorted(p.name for p in dest.iterdir()) == ["pyodide-lock.json"]


def test_real_runtime_lock_matches_vendored_numpy():
    """The vendored numpy (if setup ran) is exactly the build Pyodide 0.27.7's lock names."""
    vendor = vendoring.VENDOR_DIR / "pyodide"
    if not (vendor / "pyodide-lock.json").is_file():
        pytest.skip("pyshim setup has not run")
    lock = json.loads((vendor / "pyodide-lock.json").read_text())
    assert lock["info"]["version"] == vendoring.PYODIDE_VERSION
    entry = lock["packages"]["numpy"]
    assert hashlib.sha256((vendor / entry["file_name"]).read_bytes()).hexdigest() == entry["sha256"]


def test_write_wheel_is_valid_and_reproducible(tmp_path):
    files = {"pkg/__init__.py": b"X = 1\n", "pkg/data.txt": b"hello"}
    a = vendoring.write_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", "pkg", "1.0", files)
    first = a.read_bytes()
    vendoring.write_wheel(a, "pkg", "1.0", files)
    assert a.read_bytes() == first
    with zipfile.ZipFile(a) as z:
        record = z.read("pkg-1.0.dist-info/RECORD").decode().splitlines()
        assert "Root-Is-Purelib: true" in z.read("pkg-1.0.dist-info/WHEEL").decode()
        for line in record:
            path, digest, size = line.split(",")
            if digest:
                assert digest == vendoring._record_hash(z.read(path)) and int(size) == len(z.read(path))


def test_pure_wheel_from_sdist_keeps_only_python(tmp_path):
    sdist = tmp_path / "Demo-2.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for name, data in {"Demo-2.0/src/demo/__init__.py": b"from ._native import f\n", "Demo-2.0/src/demo/_native.py": b"def f(): pass\n",
                           "Demo-2.0/src/demo/_speedups.c": b"int x;", "Demo-2.0/setup.py": b""}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    wheel = vendoring.pure_wheel_from_sdist(sdist, "src/demo", tmp_path)
    assert wheel.name == "Demo-2.0-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "demo/__init__.py" in names and "demo/_native.py" in names and not any(n.endswith(".c") for n in names)


def test_pyshim_wheel_has_modules_and_shaders(tmp_path):
    wheel = vendoring.build_pyshim_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"pyshim/__init__.py", "pyshim/gpu/browser.py", "pyshim/gguf/header.py"} <= names
    shaders = [n for n in names if n.startswith("pyshim/shaders/")]
    on_disk = [p for p in (vendoring.ROOT / "shaders").rglob("*") if p.is_file()]
    assert len(shaders) == len(on_disk)
    assert not any("__pycache__" in n for n in names)


def _model(pieces, content: bytes, sha: str | None = None) -> PackagedModel:
    return PackagedModel(name="t", file_name="t.gguf", sha256=sha or hashlib.sha256(content).hexdigest(), size=len(content),
                         pieces=pieces, description="test")


def test_model_is_assembled_from_pieces_and_verified(tmp_path, monkeypatch):
    parts = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]
    wheels = {}
    for i, data in enumerate(parts):
        w = tmp_path / f"p{i}.whl"
        with zipfile.ZipFile(w, "w") as z:
            z.writestr(f"p{i}/data/part{i}", data)
        wheels[f"p{i}==1"] = w
    monkeypatch.setattr(model_files, "pypi", lambda req, **kw: wheels[req])
    model = _model(tuple((f"p{i}==1", f"p{i}/data/part{i}") for i in range(3)), b"".join(parts))
    models_dir = tmp_path / "models"
    assert "verified" in model_files.place(model, models_dir)
    assert (models_dir / "t.gguf").read_bytes() == b"".join(parts)
    assert model_files.place(model, models_dir).startswith("already there")

    bad = _model(model.pieces, b"".join(parts), sha="0" * 64)
    (models_dir / "t.gguf").unlink()
    with pytest.raises(ChecksumError, match="not installed"):
        model_files.place(bad, models_dir)
    assert not (models_dir / "t.gguf").exists() and not list(models_dir.glob("*.part"))


def _write_wheels(path: str, times: int) -> int:
    for _ in range(times):
        vendoring.write_wheel(Path(path), "w", "1.0", {"w/__init__.py": b"x = 1\n" * 2000})
    return times


def test_processes_writing_one_wheel_at_once_each_replace_it_whole(tmp_path):
    """The test workers (and a benchmark beside them) refresh the page's pyshim wheel in one vendor folder:
    each writes a file of its own and replaces the wheel whole (a shared ".part" name made one's rename fail)."""
    import concurrent.futures

    path = tmp_path / "w-1.0-py3-none-any.whl"
    with concurrent.futures.ProcessPoolExecutor(3) as pool:
        assert sum(pool.map(_write_wheels, [str(path)] * 3, [40] * 3)) == 120
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None and "w/__init__.py" in z.namelist()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]         # no temporary file left behind
