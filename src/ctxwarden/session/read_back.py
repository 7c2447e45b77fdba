"""The messages before a chat session's slice that the relevance recall reads, read once
(speed only).

A chat-shaped session's build reads the ``lookback`` messages before its slice
(:func:`~ctxwarden.steps.recall_gate.recall_reads_back`), so that its recall sees the
sources ``build_context`` sees over the whole history. From one build to the next that
range moves by the messages of a turn: :class:`ReadBack` keeps the rows it read and reads
only the ends that are new. Stored messages never change, and a session deleted and
created again has a new ``created_at``, which starts the memo afresh. It belongs to one
:class:`~ctxwarden.Session`, which is not shared between threads.
"""

from __future__ import annotations

from ctxwarden.store import SessionStore, StoredMessage

__all__ = ["ReadBack"]


class ReadBack:
    """The stored messages ``lo <= seq < end`` of one session, from the store once."""

    def __init__(self) -> None:
        self._scope: tuple[str, str, float] | None = None
        self._rows: dict[int, StoredMessage] = {}
        self._lo = self._end = 0  # the rows held: lo <= seq < end, contiguous

    def rows(
        self,
        store: SessionStore,
        tenant: str,
        session_id: str,
        created_at: float,
        lo: int,
        end: int,
    ) -> list[StoredMessage]:
        """The messages with ``lo <= seq < end``, in order: what this memo holds of them
        and, read from ``store``, the rest (at most the two ends of the range)."""
        scope = (tenant, session_id, created_at)
        held = self._rows if scope == self._scope else {}
        if not held or lo >= self._end or end <= self._lo:  # nothing in common
            held, self._lo, self._end = {}, lo, lo
        if lo < self._lo:
            held.update((m.seq, m) for m in store.range(tenant, session_id, lo, self._lo))
        if end > self._end:
            held.update((m.seq, m) for m in store.range(tenant, session_id, self._end, end))
        self._scope, self._lo, self._end = scope, lo, max(end, self._end)
        self._rows = {seq: m for seq, m in held.items() if seq >= lo}
        return [self._rows[seq] for seq in range(lo, end) if seq in self._rows]
