"""What an open session knows of its newest stored messages, so it reads less (speed only).

:meth:`SessionStore.tail` walks the stored counts back from the newest message until
the budget is full: in an agent's loop the next build's tail is that tail plus what
was appended since, shortened at the front. :class:`TailMemo` keeps the last tail and
the messages this session appended after it (as stored: message, seq and counts), and
gives the next tail without reading when the store holds exactly those messages after
it (its ``next_seq`` says so; stored messages never change, and a session deleted and
created again has a new ``created_at``). The walk is the store's, message for message:
the newest messages whose counts fit, at least one. When the walk would need messages
older than the memo holds, or anything else differs, it answers ``None`` and the store
is read. It belongs to one :class:`~ctxwarden.Session`, which is not shared between
threads.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import count_key
from ctxwarden.store import SessionStore, StoredMessage
from ctxwarden.store._sql import SqlStore
from ctxwarden.store.base import read_as_pinned

__all__ = ["TailMemo", "count_key", "last_block", "with_tail"]

_APPENDED = 1024  # appended messages remembered (an agent's turn appends a few)


def _size(row: StoredMessage, key: str, count: Callable[[Message], int]) -> int:
    counts = row.token_counts
    return int(counts[key]) if key in counts else count(row.message)


def _walk(
    rows: Sequence[StoredMessage], max_tokens: int, key: str, count: Callable[[Message], int]
) -> tuple[list[StoredMessage], int]:
    """:meth:`SessionStore.tail` over ``rows`` (oldest first): the newest that fit, and
    their tokens."""
    chosen: list[StoredMessage] = []
    used = 0
    for row in reversed(rows):
        size = _size(row, key, count)
        if used + size > max_tokens and chosen:
            break
        used += size
        chosen.append(row)
    chosen.reverse()
    return chosen, used


class TailMemo:
    def __init__(self) -> None:
        self._appended: dict[int, StoredMessage] = {}
        self._last: tuple[Hashable, int, tuple[StoredMessage, ...]] | None = None
        # the last tail given, when it held every row it was walked over, and its tokens:
        # rows appended since that still fit extend it without walking it again
        self._whole: tuple[list[StoredMessage], int] | None = None
        self._last_whole: int | None = None  # the tokens of ``_last``'s rows, when known
        self._pinned: tuple[float, int, tuple[StoredMessage, ...]] | None = None
        self._user: tuple[float, int, tuple[int, ...]] | None = None  # newest user seqs

    def clear(self) -> None:
        self._appended.clear()
        self._last = self._pinned = None
        self._user = None
        self._whole = self._last_whole = None

    def pinned(
        self, created_at: float, next_seq: int, read: Callable[[], list[StoredMessage]]
    ) -> list[StoredMessage]:
        """The session's pinned messages and system prompts while it holds ``next_seq``
        messages: the last ones ``read()`` gave, with those this session appended since
        (a stored message never changes, nor whether it is pinned), else ``read()``."""
        if self._pinned is not None:
            was, upto, rows = self._pinned
            new = [self._appended.get(seq) for seq in range(upto, next_seq)]
            if was == created_at and next_seq >= upto and None not in new:
                pins = [r for r in new if r is not None and read_as_pinned(r.message)]
                found = [*rows, *pins]
                self._pinned = (created_at, next_seq, tuple(found))
                return found
        found = read()  # (read after next_seq was: it may hold newer messages)
        upto = max(next_seq, found[-1].seq + 1) if found else next_seq
        self._pinned = (created_at, upto, tuple(found))
        return found

    def newest_users(
        self, created_at: float, next_seq: int, n: int, read: Callable[[], list[int]]
    ) -> list[int]:
        """The seqs of the session's ``n`` newest user messages (oldest first) while it
        holds ``next_seq`` messages: the last ones ``read()`` gave, moved on by the
        messages this session appended since, else ``read()``."""
        if self._user is not None:
            was, upto, found = self._user
            new = [self._appended.get(seq) for seq in range(upto, next_seq)]
            if was == created_at and next_seq >= upto and None not in new and len(found) <= n:
                users = [r.seq for r in new if r is not None and r.message.role == "user"]
                found = (*found, *users)[-n:]
                self._user = (created_at, next_seq, found)
                return list(found)
        got = tuple(read())  # (read after next_seq was: it may have seen newer ones)
        self._user = (created_at, max(next_seq, got[-1] + 1) if got else next_seq, got)
        return list(got)

    def appended(self, seq: int, message: Message, counts: Mapping[str, int]) -> None:
        """A message this session stored at ``seq`` (as the store reads it back)."""
        self._appended[seq] = StoredMessage(seq, message, dict(counts))
        if len(self._appended) > _APPENDED:
            for old in sorted(self._appended)[: len(self._appended) - _APPENDED]:
                del self._appended[old]

    def tail(
        self,
        scope: Hashable,
        next_seq: int,
        after_seq: int,
        max_tokens: int,
        key: str,
        count: Callable[[Message], int],
    ) -> list[StoredMessage] | None:
        """The store's tail for these arguments, or ``None`` when the memo cannot tell.
        ``scope`` names everything else the tail depends on (the session's
        ``created_at``, ``after_seq``, ``max_tokens``, ``key``)."""
        if self._last is None:
            return None
        was, upto, rows = self._last
        if was != scope or next_seq < upto:
            return None
        new = [self._appended.get(seq) for seq in range(upto, next_seq)]
        if any(row is None for row in new):
            return None  # another writer appended: read
        added = [row for row in new if row is not None]
        rows = (*rows, *added)
        whole = self._last_whole
        if whole is not None:  # every row fit: they all still do when the new ones fit too
            whole += sum(_size(row, key, count) for row in added)
        if whole is not None and whole <= max_tokens:
            chosen, used = list(rows), whole
        else:
            chosen, used = _walk(rows, max_tokens, key, count)
        self._whole = (chosen, used) if len(chosen) == len(rows) else None
        if len(chosen) == len(rows) and rows and rows[0].seq != after_seq + 1:
            return None  # everything fits: older messages than the memo holds might too
        if not rows and next_seq > after_seq + 1:
            return None
        return chosen

    def remember(self, scope: Hashable, next_seq: int, rows: Sequence[StoredMessage]) -> None:
        """The tail just read (or given) for ``scope`` while the session held ``next_seq``
        (the tail may hold newer messages, read after ``next_seq`` was)."""
        upto = max(next_seq, rows[-1].seq + 1) if rows else next_seq
        whole = self._whole
        self._last_whole = whole[1] if whole is not None and whole[0] is rows else None
        self._whole = None
        self._last = (scope, upto, tuple(rows))


def with_tail(
    merged: Mapping[int, StoredMessage], tail: Sequence[StoredMessage]
) -> list[StoredMessage]:
    """The messages ``merged`` holds (pinned, first ones; by seq) and ``tail`` (oldest
    first, as the store gives it), in seq order; the tail alone when there are none."""
    if not merged:
        return list(tail)
    if tail:  # mostly: a few pinned messages before the tail or in it (the tail's row wins)
        lo, hi = tail[0].seq, tail[-1].seq
        if hi - lo + 1 == len(tail):  # no gap: a seq in range is at its offset
            before = sorted(seq for seq in merged if seq < lo)
            if all(lo <= seq <= hi for seq in merged if seq >= lo):
                return [merged[seq] for seq in before] + list(tail)
    both = {**merged, **{m.seq: m for m in tail}}
    return [both[seq] for seq in sorted(both)]


def last_block(
    store: SessionStore,
    tenant: str,
    session_id: str,
    cache: Mapping[int, Message],
    cache_of: float,
    at: tuple[int, float] | None = None,
) -> list[Message]:
    """The stored messages from the last one that is not a tool result (a tool call and
    the results it has so far), for :meth:`Session.append`'s pairing check: from the
    session's decoded messages (``cache``, of the session created at ``cache_of``) when
    they hold them (an agent's loop appends right after its last append or build), else
    read back in pages from the end. ``at``: the session's ``(next_seq, created_at)``
    when the caller knows it (else it is read)."""
    at = at if at is not None else _position(store, tenant, session_id)
    end = at[0] if at is not None else 0
    if at is not None and at[1] == cache_of:
        block: list[Message] = []
        for seq in range(end - 1, -1, -1):
            cached = cache.get(seq)
            if cached is None:
                break
            block.append(cached)
            if cached.role != "tool":
                return block[::-1]
    start, page = end, 16
    while start > 0:
        start = max(0, start - page)
        found = store.range(tenant, session_id, start, end)
        roles = [m.message.role for m in found]
        if any(r != "tool" for r in roles):
            last = max(i for i, r in enumerate(roles) if r != "tool")
            return [m.message for m in found[last:]]
        page *= 2
    return [m.message for m in store.range(tenant, session_id, 0, end)]


def check_appended(
    store: SessionStore,
    tenant: str,
    session_id: str,
    cache: Mapping[int, Message],
    cache_of: float,
    messages: Sequence[Message],
    expect_next: int | None,
) -> dict[str, Any]:
    """Check that ``messages`` may follow the stored last block
    (:func:`~ctxwarden.core.pairing.validate_appended`); return what the store's append
    must check more. An append that expects ``expect_next`` messages in the session the
    cache holds (created at ``cache_of``) knows where the session ends without reading
    it, when the SQL store's append checks both in its transaction (``expect_created``).
    Messages refused there are checked against where the session really ends: a session
    that moved on is the append's conflict to report, not theirs."""
    from ctxwarden.core.pairing import validate_appended

    if expect_next is None or not cache_of or not isinstance(store, SqlStore):
        validate_appended(last_block(store, tenant, session_id, cache, cache_of), messages)
        return {}
    try:
        at = (expect_next, cache_of)
        validate_appended(last_block(store, tenant, session_id, cache, cache_of, at), messages)
    except InvalidMessageError:
        validate_appended(last_block(store, tenant, session_id, cache, cache_of), messages)
    return {"expect_created": cache_of}


def _position(store: SessionStore, tenant: str, session_id: str) -> tuple[int, float] | None:
    """``(next_seq, created_at)`` of a stored session: the SQL stores read just those two
    columns (:meth:`~ctxwarden.store._sql.SqlStore.position`), any other store its row."""
    if isinstance(store, SqlStore):
        return store.position(tenant, session_id)
    record = store.get_session(tenant, session_id)
    return None if record is None else (record.next_seq, record.created_at)
