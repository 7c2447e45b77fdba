"""The entity ledger of the messages a session build no longer reads: a checkpoint (R13).

:meth:`~ctxwarden.session.session.Session.build` reads a slice (pinned messages and the newest
tail) while the engine's ledger must keep the ids, dates and amounts of the messages
that left the context. Re-reading the history each build would make the build
O(history), so the session keeps ``(since, upto, ledger)``: every message with
``since <= seq <= upto`` that is neither pinned nor in the slice of the build that
passed it has been added to ``ledger`` exactly once, in order, one ``add`` per message
as the engine does. Each build adds only the messages that left its slice since the
last one (a range read bounded by how far the window moved). Messages folded into the
summary still feed it: a summary may drop an id, the ledger keeps it.

A session built turn by turn has ``since == 0``: its ledger is the one
:func:`ctxwarden.build_context` computes over the full list. A session filled without
builds (an import, a bulk fill, data stored before the ledger was) would make its first
build read the whole history, so when the checkpoint is more than ``LEDGER_BACKFILL``
messages behind the slice it is *seeded* instead: only the last ``LEDGER_BACKFILL``
messages before the slice are read, ``since`` moves to the first of them, and the
values of the older ones are never added (values already in the ledger stay). Such a
session's ledger holds the values of those last messages before the window plus
everything that leaves the window from then on; the build's audit says what was
skipped. The newest values are the ones a seeded ledger keeps because they are the
ones the agent is working with.

The store keeps the checkpoint that covers most (saves never move it back). A recent
checkpoint is also kept in memory per process, so a build neither reads nor decodes the
stored one while it is current.

**Several replicas** (issue 14) each keep their own copy, which another replica's builds
leave behind, never wrong: a checkpoint is a fold of stored messages, which never
change, keyed by the session's ``created_at`` (a session deleted and created again is
another key), and :meth:`EntityLedger.add` does not depend on how its entities are
split into calls. So advancing this process's older copy, or the stored one, to the
current slice gives the ledger the replica that made the last build would have had;
``tests/test_replicas.py`` checks 300 alternating turns byte for byte against one
replica. Nothing needs the stored version to validate the copy, and reading it to check
would cost every build a query; only a copy that lags the build by more than a few
turns is compared with the stored one (``needed_upto`` in :func:`load_checkpoint`), so
a replica that did not serve a session for a while neither re-reads nor seeds past
what the others saved.
"""

from __future__ import annotations

import json
from collections.abc import Container, MutableMapping
from dataclasses import dataclass, field, replace

from ctxwarden.core.caching import BoundedCache
from ctxwarden.core.errors import StoreError
from ctxwarden.core.messages import Message
from ctxwarden.memory.entities import extract_entities
from ctxwarden.memory.entity_ledger import EntityLedger
from ctxwarden.store.base import SessionStore

__all__ = [
    "LEDGER_BACKFILL",
    "LedgerCheckpoint",
    "current_checkpoint",
    "ledger_warnings",
    "load_checkpoint",
    "remember_checkpoint",
]

LEDGER_BACKFILL = 1000
"""How many messages before the slice a checkpoint that lags further behind is seeded
from (see the module docstring). A count of messages, not of tokens: the cost of a
seed is one ``extract_entities`` and one ``add`` per message (about 0.2 ms each, so
about 0.2 s once, whatever the history's length), and "behind by a normal amount" is a
number of turns: a turn-by-turn session never appends a thousand messages between two
builds, while a single 50,000-token tool result must not cut its ledger. Nor does it
grow with the budget: the ledger layer is capped by ``ledger.max_tokens`` whatever the
budget, and a thousand messages hold far more values than that cap can show."""

READ_CHUNK = 1000
"""Messages per range read when a checkpoint catches up: short transactions, bounded
memory."""

_MEMORY: BoundedCache[tuple[str, str, str, float], LedgerCheckpoint] = BoundedCache(
    "ledger_checkpoint.recent",
    16,  # sessions; a full ledger is about a megabyte of objects
)


