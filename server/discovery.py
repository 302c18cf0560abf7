"""Finding GGUF files on this computer: models/ and the usual local caches of other tools.

Each found file gets a stable id used in its URL (`/models/<id>`); only files found here are ever
served from outside models/, so the listing doubles as the allow-list for those caches.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Found:
    id: str        # URL-safe path below /models/
    name: str      # what a person calls it
    source: str    # "models", "huggingface", "ollama", "lmstudio", "extra"
    path: Path


@dataclass(frozen=True)
class ModelRoots:
    """Where to look. Defaults follow each tool's own environment variables and home-folder layout."""

    models: Path
    huggingface: Path | None = None
    ollama: Path | None = None
    lmstudio: tuple[Path, ...] = ()

    @classmethod
    def default(cls, models: Path, home: Path | None = None, env: dict[str, str] | None = None) -> "ModelRoots":
        env = dict(os.environ) if env is None else env
        home = Path(env.get("HOME", str(Path.home()))) if home is None else home
        hf_home = Path(env["HF_HOME"]) if "HF_HOME" in env else home / ".cache" / "huggingface"
        hf = Path(env["HF_HUB_CACHE"]) if "HF_HUB_CACHE" in env else hf_home / "hub"
        ollama = Path(env["OLLAMA_MODELS"]) if "OLLAMA_MODELS" in env else home / ".ollama" / "models"
        lmstudio = (home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models")
        return cls(models=models, huggingface=hf, ollama=ollama, lmstudio=lmstudio)


def _ggufs_below(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*.gguf") if p.is_file())


def _in_models(root: Path) -> list[Found]:
    # Symlinks that leave models/ are not followed: the file server would refuse to serve them anyway.
    real_root = root.resolve() if root.exists() else root
    found = []
    for p in _ggufs_below(root):
        if not p.resolve().is_relative_to(real_root):
            continue
        rel = p.relative_to(root).as_posix()
        found.append(Found(id=rel, name=p.stem, source="models", path=p))
    return found


def _in_huggingface(hub: Path) -> list[Found]:
    # hub/models--org--name/snapshots/<revision>/<file>.gguf (symlinks into hub/.../blobs)
    found = []
    if not hub.is_dir():
        return found
    for repo in sorted(hub.glob("models--*")):
        repo_name = repo.name[len("models--"):].replace("--", "/")
        for snap in sorted((repo / "snapshots").glob("*")):
            for p in _ggufs_below(snap):
                rel = p.relative_to(snap).as_posix()
                found.append(Found(id=f"hf/{repo_name}/{snap.name[:12]}/{rel}", name=f"{repo_name}/{rel}", source="huggingface", path=p))
    return found


def _in_ollama(root: Path) -> list[Found]:
    # manifests/<registry>/<namespace>/<model>/<tag> is JSON whose model layer names a blob by digest.
    found = []
    manifests = root / "manifests"
    if not manifests.is_dir():
        return found
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        try:
            layers = json.loads(manifest.read_text("utf-8")).get("layers", [])
        except (OSError, ValueError, AttributeError):
            continue
        for layer in layers if isinstance(layers, list) else []:
            if not isinstance(layer, dict) or layer.get("mediaType") != OLLAMA_MODEL_LAYER:
                continue
            digest = str(layer.get("digest", ""))
            if not digest.startswith("sha256:") or not digest[7:].isalnum():
                continue
            blob = root / "blobs" / digest.replace(":", "-")
            if not blob.is_file():
                continue
            rel = manifest.relative_to(manifests).parts
            model, tag = (rel[-2], rel[-1]) if len(rel) >= 2 else (rel[-1], "latest")
            namespace = rel[-3] if len(rel) >= 3 and rel[-3] != "library" else ""
            name = f"{namespace + '/' if namespace else ''}{model}:{tag}"
            found.append(Found(id=f"ollama/{name.replace(':', '/')}", name=name, source="ollama", path=blob))
    return found


def _in_lmstudio(roots: tuple[Path, ...]) -> list[Found]:
    found = []
    for i, root in enumerate(roots):
        for p in _ggufs_below(root):
            rel = p.relative_to(root).as_posix()
            found.append(Found(id=f"lmstudio/{i}/{rel}", name=rel, source="lmstudio", path=p))
    return found


def discover(roots: ModelRoots) -> list[Found]:
    found = _in_models(roots.models)
    if roots.huggingface:
        found += _in_huggingface(roots.huggingface)
    if roots.ollama:
        found += _in_ollama(roots.ollama)
    found += _in_lmstudio(roots.lmstudio)
    return found
