"""Session stores (R13): SQLite by default, PostgreSQL for many processes; one schema.

``open_store(url)`` picks the backend from the URL:

- ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``, ``sqlite:///:memory:``
- ``postgresql://user@host:5432/db`` (optionally ``?schema=name``); needs ``ctxwarden[postgres]``
"""

from __future__ import annotations

from typing import Any

from ctxwarden.core.errors import ConfigError
from ctxwarden.store.base import SessionStore, StoredMessage, StoredSession, SummaryInput
from ctxwarden.store.migrations import MIGRATIONS, Migration
from ctxwarden.store.sqlite import SQLiteStore

__all__ = [
    "MIGRATIONS",
    "Migration",
    "SQLiteStore",
    "SessionStore",
    "StoredMessage",
    "StoredSession",
    "SummaryInput",
    "open_store",
]


def open_store(url: str, **options: Any) -> SessionStore:
    """Open (creating and migrating as needed) the store that ``url`` names."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        if not path:
            raise ConfigError("sqlite URL needs a path: sqlite:///path.db or sqlite:///:memory:")
        return SQLiteStore(path, **options)
    if url.startswith(("postgresql://", "postgres://")):
        from ctxwarden.store.postgres import PostgresStore

        return PostgresStore(url, **options)
    raise ConfigError(
        f"unknown store URL {url!r}: use sqlite:///path.db, sqlite:///:memory: "
        "or postgresql://user@host/db"
    )
