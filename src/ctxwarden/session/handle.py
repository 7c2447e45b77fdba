"""What the build log and the summary cycle use of a :class:`~ctxwarden.session.Session`:
its store and names, how many builds it keeps, and where a call's usage goes. A protocol,
so those modules need not import the session that calls them."""

from __future__ import annotations

from typing import Protocol

from ctxwarden.core.registry.usage import Usage
from ctxwarden.store import SessionStore

__all__ = ["SessionHandle"]


class SessionHandle(Protocol):
    store: SessionStore
    tenant: str
    session_id: str
    keep_builds: int
    keep_contexts: int

    def record_usage(self, usage: Usage, model: str | None = None) -> Usage: ...
