"""The entity ledger of the messages a session build no longer reads: a checkpoint (R13).

:meth:`~ctxwarden.session.Session.build` reads a slice (pinned messages and the newest
tail) while the engine's ledger must keep the ids, dates and amounts of *every* message
that left the context. Re-reading the history each build would make the build
O(history), so the session keeps ``(upto, ledger)``: every message with ``seq <= upto``
that is neither pinned nor in the slice of the build that passed it has been added to
``ledger`` exactly once, in order, one ``add`` per message as the engine does. It is
then the ledger :func:`ctxwarden.build_context` computes over the full list, and each
build adds only the messages that left its slice since the last one (a range read
bounded by how far the window moved). Messages folded into the summary still feed it:
a summary may drop an id, the ledger keeps it.

The ledger for a given ``upto`` depends only on the stored messages, so any process may
advance any checkpoint; the store keeps the one that covers most (saves never move it
back). A recent checkpoint is also kept in memory per process, so a build neither reads
nor decodes the stored one while it is current.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Container, MutableMapping
from dataclasses import dataclass, field, replace

from ..entities import EntityLedger, extract_entities
from ..errors import StoreError
from ..messages import Message
from .base import SessionStore

__all__ = ["LedgerCheckpoint", "current_checkpoint", "remember_checkpoint"]

READ_CHUNK = 1000
"""Messages per range read when a checkpoint catches up (a session built for the first
time, or one stored before the ledger was): short transactions, bounded memory."""

_MEMORY: OrderedDict[tuple[str, str, str, float], LedgerCheckpoint] = OrderedDict()
_MEMORY_MAX = 16  # sessions; a full ledger is about a megabyte of Python objects
_LOCK = threading.Lock()  # sessions in several threads share the memory


@dataclass(frozen=True)
class LedgerCheckpoint:
    """``ledger`` holds the values of the messages up to ``upto`` (see the module
    docstring); ``saved`` is the ``upto`` known to be in the store (-1: none)."""

    upto: int = -1
    ledger: EntityLedger = field(default_factory=EntityLedger)
    saved: int = -1

    def advance(
        self,
        store: SessionStore,
        tenant: str,
        session_id: str,
        before_seq: int,
        skip: Container[int],
        cache: MutableMapping[int, Message] | None = None,
    ) -> LedgerCheckpoint:
        """The checkpoint covering every message before ``before_seq``: the unpinned
        messages after ``upto`` are read in order (pinned ones and those in ``skip``,
        the slice the build reads, are in the context, not in the ledger)."""
        upto, ledger = self.upto, self.ledger
        while upto < before_seq - 1:
            rows = store.unpinned_between(
                tenant, session_id, upto, before_seq, limit=READ_CHUNK, cache=cache
            )
            for seq, message in rows:
                if seq not in skip:
                    ledger = ledger.add(extract_entities(message))
            upto = rows[-1][0] if len(rows) == READ_CHUNK else before_seq - 1
        return self if upto == self.upto else replace(self, upto=upto, ledger=ledger)

    def encode(self) -> tuple[int, str]:
        """``(upto, json)`` as :meth:`SessionStore.save_sticky` stores it."""
        return self.upto, json.dumps(self.ledger.to_dict(), ensure_ascii=False)

    @classmethod
    def decode(cls, upto: int, text: str | None) -> LedgerCheckpoint:
        """The stored checkpoint; ``(-1, None)`` (none stored) is the empty one."""
        if text is None or upto < 0:
            return cls()
        try:
            ledger = EntityLedger.from_dict(json.loads(text))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError too
            raise StoreError(f"stored entity ledger cannot be read back: {exc}") from exc
        return cls(upto, ledger, upto)


def _key(
    store: SessionStore, tenant: str, session_id: str, created_at: float
) -> tuple[str, str, str, float]:
    url = store.url if not store.url.endswith(":memory:") else f"{store.url}#{id(store)}"
    return url, tenant, session_id, created_at


def current_checkpoint(
    store: SessionStore, tenant: str, session_id: str, created_at: float
) -> LedgerCheckpoint:
    """This process's checkpoint for the session, else the stored one.

    ``created_at`` tells a session apart from an earlier one with the same id. A stored
    ledger that cannot be read back is derived data: it is rebuilt (from nothing, once)
    and the next save replaces it.
    """
    key = _key(store, tenant, session_id, created_at)
    with _LOCK:
        hit = _MEMORY.get(key)
        if hit is not None:
            _MEMORY.move_to_end(key)
            return hit
    upto, text = store.load_ledger(tenant, session_id)
    try:
        return LedgerCheckpoint.decode(upto, text)
    except StoreError:
        return LedgerCheckpoint()


def remember_checkpoint(
    store: SessionStore, tenant: str, session_id: str, created_at: float, ckpt: LedgerCheckpoint
) -> None:
    """Keep ``ckpt`` for this process's next build of the session (the newest wins)."""
    key = _key(store, tenant, session_id, created_at)
    with _LOCK:
        known = _MEMORY.get(key)
        if known is None or known.upto <= ckpt.upto:
            _MEMORY[key] = ckpt
        _MEMORY.move_to_end(key)
        while len(_MEMORY) > _MEMORY_MAX:
            _MEMORY.popitem(last=False)