@dataclass(frozen=True)
class LedgerCheckpoint:
    """``ledger`` holds the values of the messages from ``since`` to ``upto`` (and what
    it held before a seed; see the module docstring); ``saved`` is the ``upto`` known
    to be in the store (-1: none)."""

    upto: int = -1
    ledger: EntityLedger = field(default_factory=EntityLedger)
    saved: int = -1
    since: int = 0

    def advance(
        self,
        store: SessionStore,
        tenant: str,
        session_id: str,
        before_seq: int,
        skip: Container[int],
        cache: MutableMapping[int, Message] | None = None,
        *,
        backfill: int = LEDGER_BACKFILL,
    ) -> LedgerCheckpoint:
        """The checkpoint covering the messages before ``before_seq``: the unpinned
        messages after ``upto`` are read in order (pinned ones and those in ``skip``,
        the slice the build reads, are in the context, not in the ledger). When more
        than ``backfill`` messages lie between, only the last ``backfill`` are read and
        ``since`` moves to the first of them."""
        if backfill < 0:
            raise ValueError(f"backfill must be >= 0 messages, got {backfill}")
        upto, ledger, since = self.upto, self.ledger, self.since
        if before_seq - 1 - upto > backfill:
            upto = before_seq - 1 - backfill
            since = upto + 1
        while upto < before_seq - 1:
            rows = store.unpinned_between(
                tenant, session_id, upto, before_seq, limit=READ_CHUNK, cache=cache
            )
            # one add per chunk, as the build adds a range: the ledger's ranking (values the
            # user stated, repeated ones) is then the same as build_context's
            ledger = ledger.add(
                [e for seq, message in rows if seq not in skip for e in extract_entities(message)]
            )
            upto = rows[-1][0] if len(rows) == READ_CHUNK else before_seq - 1
        if upto == self.upto:
            return self
        return replace(self, upto=upto, ledger=ledger, since=since)

    def encode(self) -> tuple[int, str]:
        """``(upto, json)`` as :meth:`SessionStore.save_sticky` stores it: the ledger's
        dict with ``since`` added (a checkpoint stored without it covers from 0)."""
        data = {**self.ledger.to_dict(), "since": self.since}
        return self.upto, json.dumps(data, ensure_ascii=False)

    @classmethod
    def decode(cls, upto: int, text: str | None) -> LedgerCheckpoint:
        """The stored checkpoint; ``(-1, None)`` (none stored) is the empty one."""
        if text is None or upto < 0:
            return cls()
        try:
            data = json.loads(text)
            ledger = EntityLedger.from_dict(data)
            since = int(data.get("since", 0))
            if not 0 <= since <= upto + 1:
                raise ValueError(f"since {since} is outside 0..{upto + 1}")
        except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError too
            raise StoreError(f"stored entity ledger cannot be read back: {exc}") from exc
        return cls(upto, ledger, upto, since)


def _key(
    store: SessionStore, tenant: str, session_id: str, created_at: float
) -> tuple[str, str, str, float]:
    url = store.url if not store.url.endswith(":memory:") else f"{store.url}#{id(store)}"
    return url, tenant, session_id, created_at


def load_checkpoint(
    store: SessionStore,
    tenant: str,
    session_id: str,
    created_at: float,
    *,
    needed_upto: int | None = None,
    slack: int = 64,
) -> tuple[LedgerCheckpoint, str | None]:
    """This process's checkpoint for the session, else the stored one; and, when the
    stored one cannot be read back, why (the checkpoint is then the empty one).

    ``created_at`` tells a session apart from an earlier one with the same id. A damaged
    ledger is derived data: the build rebuilds it from the stored messages (a seed, when
    the history is long), the next save replaces it, and the build's audit says so.
    ``needed_upto`` is the seq the build must cover: when this process's copy lags it by
    more than ``slack`` messages (other replicas built the session meanwhile), the
    stored checkpoint is read too and the one covering more is used, so a copy left
    behind never makes a build re-read, or seed past, what another replica saved.
    """
    key = _key(store, tenant, session_id, created_at)
    hit = _MEMORY.get(key)
    if hit is not None and (needed_upto is None or needed_upto - hit.upto <= slack):
        return hit, None
    upto, text = store.load_ledger(tenant, session_id)
    if hit is not None and hit.upto >= upto:
        return hit, None
    try:
        return LedgerCheckpoint.decode(upto, text), None
    except StoreError as exc:
        if hit is not None:
            return hit, None
        return LedgerCheckpoint(), str(exc)


def current_checkpoint(
    store: SessionStore, tenant: str, session_id: str, created_at: float
) -> LedgerCheckpoint:
    """:func:`load_checkpoint` without the reason (a damaged one reads as empty)."""
    return load_checkpoint(store, tenant, session_id, created_at)[0]


def ledger_warnings(
    before: LedgerCheckpoint, after: LedgerCheckpoint, damage: str | None = None
) -> tuple[str, ...]:
    """What a build's audit should say about advancing ``before`` to ``after``: a
    stored ledger that was damaged and rebuilt, and messages a seed skipped."""
    out: list[str] = []
    if damage is not None:
        out.append(
            f"{damage}; it was rebuilt from the stored messages and is replaced on this save"
        )
    if after.since > before.since and after.since > before.upto + 1:
        out.append(
            f"entity ledger seeded from the {after.upto - after.since + 1:,} messages before "
            f"the window (seq {after.since}-{after.upto}): the older ones (seq "
            f"{before.upto + 1}-{after.since - 1}) were stored without a build reading them "
            "(an import or a bulk fill) and their values are not in the ledger"
        )
    return tuple(out)


def remember_checkpoint(
    store: SessionStore, tenant: str, session_id: str, created_at: float, ckpt: LedgerCheckpoint
) -> None:
    """Keep ``ckpt`` for this process's next build of the session (the newest wins)."""
    key = _key(store, tenant, session_id, created_at)
    _MEMORY.put_unless(key, ckpt, keep=lambda known: known.upto > ckpt.upto)
