"""A session's embedding vectors: computed after a call, read by its builds.

With ``[recall] embeddings = "<spec>"`` in the policy, every stored message gets a
vector once (:mod:`ctxwarden.store.vectors`):

* :func:`embed_missing` (:meth:`ctxwarden.Session.embed`) computes the vectors the
  session's messages lack, oldest first, in batches — after a call, off the request path
  (``ctxwarden serve`` runs it in the background after each reply; a library user calls
  it as they call ``summarize_sync``);
* :func:`vectors_for_build` runs before a session's build: it reads the stored vectors of
  the messages the build read and makes sure the newest user message — the recall query —
  has one (one request when it is new; stored, so the next build and the next
  :func:`embed_missing` do not ask again). The build gets them as an explicit
  :class:`~ctxwarden.steps.recall_fusion.RecallVectors` and stays pure.

When the endpoint fails (down, refusing, no key) the build goes on without embedding
recall — BM25 alone — and its audit carries a warning naming the endpoint and the error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ctxwarden.errors import ConfigError, ProviderError
from ctxwarden.llm.embeddings import Embedder, embeddings_key
from ctxwarden.steps.recall_fusion import RecallVectors, embedding_text
from ctxwarden.store._sql import SqlStore
from ctxwarden.store.base import StoredMessage
from ctxwarden.store.vectors import missing_vectors, read_vectors, write_vectors

if TYPE_CHECKING:
    from ctxwarden.session.session import Session

__all__ = ["BATCH", "embed_missing", "vectors_for_build"]

BATCH = 256
"""Messages read (and embedded) per round of :func:`embed_missing`."""


def _sql(session: Session) -> SqlStore:
    store = session.store
    if not isinstance(store, SqlStore):
        raise ConfigError(
            f"embedding recall stores vectors with the messages: it needs an SQLite or "
            f"PostgreSQL store, not {type(store).__name__}"
        )
    return store


def embed_missing(session: Session, embedder: Embedder, *, batch: int = BATCH) -> int:
    """Compute and store the vectors ``session`` 's messages lack for ``embedder`` 's
    spec; returns how many messages got one. A :class:`ProviderError` (after the SDK's
    retries) leaves the messages not yet written without one, for the next run."""
    store = _sql(session)
    key = embeddings_key(embedder.spec)
    scope = (key, session.record.created_at)
    after = session._embedded_upto.get(scope, -1)
    done = 0
    while True:
        rows = missing_vectors(
            store, session.tenant, session.session_id, key, after_seq=after, limit=batch
        )
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
        if len(rows) < batch:
            break
    return done


def _newest_user(read: Sequence[StoredMessage]) -> StoredMessage | None:
    for stored in reversed(read):
        if stored.message.role == "user":
            return stored
    return None


def vectors_for_build(
    session: Session, spec: str, read: Sequence[StoredMessage]
) -> tuple[RecallVectors | None, tuple[str, ...]]:
    """The vectors of the messages a build read, the query's computed when missing;
    ``(None, (warning,))`` when that fails (see the module docstring)."""
    query = _newest_user(read)
    if query is None or not embedding_text(query.message):
        return None, ()
    key = embeddings_key(spec)
    try:
        store = _sql(session)
        stored = read_vectors(
            store, session.tenant, session.session_id, [m.seq for m in read], key
        )
        if not stored.get(query.seq):
            embedder = session.embedder(spec)
            vector = embedder.embed([embedding_text(query.message)])[0]
            write_vectors(store, session.tenant, session.session_id, [(query.seq, vector)], key)
            stored[query.seq] = vector
    except (ProviderError, ConfigError) as exc:
        return None, (f"embedding recall skipped, recall ranked by BM25 alone: {exc}",)
    by_id = {m.message.id: stored[m.seq] for m in read if stored.get(m.seq)}
    return RecallVectors(key, by_id), ()
