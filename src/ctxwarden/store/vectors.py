"""Embedding vectors stored with the messages (migration ``013_message_embeddings``).

A message's vector is written once, beside the message, with the embeddings spec that
made it (``embedding_model``), and never computed again while the spec stays the same: a
vector of another spec counts as missing. SQLite keeps it as a BLOB of little-endian
float32; PostgreSQL as pgvector's ``vector`` where the extension could be created, else
a ``REAL[]`` (read as ``REAL[]`` either way). A message with nothing to embed (no text,
no calls) gets the spec and no vector (``NULL``), so it is not asked for again.

These functions take an :class:`~ctxwarden.store._sql.SqlStore`; each is one short
transaction. :meth:`ctxwarden.Session.embed` and a session's build use them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from ctxwarden.store._sql import _WHERE, SqlStore, _message
from ctxwarden.store.base import StoredMessage

__all__ = [
    "decode_vector",
    "encode_vector",
    "messages_at",
    "missing_vectors",
    "read_vectors",
    "text_vectors_between",
    "write_vectors",
]


def _sqlite(store: SqlStore) -> bool:
    return store.url.startswith("sqlite")


def encode_vector(store: SqlStore, vector: Sequence[float]) -> object:
    """The value a backend stores: float32 bytes (SQLite), a float list (PostgreSQL)."""
    if _sqlite(store):
        return struct.pack(f"<{len(vector)}f", *vector)
    return [float(x) for x in vector]


def decode_vector(value: object) -> tuple[float, ...]:
    """A stored vector back as floats (``()``: the message had nothing to embed)."""
    if value is None:
        return ()
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        return struct.unpack(f"<{len(raw) // 4}f", raw)
    return tuple(float(x) for x in value)  # type: ignore[attr-defined]


def _column(store: SqlStore) -> str:
    return "embedding" if _sqlite(store) else "CAST(embedding AS REAL[])"


def read_vectors(
    store: SqlStore, tenant: str, session_id: str, seqs: Iterable[int], model: str
) -> dict[int, tuple[float, ...]]:
    """The stored vectors of ``seqs`` made by ``model`` (one read over their span)."""
    wanted = set(seqs)
    if not wanted:
        return {}
    with store._read_one() as tx:
        rows = tx.execute(
            f"SELECT seq, {_column(store)} FROM ctxwarden_messages {_WHERE} "
            "AND seq >= ? AND seq <= ? AND embedding_model = ?",
            (tenant, session_id, min(wanted), max(wanted), model),
        )
    return {int(r[0]): decode_vector(r[1]) for r in rows if int(r[0]) in wanted}


def missing_vectors(
    store: SqlStore, tenant: str, session_id: str, model: str, *, after_seq: int = -1,
    limit: int = 256,
) -> list[StoredMessage]:  # fmt: skip
    """Up to ``limit`` messages after ``after_seq`` without a vector of ``model``,
    oldest first (system messages are never recalled, so never embedded)."""
    with store._read_one() as tx:
        rows = tx.execute(
            "SELECT seq, message, token_counts FROM ctxwarden_messages "
            f"{_WHERE} AND seq > ? AND role <> 'system' "
            "AND (embedding_model IS NULL OR embedding_model <> ?) "
            "ORDER BY seq LIMIT ?",
            (tenant, session_id, after_seq, model, limit),
        )
    return [_message(r) for r in rows]


def write_vectors(
    store: SqlStore,
    tenant: str,
    session_id: str,
    vectors: Sequence[tuple[int, Sequence[float]]],
    model: str,
) -> int:
    """Store ``(seq, vector)`` pairs made by ``model`` where the message has none of that
    model yet (another writer may have stored it meanwhile: its vector stays); returns
    how many were written."""
    if not vectors:
        return 0
    rows = [
        (encode_vector(store, v) if v else None, model, tenant, session_id, seq, model)
        for seq, v in vectors
    ]
    with store._write() as tx:
        tx.executemany(
            f"UPDATE ctxwarden_messages SET embedding = ?, embedding_model = ? {_WHERE} "
            "AND seq = ? AND (embedding_model IS NULL OR embedding_model <> ?)",
            rows,
        )
    return len(rows)


def text_vectors_between(
    store: SqlStore, tenant: str, session_id: str, lo: int, hi: int, model: str
) -> list[tuple[int, tuple[float, ...]]]:
    """``(seq, vector)`` of the user and assistant messages with ``lo <= seq < hi`` that
    have a vector of ``model`` (a session's build looks among them for what to recall)."""
    with store._read_one() as tx:
        rows = tx.execute(
            f"SELECT seq, {_column(store)} FROM ctxwarden_messages {_WHERE} "
            "AND seq >= ? AND seq < ? AND embedding_model = ? AND embedding IS NOT NULL "
            "AND role IN ('user', 'assistant') ORDER BY seq",
            (tenant, session_id, lo, hi, model),
        )
    return [(int(r[0]), decode_vector(r[1])) for r in rows]


def messages_at(
    store: SqlStore, tenant: str, session_id: str, seqs: Iterable[int]
) -> list[StoredMessage]:
    """The messages with these seqs, in order (one read)."""
    wanted = sorted(set(seqs))
    if not wanted:
        return []
    marks = ", ".join("?" * len(wanted))
    with store._read_one() as tx:
        rows = tx.execute(
            "SELECT seq, message, token_counts FROM ctxwarden_messages "
            f"{_WHERE} AND seq IN ({marks}) ORDER BY seq",
            (tenant, session_id, *wanted),
        )
    return [_message(r) for r in rows]
