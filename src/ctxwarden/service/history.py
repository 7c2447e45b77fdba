"""Matching a client's full history to its stored session, and appending what is new.

Agents send their whole history on every call. The proxy keeps, per client session id,
a *head* (:class:`~ctxwarden.store.service_tables.Head`): the stored session it writes
to, how many messages of it the client has already seen (its own messages and the
replies the proxy stored), and a chained hash of those messages. A call whose first
``head.count`` messages hash to ``head.chain`` extends the stored session: only the
suffix is parsed, counted and appended. The hash covers what a message means (role,
text, tool calls, tool-call id, name), not how the SDK spelled it, so a reply echoed
back as ``content: null`` or ``""`` still matches.

**A client that edits or truncates its history** (or drops a partial reply after a
disconnect) does not match. Nothing stored is changed then: the proxy starts a new
*branch*, a new stored session ``<id>~b<n>`` holding the client's history as sent, and
moves the head there; the old branch stays readable through the session API. The
response header ``X-Ctxwarden-Session`` names the branch used. The same happens when
the head and the store disagree (the session written without the proxy, or by another
process under the same session id at once): the proxy never guesses. New messages and
the head's move are one transaction, so a lost race on the head stores nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden import Session
from ctxwarden.core.errors import InvalidMessageError, VersionConflict
from ctxwarden.core.messages import Message, RawPart, TextPart
from ctxwarden.store import SessionStore
from ctxwarden.store.ids import new_id_problem
from ctxwarden.store.service_tables import Head, get_head, put_head

__all__ = [
    "BRANCH_MARK",
    "Synced",
    "content_text",
    "derived_session_id",
    "message_key",
    "sync_history",
    "valid_session_id",
    "wire_key",
]

BRANCH_MARK = "~b"


def valid_session_id(value: str) -> str:
    """A client session id: the one grammar (:mod:`ctxwarden.store.ids`; ``~`` is kept
    for the proxy's branches, ``/`` for no new id)."""
    problem = new_id_problem(value)
    if problem is not None:
        raise InvalidMessageError(f"X-Ctxwarden-Session: {problem}")
    return value


def _field(h: Any, value: str | None) -> None:
    data = _utf8(value or "")
    h.update(b"%d:" % len(data))
    h.update(data)


def content_text(content: Any) -> str:
    """A message's content as one string (text parts joined, other parts as JSON)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            if isinstance(p, Mapping) and p.get("type") == "text"
            else json.dumps(p, sort_keys=True)
            for p in content
        )
    return json.dumps(content, sort_keys=True)


def wire_key(message: Mapping[str, Any]) -> bytes:
    """What a message means, as bytes to chain: role, call id, name, tool calls and text,
    each framed by its length. The proxy keys every message of every call, so this is a
    handful of C calls per message, the text encoded once (SHA-256: hardware-assisted)."""
    content = message.get("content")
    text = content if isinstance(content, str) else content_text(content)
    fields = [
        str(message.get("role", "")),
        message.get("tool_call_id") or "",
        message.get("name") or "",
    ]
    for call in message.get("tool_calls") or ():
        if isinstance(call, Mapping):
            fn = call.get("function") or {}
            fields += (
                str(call.get("id", "")),
                str(fn.get("name", "")),
                str(fn.get("arguments", "")),
            )
    head = "".join(f"{len(f)}:{f}" for f in fields) + f"{len(fields)}|{len(text)}:"
    h = hashlib.sha256(_utf8(head))
    h.update(_utf8(text))
    return h.digest()[:16]


def _utf8(text: str) -> bytes:
    try:
        return text.encode()  # the fast path; an error handler makes encode 30x slower
    except UnicodeEncodeError:  # a lone surrogate (JSON allows it)
        return text.encode("utf-8", "surrogatepass")


def message_key(message: Message) -> bytes:
    """:func:`wire_key` of one of our messages (the Anthropic side and stored replies).
    An assistant turn's raw parts (Anthropic ``thinking``, server tool blocks) are left
    out: they are the provider's, not what the turn says, so a client whose SDK spells
    them otherwise, or that drops them from earlier turns, still matches."""
    from ctxwarden.formats import message_to_openai

    content = message.content
    if (
        message.role == "assistant"
        and isinstance(content, tuple)
        and any(isinstance(p, RawPart) for p in content)
    ):
        text = "".join(p.text for p in content if isinstance(p, TextPart))
        message = Message.assistant(text or None, message.tool_calls)
    return wire_key(message_to_openai(message))


def derived_session_id(tenant: str, system: str, first_user: str) -> str:
    """The session id of a call without ``X-Ctxwarden-Session``: stable for a tenant, a
    system prompt and a first user message (``auto-`` and 20 hex digits)."""
    h = hashlib.blake2b(digest_size=10)
    for part in (tenant, system, first_user):
        _field(h, part)
    return "auto-" + h.hexdigest()


@dataclass
class Synced:
    """The stored session a call writes to, after its new messages were appended."""

    session: Session
    head: Head
    chain: Any  # the running hash after the client's messages, to extend with the reply
    appended: int
    forked: bool
    #: a retry of the call whose reply the session ends with: that reply, given back
    #: (:mod:`ctxwarden.service.replay`); nothing was appended
    replayed: Message | None = None


def _chain(keys: Sequence[bytes], upto: int) -> tuple[Any, str | None]:
    """The running hash over all ``keys`` and its hex digest after the first ``upto``."""
    # (hashed in two joined runs: the same digests as one key at a time)
    h = hashlib.sha256(b"".join(keys[:upto]) if upto > 0 else b"")
    at: str | None = h.hexdigest() if 0 <= upto <= len(keys) else None
    h.update(b"".join(keys[max(upto, 0) :]))
    return h, at


def sync_history(
    store: SessionStore,
    open_session: Callable[[str], Session],
    tenant: str,
    client_id: str,
    keys: Sequence[bytes],
    parse: Callable[[int], list[Message]],
    count: Callable[[Message], int],
    *,
    attempts: int = 3,
    check: Callable[[list[Message], tuple[Session, int] | None], None] | None = None,
    request: str | None = None,
) -> Synced:
    """Append the new suffix of the client's history (``keys``, one per message;
    ``parse(start)`` gives the messages from ``start`` on) to the session its head names,
    or to a new branch when the history does not extend it (see the module docstring).
    ``check(new, extends)`` may refuse the new messages before anything is stored (``extends``:
    the stored session they extend and its tokens, when they extend one); ``request``
    (the call's :func:`~ctxwarden.service.replay.request_digest`) lets a retry of the
    session's last call be recognised (:attr:`Synced.replayed`)."""
    recount = False  # (see _try_sync)
    for _ in range(attempts):
        head = get_head(store, tenant, client_id)
        synced = _try_sync(
            store,
            open_session,
            tenant,
            client_id,
            head,
            keys,
            parse,
            count,
            recount,
            check,
            request,
        )
        if synced is not None:
            return synced
        recount = True
    raise VersionConflict(
        f"session {client_id!r} is being written by another caller at the same time; retry"
    )


def _try_sync(
    store: SessionStore,
    open_session: Callable[[str], Session],
    tenant: str,
    client_id: str,
    head: Head | None,
    keys: Sequence[bytes],
    parse: Callable[[int], list[Message]],
    count: Callable[[Message], int],
    recount: bool = False,
    check: Callable[[list[Message], tuple[Session, int] | None], None] | None = None,
    request: str | None = None,
) -> Synced | None:
    """One attempt (``None``: lost a race, read the head again and retry). Whether the
    store moved without the head (a crash, another writer) is read from the store when
    the client sent nothing new, or after a failed attempt (``recount``); otherwise the
    append checks it, against the head's count in its transaction, and a failed append
    has the next attempt read it."""
    seen = head.count if head is not None else 0
    running, at = _chain(keys, seen)
    if request is not None and head is not None and seen == len(keys) + 1:  # a retry?
        retried = _retried(open_session, head, running, request)
        if retried is not None:
            return Synced(retried[0], head, running, 0, False, replayed=retried[1])
    session: Session | None = None
    if head is not None and seen <= len(keys) and at == head.chain:
        session = open_session(head.session_id)
        if (recount or seen == len(keys)) and session.store.count(
            session.tenant, session.session_id
        ) != head.count:
            session = None  # the store moved without the head (a crash, another writer)
    elif head is None:
        session = open_session(client_id)
        if session.record.next_seq:  # filled without the proxy (the session API): keep it
            session = None
    forked = session is None
    if session is not None and head is not None:
        new, branch, tokens = (
            parse(seen) if seen < len(keys) else [],
            head.branch,
            head.history_tokens,
        )
    elif session is not None:
        new, branch, tokens = parse(0), 0, 0
    else:
        branch = (head.branch if head is not None else 0) + 1
        while True:
            session = open_session(f"{client_id}{BRANCH_MARK}{branch}")
            if not session.record.next_seq:
                break
            branch += 1
        new, tokens = parse(0), 0
    if check is not None and new:
        extends = (session, head.history_tokens) if head is not None and not forked else None
        check(new, extends)
    tokens += sum(count(m) for m in new)
    moved = Head(
        tenant, client_id, session.session_id, branch, len(keys), running.hexdigest(), tokens
    )
    if new:
        # the messages and the head's move in one transaction, onto what was checked
        # above: a concurrent call's messages never interleave, and a lost race on the
        # head stores nothing (the caller re-reads)
        def move_head(tx: Any, _seqs: list[int]) -> None:
            if not put_head(store, moved, expected=head, tx=tx):
                raise _HeadMoved

        try:
            session.append(
                new,
                expect_next=head.count if head is not None and not forked else 0,
                also=move_head,
            )
        except (VersionConflict, _HeadMoved):
            return None
    elif not put_head(store, moved, expected=head):
        return None
    return Synced(session, moved, running, len(new), forked)


def _retried(
    open_session: Callable[[str], Session], head: Head, running: Any, request: str
) -> tuple[Session, Message] | None:
    """The session and its last message when the client's history (hashed in
    ``running``) plus that message is exactly what the head says the client has, and
    the message is a complete reply to the same ``request``: the client sent its last
    call again."""
    session = open_session(head.session_id)
    store, tenant, sid = session.store, session.tenant, session.session_id
    if store.count(tenant, sid) != head.count:
        return None
    rows = store.range(tenant, sid, head.count - 1, head.count)
    if len(rows) != 1:
        return None
    reply = rows[0].message
    if reply.role != "assistant" or reply.meta.get("partial"):
        return None
    if reply.meta.get("request") != request:  # (replay.REQUEST_META)
        return None
    chain = running.copy()
    chain.update(message_key(reply))
    return (session, reply) if chain.hexdigest() == head.chain else None


class _HeadMoved(Exception):
    """Another call moved the head between the read and the write."""
