"""Where ``ctxwarden wrap`` keeps its data: the embedded store, the local tenant's key,
the background servers' state files and logs.

``CTXWARDEN_HOME`` (or ``--data-dir``) names the directory; without it, the platform's
per-user data directory: ``$XDG_DATA_HOME/ctxwarden`` (default ``~/.local/share``) on
Linux, ``~/Library/Application Support/ctxwarden`` on macOS, ``%LOCALAPPDATA%\\ctxwarden``
on Windows. The directory is made private to the user (0700): it holds the local tenant's
key. Upstream provider keys are never written here.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HOME_ENV", "Home", "default_home"]

HOME_ENV = "CTXWARDEN_HOME"


def default_home() -> Path:
    """``CTXWARDEN_HOME``, else the platform's per-user data directory (see the module)."""
    given = os.environ.get(HOME_ENV)
    if given:
        return Path(given).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "ctxwarden"
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA")
        return Path(base) / "ctxwarden" if base else Path.home() / "AppData" / "Local" / "ctxwarden"
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "ctxwarden"


@dataclass(frozen=True)
class Home:
    """The data directory and the files in it."""

    path: Path

    @classmethod
    def at(cls, path: Path | None = None) -> Home:
        """The data directory ``path`` (default :func:`default_home`), created if needed."""
        home = cls((path or default_home()).expanduser().resolve())
        home.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return home

    @property
    def db(self) -> str:
        """The embedded store's URL."""
        return f"sqlite:///{self.path / 'ctxwarden.db'}"

    @property
    def key_file(self) -> Path:
        """The local tenant's key in the embedded store (mode 0600)."""
        return self.path / "local-key"

    def key_file_for(self, db: str) -> Path:
        """The local tenant's key in store ``db``: one file per store, so runs on the
        embedded store and on a ``--db`` of the user's do not re-key each other."""
        if db == self.db:
            return self.key_file
        return self.path / f"local-key-{hashlib.sha256(db.encode()).hexdigest()[:12]}"

    @property
    def lock_file(self) -> Path:
        return self.path / "wrap.lock"

    def state_file(self, config_id: str) -> Path:
        """The state of the background server for one configuration."""
        return self.path / f"serve-{config_id}.json"

    def log_file(self, config_id: str) -> Path:
        return self.path / f"serve-{config_id}.log"

    def state_files(self) -> list[Path]:
        return sorted(self.path.glob("serve-*.json"))
