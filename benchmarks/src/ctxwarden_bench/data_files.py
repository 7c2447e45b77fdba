"""Where the bench finds the shared data files: one search, for every command that reads them."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["find_data"]


def find_data(rel: str | Path, data: str | Path | None = None) -> Path | None:
    """The file ``rel`` (e.g. ``locomo/locomo-dev.json``) under ``data`` when given, else
    under ``$CTXWARDEN_DATA``, ``../shared/data`` or ``./data``, the first that holds it
    (``None``: none does)."""
    roots = [data] if data else [os.environ.get("CTXWARDEN_DATA"), "../shared/data", "data"]
    for root in roots:
        if root and (Path(root) / rel).is_file():
            return Path(root) / rel
    return None
