"""The rows the session page's sign-in reads: the server's signing secret, and a tenant's
current key hash (migration 011).

The secret is random, made on first use and kept in the store (``ctxwarden_secrets``),
so every replica signs and checks the same cookies; :func:`rotate_secret` replaces it,
which signs every browser out. A cookie never holds a value the store holds
(:mod:`ctxwarden.service.ui_cookie`): a leaked row is not a login.
"""

from __future__ import annotations

import secrets
import time

from ctxwarden.store._sql import SqlStore
from ctxwarden.store.base import SessionStore

__all__ = ["PAGE_SECRET", "active_key_hash", "page_secret", "rotate_secret"]

PAGE_SECRET = "ui_cookie"


def _sql(store: SessionStore) -> SqlStore:
    assert isinstance(store, SqlStore), "the service runs on the SQL stores"
    return store


def page_secret(store: SessionStore) -> str:
    """The signing secret, made (once, whoever asks first) when there is none."""
    sql = _sql(store)
    with sql._read_one() as tx:
        rows = tx.execute("SELECT value FROM ctxwarden_secrets WHERE name = ?", (PAGE_SECRET,))
    if rows:
        return str(rows[0][0])
    with sql._write() as tx:
        tx.execute(
            "INSERT INTO ctxwarden_secrets (name, value, created_at) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO NOTHING",
            (PAGE_SECRET, secrets.token_urlsafe(32), time.time()),
        )
        rows = tx.execute("SELECT value FROM ctxwarden_secrets WHERE name = ?", (PAGE_SECRET,))
    return str(rows[0][0])


def rotate_secret(store: SessionStore) -> None:
    """A new signing secret: every cookie signed before is refused from now on."""
    with _sql(store)._write() as tx:
        tx.execute(
            "INSERT INTO ctxwarden_secrets (name, value, created_at) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value, "
            "created_at = excluded.created_at",
            (PAGE_SECRET, secrets.token_urlsafe(32), time.time()),
        )


def active_key_hash(store: SessionStore, tenant: str) -> str | None:
    """The key hash of ``tenant`` while it is active (None once revoked or unknown)."""
    with _sql(store)._read_one() as tx:
        rows = tx.execute(
            "SELECT key_hash FROM ctxwarden_tenants WHERE tenant = ? AND revoked_at IS NULL",
            (tenant,),
        )
    return str(rows[0][0]) if rows else None
