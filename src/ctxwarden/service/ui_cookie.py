"""The session page's sign-in cookie: a tenant name and an expiry, signed by the server.

``v1.<tenant, base64>.<expiry, unix seconds>.<HMAC-SHA256, base64>``, the MAC keyed by the
server's secret (:func:`~ctxwarden.store.page_auth.page_secret`, kept in the store and
shared by the replicas) over the tenant, the expiry and the tenant's current key hash.
So a cookie:

- holds nothing the store holds (a leaked row, the key hash included, signs no one in);
- expires after :data:`LIFETIME` (checked before any store read);
- stops working when the tenant is revoked or given a new key (the hash it was signed
  with is gone), and for everyone when the secret is rotated
  (``ctxwarden tenant rotate-page-secret``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

__all__ = ["LIFETIME", "check", "claimed_tenant", "sign"]

LIFETIME = 12 * 3600
"""Seconds a sign-in lasts."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, tenant: str, expiry: int, key_hash: str) -> str:
    message = f"{tenant}\n{expiry}\n{key_hash}".encode()
    return _b64(hmac.new(secret.encode(), message, hashlib.sha256).digest())


def sign(secret: str, tenant: str, key_hash: str, *, now: float | None = None) -> str:
    """The cookie value for ``tenant`` (signed in with the key hashing to ``key_hash``)."""
    expiry = int((time.time() if now is None else now) + LIFETIME)
    name = _b64(tenant.encode())
    return f"v1.{name}.{expiry}.{_mac(secret, tenant, expiry, key_hash)}"


def claimed_tenant(cookie: str, *, now: float | None = None) -> tuple[str, int, str] | None:
    """The tenant, expiry and MAC a well-formed, unexpired cookie claims (not yet
    checked: :func:`check`), or None."""
    parts = cookie.split(".")
    if len(parts) != 4 or parts[0] != "v1" or not parts[2].isdigit() or len(cookie) > 512:
        return None
    try:
        tenant = _unb64(parts[1]).decode()
    except ValueError:
        return None
    expiry = int(parts[2])
    if expiry < (time.time() if now is None else now) or not tenant:
        return None
    return tenant, expiry, parts[3]


def check(secret: str, tenant: str, expiry: int, mac: str, key_hash: str) -> bool:
    """Whether ``mac`` is the server's signature of the claim (constant time)."""
    return hmac.compare_digest(_mac(secret, tenant, expiry, key_hash), mac)
