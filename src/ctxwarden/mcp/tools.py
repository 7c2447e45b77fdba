"""What the MCP tools do, over a store: find which session a handle belongs to, return
its original, and rank the session's dropped history for a few words. Blocking store
reads; the server runs them off the event loop.

**Which session.** A handle names a message id (``cw:msg:m12``), and store-given ids
repeat across sessions, so the tools take the session when the caller knows it (the
tool's ``session`` argument). Else a *hint* is tried first when it holds the message: the
``X-Ctxwarden-Session`` header over HTTP, ``CTXWARDEN_SESSION`` on stdio (``ctxwarden
wrap`` exports it, and an MCP server the agent starts inherits it). Else the handle goes
to the tenant's session whose newest logged context shows it, among the :data:`RECENT`
most recently active (the most recent when several do: two agents working at once should
name their sessions), else to the most recent session that has a message with that id.

**Dropped history** is every stored message that the session's newest logged context
does not show whole: left out by the window, summarised, masked or truncated. When no
context is logged (the session was built without the log, or its newest context is no
longer kept) the whole session is searched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ctxwarden.core.errors import UnknownHandleError
from ctxwarden.core.handles import handle_for, message_id_of
from ctxwarden.core.messages import Message
from ctxwarden.formats.openai import message_from_openai
from ctxwarden.session.recall import audit_recall, find_stored, original_content, recalled
from ctxwarden.store.base import SessionStore
from ctxwarden.store.service_tables import (
    BuildRecord,
    latest_builds,
    list_builds,
    logged_context,
)

__all__ = ["RECENT", "SearchHit", "recall_original", "search_dropped", "which_session"]

RECENT = 10
"""Sessions (most recently active first) whose newest context is read to place a handle."""
SNIPPET = 300
"""Characters of a hit's text shown in a search result (the recall tool gives it whole)."""
_MAX_SEARCHED = 5000  # newest messages of a session searched
_MAX_CHARS = 20_000  # characters of each message indexed
_LOOK_BACK = 50  # newest builds read for one that logged its context


@dataclass(frozen=True)
class SearchHit:
    handle: str
    role: str
    name: str | None  # the tool's name, for a tool result
    snippet: str

    def to_dict(self) -> dict[str, Any]:
        return {"handle": self.handle, "role": self.role, "name": self.name,
                "snippet": self.snippet}  # fmt: skip


def _recent(store: SessionStore, tenant: str, first: str | None) -> list[str]:
    """The tenant's session ids, most recently active first (``first`` first, if there)."""
    ids = [s.session_id for s in sorted(store.list_sessions(tenant), key=lambda s: -s.updated_at)]
    if first is not None and first in ids:
        ids.remove(first)
        ids.insert(0, first)
    return ids


def _newest_context(
    store: SessionStore, tenant: str, session_id: str, newest: BuildRecord | None
) -> list[Message] | None:
    """The built messages of the session's newest build that logged them (recalls log a
    row without any), or None; ``newest`` is the session's newest build."""
    if newest is None:
        return None
    since = max(0, newest.turn - _LOOK_BACK)
    builds = list_builds(store, tenant, session_id, limit=_LOOK_BACK + 1, since_turn=since)
    logged = [b for b in builds if b.has_context]
    rows = logged_context(store, tenant, session_id, logged[-1].build_id) if logged else None
    if rows is None:
        return None
    return [message_from_openai(r["message"]) for r in rows if isinstance(r.get("message"), dict)]


def _shows(
    store: SessionStore, tenant: str, session_id: str, newest: BuildRecord | None, handle: str
) -> bool:
    """The session's newest logged context shows ``handle`` (whole: ``cw:msg:m1`` is not
    shown by ``cw:msg:m12``)."""
    context = _newest_context(store, tenant, session_id, newest)
    if context is None:
        return False
    shown = re.compile(re.escape(handle_for(message_id_of(handle))) + r"(?![\w.:/-])")
    return any(shown.search(m.text) for m in context)


def _holds(store: SessionStore, tenant: str, session_id: str, handle: str) -> bool:
    try:
        find_stored(store, tenant, session_id, handle)
    except UnknownHandleError:
        return False
    return True


def which_session(
    store: SessionStore, tenant: str, handle: str, session: str | None, hint: str | None = None
) -> str:
    """The session ``handle`` is looked up in (see the module)."""
    if session:
        return session
    ids = _recent(store, tenant, None)
    if hint is not None and hint in ids and _holds(store, tenant, hint, handle):
        return hint
    latest = latest_builds(store, tenant)  # one read for all sessions
    for session_id in ids[:RECENT]:
        if _shows(store, tenant, session_id, latest.get(session_id), handle):
            return session_id
    for session_id in ids:
        if _holds(store, tenant, session_id, handle):
            return session_id
    raise UnknownHandleError(handle, f"no session of tenant {tenant!r} has that message")


def recall_original(
    store: SessionStore,
    tenant: str,
    handle: str,
    session: str | None = None,
    hint: str | None = None,
) -> tuple[str, str]:
    """``(session id, original content)`` of the message ``handle`` names, byte for byte
    as stored; the recall is audited with the session's builds (as
    :meth:`ctxwarden.Session.recall` does)."""
    session_id = which_session(store, tenant, handle, session, hint)
    seq, message = find_stored(store, tenant, session_id, handle)
    found = recalled(message, "gpt-4o", seq)
    audit_recall(store, tenant, session_id, found)
    return session_id, found.content


def search_dropped(
    store: SessionStore,
    tenant: str,
    words: str,
    session: str | None = None,
    hint: str | None = None,
    limit: int = 5,
) -> tuple[str, list[SearchHit]]:
    """``(session id, hits)``: the session's dropped history ranked by BM25 for ``words``
    (best first, at most ``limit``); the session is ``session``, else ``hint`` when it
    exists, else the most recently active."""
    from ctxwarden.steps.recall_relevant import _Passage, _rank  # the relevance step's BM25

    session_id = session or next(iter(_recent(store, tenant, hint)), None)
    if session_id is None:
        return "", []
    newest = latest_builds(store, tenant).get(session_id)
    context = _newest_context(store, tenant, session_id, newest)
    shown = {m.id: original_content(m) for m in context} if context is not None else {}
    record = store.get_session(tenant, session_id)
    end = record.next_seq if record is not None else 0
    dropped: list[Message] = []
    tools: dict[str, str] = {}  # call id -> tool name, to name a result's tool
    for lo in range(max(0, end - _MAX_SEARCHED), end, 500):
        for stored in store.range(tenant, session_id, lo, min(lo + 500, end)):
            m = stored.message
            tools.update((c.id, c.name) for c in m.tool_calls)
            if m.role != "system" and shown.get(m.id) != original_content(m):
                dropped.append(m)
    passages = [_Passage(i, 0, original_content(m)[:_MAX_CHARS]) for i, m in enumerate(dropped)]
    hits = []
    for passage in _rank(passages, words)[:limit]:
        m = dropped[passage.pos]
        text = original_content(m)
        snippet = text if len(text) <= SNIPPET else text[:SNIPPET] + "…"
        name = m.name or (tools.get(m.tool_call_id or "") if m.role == "tool" else None)
        hits.append(SearchHit(handle_for(m.id), m.role, name, snippet))
    return session_id, hits
