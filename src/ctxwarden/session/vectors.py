"""A session's embedding vectors: computed after a call, read by its builds.

With ``[recall] embeddings = "<spec>"`` in the policy, every stored message gets a
vector once (:mod:`ctxwarden.store.vectors`):

* :func:`embed_missing` (:meth:`ctxwarden.Session.embed`) computes the vectors the
  session's messages lack, oldest first, in batches — after a call, off the request path
  (``ctxwarden serve`` runs it in the background after each reply; a library user calls
  it as they call ``summarize_sync``);
* :func:`vectors_for_build` runs before a session's build: it makes sure the newest user
  message — the recall query — has a vector (one request when it is new; stored, so the
  next build and the next :func:`embed_missing` do not ask again) and reads the stored
  vectors of the messages the build read. A session's build reads only what can end up
  in its context (its window region), so the history the window left behind is not in
  it: among the user and assistant messages up to ``lookback`` before the slice, the
  :data:`CANDIDATES` most similar to the query are read too and given to the build
  before its window (as pinned messages are), where the recall step ranks them with the
  rest. The build gets the vectors as an explicit
  :class:`~ctxwarden.steps.recall_fusion.RecallVectors` and stays pure.

When the endpoint fails (down, refusing, no key) the build goes on without embedding
recall — BM25 alone — and its audit carries a warning naming the endpoint and the error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ctxwarden.core.errors import ConfigError, MissingDependencyError, ProviderError
from ctxwarden.llm.embeddings import Embedder, embeddings_key
from ctxwarden.steps.recall_fusion import RecallVectors, embedding_text
from ctxwarden.store._sql import SqlStore
from ctxwarden.store.base import StoredMessage
from ctxwarden.store.vectors import (
    messages_at,
    missing_vectors,
    read_vectors,
    text_vectors_between,
    write_vectors,
)

if TYPE_CHECKING:
    from ctxwarden.session.session import Session

__all__ = ["BATCH", "embed_missing", "vectors_for_build"]

BATCH = 256
"""Messages read (and embedded) per round of :func:`embed_missing`."""
CANDIDATES = 8
"""Messages before a session build's slice read for it by similarity to the query (the
recall block shows a handful of passages within its share of the budget)."""


def _sql(session: Session) -> SqlStore:
    store = session.store
    if not isinstance(store, SqlStore):
        raise ConfigError(
            f"embedding recall stores vectors with the messages: it needs an SQLite or "
            f"PostgreSQL store, not {type(store).__name__}"
        )
    return store


def embed_missing(
    session: Session, embedder: Embedder, *, upto_seq: int | None = None, batch: int = BATCH
) -> int:
    """Compute and store the vectors ``session`` 's messages (up to ``upto_seq``) lack
    for ``embedder`` 's spec; returns how many messages got one. A
    :class:`ProviderError` (after the SDK's retries) leaves the messages not yet
    written without one, for the next run."""
    store = _sql(session)
    key = embeddings_key(embedder.spec)
    scope = (key, session.record.created_at)
    after = session._embedded_upto.get(scope, -1)
    done = 0
    while True:
        rows = missing_vectors(
            store, session.tenant, session.session_id, key, after_seq=after, limit=batch
        )
        full = len(rows) == batch
        if upto_seq is not None:
            rows = [r for r in rows if r.seq <= upto_seq]
            full = full and len(rows) == batch
        if not rows:
            break
        texts = [(r.seq, embedding_text(r.message)) for r in rows]
        wanted = [(seq, text) for seq, text in texts if text]
        vectors = embedder.embed([text for _, text in wanted]) if wanted else []
        made = dict(zip((seq for seq, _ in wanted), vectors, strict=True))
        write_vectors(
            store,
            session.tenant,
            session.session_id,
            [(seq, made.get(seq, ())) for seq, _ in texts],
            key,
        )
        done += len(made)
        after = rows[-1].seq
        session._embedded_upto[scope] = after
        if not full:
            break
    return done


def _newest_user(read: Sequence[StoredMessage]) -> StoredMessage | None:
    for stored in reversed(read):
        if stored.message.role == "user":
            return stored
    return None


def _candidates(
    store: SqlStore,
    session: Session,
    key: str,
    query: Sequence[float],
    read: Sequence[StoredMessage],
    start: int,
    lookback: int,
) -> tuple[list[StoredMessage], dict[int, tuple[float, ...]]]:
    """The :data:`CANDIDATES` user and assistant text messages before the slice's tail
    (``start``; at most ``lookback`` before it) that the slice does not hold (pinned and
    first messages it does) most similar to ``query``, and their vectors."""
    try:
        import numpy as np
    except ImportError:  # the recall extra brings numpy (with bm25s)
        raise MissingDependencyError("embedding recall (numpy)", "recall") from None

    have = {m.seq for m in read}
    lo = max(0, start - lookback)
    before = text_vectors_between(store, session.tenant, session.session_id, lo, start, key)
    found = [(seq, v) for seq, v in before if seq not in have and len(v) == len(query)]
    if not found:
        return [], {}
    matrix = np.asarray([v for _, v in found], dtype=np.float64)
    q = np.asarray(query, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1) * (np.linalg.norm(q) or 1.0)
    scores = (matrix @ q) / np.where(norms == 0.0, 1.0, norms)
    order = sorted(range(len(found)), key=lambda i: (-round(float(scores[i]), 9), found[i][0]))
    best = [found[i][0] for i in order if scores[i] > 0.0][: CANDIDATES * 2]
    messages = [
        m
        for m in messages_at(store, session.tenant, session.session_id, best)
        if not m.message.tool_calls  # a call without its results would be refused
    ]
    rank = {seq: i for i, seq in enumerate(best)}
    chosen = sorted(messages, key=lambda m: rank[m.seq])[:CANDIDATES]
    vectors = dict(found)
    return sorted(chosen, key=lambda m: m.seq), {m.seq: vectors[m.seq] for m in chosen}


def vectors_for_build(
    session: Session, spec: str, read: Sequence[StoredMessage], start: int, lookback: int
) -> tuple[RecallVectors | None, list[StoredMessage], tuple[str, ...]]:
    """The vectors for a build over ``read`` (its tail from ``start``), the query's
    computed when missing, and the messages before the slice to read with it (see the
    module docstring); ``(None, [], (warning,))`` when the endpoint or the store fails."""
    query = _newest_user(read)
    if query is None or not embedding_text(query.message):
        return None, [], ()
    key = embeddings_key(spec)
    try:
        store = _sql(session)
        stored = read_vectors(store, session.tenant, session.session_id, [m.seq for m in read], key)
        if not stored.get(query.seq):
            embedder = session.embedder(spec)
            vector = embedder.embed([embedding_text(query.message)])[0]
            write_vectors(store, session.tenant, session.session_id, [(query.seq, vector)], key)
            stored[query.seq] = vector
        extra, theirs = _candidates(store, session, key, stored[query.seq], read, start, lookback)
    except (ProviderError, ConfigError) as exc:
        return None, [], (f"embedding recall skipped, recall ranked by BM25 alone: {exc}",)
    stored.update(theirs)
    by_id = {m.message.id: stored[m.seq] for m in (*read, *extra) if stored.get(m.seq)}
    return RecallVectors(key, by_id), extra, ()
