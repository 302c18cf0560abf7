"""Where things live: the source checkout (CPython) or the installed wheel (Pyodide)."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# In a checkout (editable install) the repository root holds web/, shaders/, models/.
ROOT = PACKAGE_DIR.parent
IN_CHECKOUT = (ROOT / "pyproject.toml").is_file() and (ROOT / "web").is_dir()

WEB_DIR = ROOT / "web"
VENDOR_DIR = WEB_DIR / "vendor"
MODELS_DIR = ROOT / "models"
PLAYWRIGHT_DIR = ROOT / "playwright"


def shaders_dir() -> Path:
    """WGSL sources: `shaders/` in a checkout, `pyshim/shaders/` inside the wheel built by setup."""
    inside = PACKAGE_DIR / "shaders"
    return inside if inside.is_dir() else ROOT / "shaders"
