"""The local tenant ``wrap`` runs agents as: created once, its key kept in the data dir.

A tenant's key is stored hashed in the store and shown once, so ``wrap`` keeps the key
itself in ``<data dir>/local-key`` (mode 0600) to use it again on every run. It is a
ctxwarden key (it opens this store's sessions through the proxy), not a provider key.
When the file and the store disagree (the file deleted, the store replaced, the tenant
revoked), the tenant gets a new key; its sessions stay stored. In a store of the user's
own (``--db``), an active ``local`` tenant whose key ``wrap`` does not hold is someone
else's: ``wrap`` refuses rather than revoke it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ctxwarden.core.errors import ConfigError
from ctxwarden.store import open_store
from ctxwarden.store.service_tables import (
    add_tenant,
    list_tenants,
    revoke_tenant,
    tenant_by_key_hash,
)

__all__ = ["LOCAL_TENANT", "local_tenant_key"]

LOCAL_TENANT = "local"


def _read_key(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return text or None


def _write_key(path: Path, key: str) -> None:
    """Write the key readable by the user only (created 0600, never world-readable)."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(key + "\n")
    os.replace(tmp, path)


def local_tenant_key(
    db: str, key_file: Path, tenant: str = LOCAL_TENANT, *, own_store: bool = True
) -> tuple[str, bool]:
    """The local tenant's key and whether it was made now: the kept key when the store
    knows it as ``tenant``'s active key, else a new key for ``tenant`` (created, or
    re-keyed with its sessions kept; in a store not ``own_store``, an active tenant is
    a :class:`~ctxwarden.core.errors.ConfigError` instead), written to ``key_file``."""
    from ctxwarden.service.keys import hash_key, new_key, shown_prefix

    kept = _read_key(key_file)
    with open_store(db) as store:
        if kept is not None:
            record = tenant_by_key_hash(store, hash_key(kept))
            if record is not None and record.tenant == tenant:
                return kept, False
        key = new_key()
        known = {t.tenant: t for t in list_tenants(store)}
        if tenant in known and known[tenant].active:
            if not own_store:
                raise ConfigError(
                    f"tenant {tenant!r} in {db} has a key wrap does not hold ({key_file}); "
                    f"revoke it (ctxwarden tenant revoke {tenant} --db ...) to let wrap re-key it"
                )
            revoke_tenant(store, tenant)  # its key was lost: issue a new one
        add_tenant(store, tenant, key_hash=hash_key(key), key_prefix=shown_prefix(key))
    _write_key(key_file, key)
    return key, True
