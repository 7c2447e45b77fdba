"""Tenant API keys: made here, shown once, stored only as a hash.

A key is ``cwk_`` followed by 43 URL-safe characters (256 random bits). Because it is
random and long, SHA-256 of it is enough: it cannot be reversed, and guessing a key is
as hard as guessing the 256 bits (a slow password hash protects short human secrets,
which these are not). The first 12 characters are kept in clear to tell keys apart in
``ctxwarden tenant list``.
"""

from __future__ import annotations

import hashlib
import secrets

__all__ = ["KEY_PREFIX", "hash_key", "new_key", "shown_prefix"]

KEY_PREFIX = "cwk_"


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def shown_prefix(key: str) -> str:
    return key[:12]
