"""Locate package data (Lua scripts, configs) both in an installed wheel and in a checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """``surreal_redis/<name>`` when installed, else ``<checkout>/<name>`` (editable installs)."""
    for candidate in (_PACKAGE_DIR / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"package data folder {name!r} not found next to {_PACKAGE_DIR}")
