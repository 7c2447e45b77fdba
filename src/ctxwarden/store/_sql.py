"""The operations of a :class:`~ctxwarden.store.base.SessionStore`, written once in SQL.

Both backends subclass :class:`SqlStore` and supply only transactions (``_read`` and
``_write``), the schema introspection, and connection bookkeeping. Queries use ``?``
placeholders; the PostgreSQL cursor rewrites them.

Sequence numbers come from ``ctxwarden_sessions.next_seq``, bumped by the same
transaction that inserts the messages: the row lock (PostgreSQL) or the single writer
(SQLite) serialises appenders, so numbers never collide and are visible only together
with their messages. Reads for the build walk the primary key backwards in chunks and
stop when the budget is full, never reading the history.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal, overload

from ctxwarden.core.caching import memoize
from ctxwarden.core.errors import ConfigError, InvalidMessageError, StoreError, VersionConflict
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.store.base import (
    StoredMessage,
    StoredSession,
    SummaryInput,
    decode_message,
    decode_usage,
    encode_message,
    encode_usage,
    json_text,
    read_as_pinned,
    storable_text,
)
from ctxwarden.store.ids import storable_id_problem
from ctxwarden.store.migrations import Tx

__all__ = ["SqlStore"]

_SESSION_COLS = (
    "tenant, session_id, summary, facts, sticky, version, created_at, updated_at, "
    "summary_upto, next_seq, usage, summary_levels"
)
_WHERE = "WHERE tenant = ? AND session_id = ?"
_MAX_SEQ = 2**62


def _session(row: Sequence[Any]) -> StoredSession:
    by_model, dollars = _usage(row[10])
    return StoredSession(
        tenant=row[0],
        session_id=row[1],
        summary=row[2],
        facts=json.loads(row[3]),
        sticky=_sticky(row[4]),
        version=int(row[5]),
        created_at=float(row[6]),
        updated_at=float(row[7]),
        summary_upto=int(row[8]),
        next_seq=int(row[9]),
        usage=dict(by_model),
        dollars=dollars,
        summary_levels=json.loads(row[11]),
    )


@memoize(8_192)
def _counts(text: str) -> Mapping[str, int]:
    """A row's parsed ``token_counts``. The texts repeat (``{"o200k_base": 57}``) and a
    build reads hundreds of rows, so each is parsed once: a bounded memo of a pure
    function (the mapping it returns is shared: never mutated)."""
    parsed: Mapping[str, int] = json.loads(text)
    return parsed


@memoize(512)
def _usage(text: str) -> tuple[tuple[tuple[str, Usage], ...], float]:
    """A session row's decoded ``usage``: a proxied call reads the row several times
    between two changes of it, so each text is decoded once (a bounded memo of a pure
    function; its :class:`Usage` values are frozen, the dict is made per row)."""
    by_model, dollars = decode_usage(text)
    return tuple(by_model.items()), dollars


@memoize(512)
def _sticky(text: str) -> Mapping[str, Any]:
    """A session row's parsed ``sticky`` (the last build's state, ~10 KB for a 200-message
    context). A proxied call reads the row several times between two builds, so each
    text is parsed once: a bounded memo of a pure function (the mapping it returns is
    shared: never mutated)."""
    parsed: Mapping[str, Any] = json.loads(text)
    return parsed


def _message(row: Sequence[Any]) -> StoredMessage:
    seq = int(row[0])
    return StoredMessage(seq, decode_message(row[1], seq), _counts(row[2]))


class SqlStore(ABC):
    """Shared implementation; see the module docstring."""

    #: SQL run first in the transactions that only write advisory state (the last build's
    #: sticky decisions, the ledger checkpoint): a backend may relax durability there,
    #: since losing them on a crash costs a cold build, never a message or a summary.
    _advisory_write: str | None = None

    url: str

    def _utf8_text(self, data: bytes) -> tuple[str, Any]:
        """A TEXT parameter given as its UTF-8: the placeholder and the value to bind.
        By default the text itself (decoded); a backend that can store the bytes as
        TEXT without decoding them says how (SQLite: ``CAST(? AS TEXT)``)."""
        return "?", data.decode()

    @abstractmethod
    def _read(self) -> AbstractContextManager[Tx]:
        """A short read transaction seeing one snapshot."""

    @abstractmethod
    def _write(self) -> AbstractContextManager[Tx]:
        """A short write transaction (holding the write lock from its first statement)."""

    def _read_one(self) -> AbstractContextManager[Tx]:
        """For a read of one statement (a statement sees one snapshot by itself): a
        backend may skip the transaction around it (SQLite: two statements fewer)."""
        return self._read()

    # -- sessions -------------------------------------------------------------------------

    def create_session(self, tenant: str, session_id: str) -> StoredSession:
        """Get the session, creating it when new (idempotent, safe under concurrency)."""
        if not tenant or not session_id:
            raise ValueError("tenant and session_id must be non-empty strings")
        problem = storable_id_problem(session_id)
        if problem is not None:  # (ids.py: the one grammar; the store refuses what it cannot hold)
            raise InvalidMessageError(problem, field="session_id")
        now = time.time()
        with self._write() as tx:
            tx.execute(
                "INSERT INTO ctxwarden_sessions (tenant, session_id, created_at, updated_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (tenant, session_id) DO NOTHING",
                (tenant, session_id, now, now),
            )
            rows = tx.execute(
                f"SELECT {_SESSION_COLS} FROM ctxwarden_sessions {_WHERE}", (tenant, session_id)
            )
        return _session(rows[0])

    def get_session(self, tenant: str, session_id: str) -> StoredSession | None:
        if storable_id_problem(session_id) is not None:
            return None  # not one the store could hold
        with self._read_one() as tx:
            rows = tx.execute(
                f"SELECT {_SESSION_COLS} FROM ctxwarden_sessions {_WHERE}", (tenant, session_id)
            )
        return _session(rows[0]) if rows else None

    def _exists(self, tx: Tx, tenant: str, session_id: str) -> bool:
        return bool(tx.execute(f"SELECT 1 FROM ctxwarden_sessions {_WHERE}", (tenant, session_id)))

    def _require(self, tx: Tx, tenant: str, session_id: str) -> StoredSession:
        rows = tx.execute(
            f"SELECT {_SESSION_COLS} FROM ctxwarden_sessions {_WHERE}", (tenant, session_id)
        )
        if not rows:
            raise StoreError(f"no session {session_id!r} for tenant {tenant!r}; create it first")
        return _session(rows[0])

    def list_sessions(self, tenant: str) -> list[StoredSession]:
        with self._read() as tx:
            rows = tx.execute(
                f"SELECT {_SESSION_COLS} FROM ctxwarden_sessions WHERE tenant = ? "
                "ORDER BY created_at, session_id",
                (tenant,),
            )
        return [_session(r) for r in rows]

    # -- messages -------------------------------------------------------------------------

    def append(
        self,
        tenant: str,
        session_id: str,
        messages: Sequence[Message],
        token_counts: Sequence[Mapping[str, int]],
        *,
        expect_next: int | None = None,
        also: Callable[[Tx, list[int]], object] | None = None,
        expect_created: float | None = None,
    ) -> list[int]:
        """Store ``messages`` atomically, in order; return their sequence numbers.

        ``expect_next``: store them only if the session still holds exactly that many
        messages, else raise :class:`VersionConflict` and store nothing (the proxy's
        optimistic check: two replicas serving turns of one session at once never
        interleave their messages into one history); ``expect_created``: and the session
        is still the one created then. A message whose id was derived from its content
        (no explicit id) is stored with id ``m<seq>``: unique in the session even for
        repeated texts, and the id :func:`~ctxwarden.formats.messages_from_openai` gives
        the exported transcript. ``also(tx, seqs)`` runs in the same transaction after
        the insert (the proxy closes its call there: usage, spend, build status, head): if
        it raises, nothing of the call is stored.
        """
        if len(token_counts) != len(messages):
            raise ValueError("give one token_counts mapping per message")
        if not messages:
            return []
        # an automatic id becomes ``m<seq>``, known inside the transaction: those messages
        # are written there, once; the others before the transaction opens
        auto = [m.id == "h" + m.fingerprint[:12] for m in messages]
        encoded = ["" if auto[i] else encode_message(m) for i, m in enumerate(messages)]
        now = time.time()
        n = len(messages)
        guard = "" if expect_next is None else " AND next_seq = ?"
        params = (n, now, tenant, session_id) + (() if expect_next is None else (expect_next,))
        if expect_next is not None and expect_created is not None:  # (not made again)
            guard, params = guard + " AND created_at = ?", (*params, expect_created)
        with self._write() as tx:
            rows = tx.execute(
                "UPDATE ctxwarden_sessions SET next_seq = next_seq + ?, updated_at = ? "
                f"{_WHERE}{guard} RETURNING next_seq",
                params,
            )
            if not rows and expect_next is not None and self._exists(tx, tenant, session_id):
                raise VersionConflict(
                    f"session {session_id!r} no longer holds {expect_next} messages: "
                    "another call appended meanwhile"
                )
            if not rows:
                raise StoreError(
                    f"no session {session_id!r} for tenant {tenant!r}; create it first"
                )
            first = int(rows[0][0]) - n
            for i, message in enumerate(messages):
                if auto[i]:
                    encoded[i] = encode_message(message.with_id(f"m{first + i}"))
            tx.executemany(
                "INSERT INTO ctxwarden_messages (tenant, session_id, seq, message, role, kind, "
                "pinned, priority, token_counts, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        tenant,
                        session_id,
                        first + i,
                        encoded[i],
                        m.role,
                        m.kind,
                        1 if read_as_pinned(m) else 0,
                        m.priority,
                        json.dumps(dict(token_counts[i])),
                        m.created_at if m.created_at is not None else now,
                    )
                    for i, m in enumerate(messages)
                ],
            )
            seqs = list(range(first, first + n))
            if also is not None:
                also(tx, seqs)
        return seqs

    def tail(
        self,
        tenant: str,
        session_id: str,
        max_tokens: int,
        encoding: str,
        *,
        after_seq: int = -1,
        min_messages: int = 1,
        count: Callable[[Message], int] | None = None,
        cache: MutableMapping[int, Message] | None = None,
        cap: int | None = None,
    ) -> list[StoredMessage]:
        """The newest messages (seq > ``after_seq``) whose ``encoding`` counts fit in
        ``max_tokens``, oldest first; at least ``min_messages`` whatever their size. With
        ``cap``, a message counts as at most ``cap`` tokens (the engine's cold walk back
        counts so, :mod:`ctxwarden.steps.window`).

        Reads ``(seq, token_counts)`` backwards along the primary key in growing chunks
        and stops at the first message that does not fit, so the cost is bounded by the
        budget, not by the history; then fetches the message bodies it lacks (``cache``
        maps seq -> an already decoded message: stored messages never change). A message
        stored without a count for ``encoding`` is counted with ``count``.
        """
        cache = {} if cache is None else cache
        chosen: list[tuple[int, Mapping[str, int]]] = []
        used, before, chunk = 0, _MAX_SEQ, 32
        with self._read() as tx:
            while True:
                rows = tx.execute(
                    "SELECT seq, token_counts FROM ctxwarden_messages "
                    f"{_WHERE} AND seq > ? AND seq < ? ORDER BY seq DESC LIMIT ?",
                    (tenant, session_id, after_seq, before, chunk),
                )
                full = False
                for row in rows:
                    seq, counts = int(row[0]), _counts(row[1])
                    if encoding in counts:
                        size = int(counts[encoding])
                    elif count is not None:
                        size = count(self._fetch(tx, tenant, session_id, [seq], cache)[seq])
                    else:
                        raise StoreError(
                            f"message {seq} has no token count for {encoding!r} "
                            f"(stored: {', '.join(counts) or 'none'}); pass count="
                        )
                    if cap is not None:
                        size = min(size, cap)
                    if used + size > max_tokens and len(chosen) >= min_messages:
                        full = True
                        break
                    used += size
                    chosen.append((seq, counts))
                if full or len(rows) < chunk:
                    break
                before = int(rows[-1][0])
                chunk = min(chunk * 2, 1024)
            chosen.reverse()
            bodies = self._fetch(tx, tenant, session_id, [seq for seq, _ in chosen], cache)
        return [StoredMessage(seq, bodies[seq], counts) for seq, counts in chosen]

    def _fetch(
        self,
        tx: Tx,
        tenant: str,
        session_id: str,
        seqs: Sequence[int],
        cache: MutableMapping[int, Message],
    ) -> dict[int, Message]:
        """Messages by seq: from ``cache``, the rest read (one range query) and cached."""
        out = {seq: cache[seq] for seq in seqs if seq in cache}
        missing = [seq for seq in seqs if seq not in out]
        if missing:
            rows = tx.execute(
                f"SELECT seq, message FROM ctxwarden_messages {_WHERE} AND seq >= ? AND seq <= ?",
                (tenant, session_id, min(missing), max(missing)),
            )
            wanted = set(missing)
            for row in rows:
                seq = int(row[0])
                if seq in wanted:
                    out[seq] = cache[seq] = decode_message(row[1], seq)
        return out

    def pinned(self, tenant: str, session_id: str) -> list[StoredMessage]:
        """Pinned messages and system prompts, in order (by the partial index)."""
        with self._read_one() as tx:
            rows = tx.execute(
                "SELECT seq, message, token_counts FROM ctxwarden_messages "
                f"{_WHERE} AND pinned = 1 ORDER BY seq",
                (tenant, session_id),
            )
        return [_message(r) for r in rows]

    def newest_users(self, tenant: str, session_id: str, n: int = 1) -> list[int]:
        """The seqs of the ``n`` newest user messages, oldest first (fewer when there are
        not): what every build reads. Walks the primary key back from the newest message
        and stops at the ``n``-th, so it costs the messages after it, which a build reads
        anyway."""
        with self._read_one() as tx:
            rows = tx.execute(
                f"SELECT seq FROM ctxwarden_messages {_WHERE} AND role = 'user' "
                "ORDER BY seq DESC LIMIT ?",
                (tenant, session_id, n),
            )
        return sorted(int(r[0]) for r in rows)

    def count(self, tenant: str, session_id: str) -> int:
        """Messages stored (the session's next sequence number; no scan)."""
        found = self.position(tenant, session_id)
        return found[0] if found is not None else 0

    def position(self, tenant: str, session_id: str) -> tuple[int, float] | None:
        """The session's next sequence number and when it was created (``None``: no such
        session), without reading the rest of its row (~10 KB of sticky state): what an
        append checks before it writes."""
        with self._read_one() as tx:
            rows = tx.execute(
                f"SELECT next_seq, created_at FROM ctxwarden_sessions {_WHERE}",
                (tenant, session_id),
            )
        return (int(rows[0][0]), float(rows[0][1])) if rows else None

    def range(
        self, tenant: str, session_id: str, seq_from: int, seq_to: int, tx: Tx | None = None
    ) -> list[StoredMessage]:
        """Messages with ``seq_from <= seq < seq_to``, in order (read in ``tx`` if given)."""
        with self._read_one() if tx is None else nullcontext(tx) as reading:
            rows = reading.execute(
                "SELECT seq, message, token_counts FROM ctxwarden_messages "
                f"{_WHERE} AND seq >= ? AND seq < ? ORDER BY seq",
                (tenant, session_id, seq_from, seq_to),
            )
        return [_message(r) for r in rows]

    def iter_messages(
        self, tenant: str, session_id: str, *, batch: int = 500
    ) -> Iterator[StoredMessage]:
        """Every message in order, read in batches of short transactions (for export)."""
        start = 0
        while True:
            rows = self.range(tenant, session_id, start, start + batch)
            yield from rows
            if not rows:
                return
            start = rows[-1].seq + 1

    # -- summarisation cycle --------------------------------------------------------------

    def read_for_summary(
        self, tenant: str, session_id: str, *, keep_recent: int = 0, max_messages: int = 1000
    ) -> SummaryInput:
        """Step 1: the session and the messages the summary does not cover yet, leaving
        the ``keep_recent`` newest out; one read transaction, closed on return."""
        with self._read() as tx:
            session = self._require(tx, tenant, session_id)
            stop = min(session.next_seq - keep_recent, session.summary_upto + 1 + max_messages)
            rows = tx.execute(
                "SELECT seq, message, token_counts FROM ctxwarden_messages "
                f"{_WHERE} AND seq > ? AND seq < ? ORDER BY seq",
                (tenant, session_id, session.summary_upto, stop),
            )
        return SummaryInput(session, tuple(_message(r) for r in rows))

    def write_summary(
        self,
        tenant: str,
        session_id: str,
        *,
        expected_version: int,
        summary: str | None,
        facts: Mapping[str, Any],
        covered_up_to_seq: int,
        levels: Mapping[str, Any] | None = None,
    ) -> StoredSession:
        """Step 3: store the new summary, its ``levels`` (the tiers it is made of) and the
        facts if nobody wrote one since ``expected_version`` was read; raise
        :class:`VersionConflict` otherwise."""
        facts_json = json_text(dict(facts))
        levels_json = json_text(dict(levels or {}))
        with self._write() as tx:
            rows = tx.execute(
                "UPDATE ctxwarden_sessions SET summary = ?, facts = ?, summary_levels = ?, "
                "summary_upto = ?, version = version + 1, updated_at = ? "
                f"{_WHERE} AND version = ? RETURNING {_SESSION_COLS}",
                (
                    storable_text(summary),
                    facts_json,
                    levels_json,
                    covered_up_to_seq,
                    time.time(),
                    tenant,
                    session_id,
                    expected_version,
                ),
            )
            if not rows:
                current = self._require(tx, tenant, session_id)
                raise VersionConflict(
                    f"session {session_id!r} is at version {current.version}, expected "
                    f"{expected_version}: another summary was written meanwhile; re-read and retry"
                )
        return _session(rows[0])

    def save_sticky(
        self,
        tenant: str,
        session_id: str,
        sticky: Mapping[str, Any],
        *,
        ledger: tuple[int, str] | None = None,
    ) -> None:
        """Keep the last build's decisions (last build wins; not versioned) and, in the
        same transaction, the entity-ledger checkpoint ``(upto, json)`` when given. The
        checkpoint only moves forward: one covering less than the stored one is ignored,
        so concurrent builds never take it back (an equal one replaces it: the same
        messages give the same ledger, and a damaged row gets repaired)."""
        with self._write() as tx:
            if self._advisory_write:  # a lost write only costs the next build its warm start
                tx.execute(self._advisory_write)
            self.save_sticky_in(tx, tenant, session_id, sticky, ledger=ledger)

    def save_sticky_in(
        self,
        tx: Tx,
        tenant: str,
        session_id: str,
        sticky: Mapping[str, Any],
        *,
        ledger: tuple[int, str] | None = None,
    ) -> None:
        """:meth:`save_sticky` inside an open write transaction ``tx`` (the build log's)."""
        tx.execute(
            f"UPDATE ctxwarden_sessions SET sticky = ? {_WHERE}",
            (json.dumps(dict(sticky)), tenant, session_id),
        )
        if ledger is not None:
            tx.execute(
                "INSERT INTO ctxwarden_ledgers (tenant, session_id, upto, ledger, updated_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, session_id) DO UPDATE SET "
                "upto = excluded.upto, ledger = excluded.ledger, updated_at = "
                "excluded.updated_at WHERE ctxwarden_ledgers.upto <= excluded.upto",
                (tenant, session_id, ledger[0], ledger[1], time.time()),
            )

    def load_ledger(self, tenant: str, session_id: str) -> tuple[int, str | None]:
        """The stored entity-ledger checkpoint: ``(upto, json)``, or ``(-1, None)``."""
        with self._read() as tx:
            rows = tx.execute(
                f"SELECT upto, ledger FROM ctxwarden_ledgers {_WHERE}", (tenant, session_id)
            )
        return (int(rows[0][0]), str(rows[0][1])) if rows else (-1, None)

    def unpinned_between(
        self,
        tenant: str,
        session_id: str,
        after_seq: int,
        before_seq: int,
        *,
        limit: int = 1000,
        cache: MutableMapping[int, Message] | None = None,
    ) -> list[tuple[int, Message]]:
        """The first ``limit`` messages with ``after_seq < seq < before_seq`` that are not
        pinned (nor system prompts), in order: one range read along the primary key;
        bodies already in ``cache`` are not decoded again."""
        cache = {} if cache is None else cache
        with self._read() as tx:
            rows = tx.execute(
                f"SELECT seq, message FROM ctxwarden_messages {_WHERE} AND seq > ? AND seq < ? "
                "AND pinned = 0 ORDER BY seq LIMIT ?",
                (tenant, session_id, after_seq, before_seq, limit),
            )
        out: list[tuple[int, Message]] = []
        for row in rows:
            seq = int(row[0])
            message = cache.get(seq)
            if message is None:
                message = decode_message(row[1], seq)
            out.append((seq, message))
        return out

    def record_usage(
        self, tenant: str, session_id: str, usage: Usage, *, model: str, dollars: float = 0.0
    ) -> StoredSession:
        """Add one call's usage (and its price) to the session's totals, atomically."""
        with self._write() as tx:
            return self.record_usage_in(tx, tenant, session_id, usage, model=model, dollars=dollars)

    @overload
    def record_usage_in(
        self,
        tx: Tx,
        tenant: str,
        session_id: str,
        usage: Usage,
        *,
        model: str,
        dollars: float = ...,
        read_back: Literal[True] = ...,
    ) -> StoredSession: ...

    @overload
    def record_usage_in(
        self,
        tx: Tx,
        tenant: str,
        session_id: str,
        usage: Usage,
        *,
        model: str,
        dollars: float = ...,
        read_back: Literal[False],
    ) -> None: ...

    def record_usage_in(
        self,
        tx: Tx,
        tenant: str,
        session_id: str,
        usage: Usage,
        *,
        model: str,
        dollars: float = 0.0,
        read_back: bool = True,
    ) -> StoredSession | None:
        """:meth:`record_usage` inside an open write transaction ``tx``; with
        ``read_back=False`` (the proxy closing a call) the row is not read back, nor its
        sticky state decoded, and nothing is returned."""
        lock = " FOR UPDATE" if self._select_for_update else ""
        rows = tx.execute(
            f"SELECT usage FROM ctxwarden_sessions {_WHERE}{lock}", (tenant, session_id)
        )
        if not rows:
            raise StoreError(f"no session {session_id!r} for tenant {tenant!r}; create it first")
        by_model, total = decode_usage(rows[0][0])
        by_model[model] = by_model[model] + usage if model in by_model else usage
        text = encode_usage(by_model, total + dollars)
        if not read_back:
            params = (text, tenant, session_id)
            tx.execute(f"UPDATE ctxwarden_sessions SET usage = ? {_WHERE}", params)
            return None
        rows = tx.execute(
            f"UPDATE ctxwarden_sessions SET usage = ? {_WHERE} RETURNING {_SESSION_COLS}",
            (text, tenant, session_id),
        )
        return _session(rows[0])

    _select_for_update = False


def sql_store(store: Any) -> SqlStore:
    """``store`` as one of the SQL backends; a clear error for any other store (the
    service's tables and the build log live in SQL)."""
    if not isinstance(store, SqlStore):
        raise ConfigError(
            f"the service needs a SQL store (sqlite:/// or postgresql://), got {store.url!r}"
        )
    return store
