"""``ctxwarden mcp``: the MCP server over stdio, on a store URL, for one tenant.

The agent starts it as a subprocess (``claude mcp add``, Codex's ``[mcp_servers]``), so
whoever runs it can read the store file anyway: no key is asked; the tenant is an option
(default ``local``, the tenant ``ctxwarden wrap`` runs agents as). ``CTXWARDEN_SESSION``,
which ``wrap`` exports to the agent and the agent passes on, is the session hint.
Protocol messages own stdout; logs go to stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from ctxwarden.mcp.server import build_server
from ctxwarden.store import open_store
from ctxwarden.store.base import SessionStore

__all__ = ["StoreAccess", "run_stdio"]

T = TypeVar("T")


class StoreAccess:
    """One tenant's sessions in a store opened by this process; reads run in one worker
    thread at a time (the store's connection is not shared across threads at once)."""

    def __init__(self, store: SessionStore, tenant: str, hint: str | None) -> None:
        self._store = store
        self._tenant = tenant
        self._hint = hint
        self._limiter = anyio.CapacityLimiter(1)

    @property
    def store(self) -> SessionStore:
        return self._store

    async def tenant(self, headers: Mapping[str, str] | None) -> str:
        return self._tenant

    def session(self, headers: Mapping[str, str] | None) -> str | None:
        return self._hint

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(lambda: fn(*args), limiter=self._limiter)


def run_stdio(db: str, tenant: str) -> None:
    """Serve the tools over stdin/stdout until the client closes them."""
    with contextlib.suppress(ImportError):  # (search then says which extra it needs)
        import bm25s  # noqa: F401 - it sets its logger to DEBUG on import: quiet it after

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    with open_store(db) as store:
        access = StoreAccess(store, tenant, os.environ.get("CTXWARDEN_SESSION") or None)
        server = build_server(access)
        anyio.run(server.run_stdio_async)
