"""What the build log knows of a session's full-history size (R15): the newest logged
build's mark, and the token counts stored with the messages after it.
:mod:`ctxwarden.session.build_log` adds them up, asked by
:func:`~ctxwarden.store.service_tables.record_build` in the transaction that logs the
next build."""

from __future__ import annotations

import json
from collections.abc import Callable

from ctxwarden.store.migrations import Tx

__all__ = ["HistoryTokens", "newest_build", "stored_tokens_in"]

HistoryTokens = Callable[[Tx, "tuple[int, int] | None"], int]
"""A build's full-history size from the newest logged build's ``(history_tokens,
upto_seq)``, computed in the transaction that logs it
(:func:`~ctxwarden.store.service_tables.record_build`)."""


def newest_build(tx: Tx, tenant: str, session_id: str) -> tuple[int, int, int] | None:
    """``(turn, history_tokens, upto_seq)`` of the session's newest logged build (``None``:
    none): its turn is the highest, and the next build adds only the tokens of what came
    after ``upto_seq`` to its full-history size."""
    rows = tx.execute(
        "SELECT turn, history_tokens, upto_seq FROM ctxwarden_builds "
        "WHERE tenant = ? AND session_id = ? ORDER BY turn DESC LIMIT 1",
        (tenant, session_id),
    )
    return (int(rows[0][0]), int(rows[0][1]), int(rows[0][2])) if rows else None


def stored_tokens_in(
    tx: Tx, tenant: str, session_id: str, after_seq: int, upto_seq: int, key: str
) -> tuple[int, list[int]]:
    """The stored token counts under ``key`` of the messages ``after_seq < seq <= upto_seq``
    summed, and the seqs that have none under that key (counted by the caller), read in
    ``tx`` from the counts column alone (no message is decoded)."""
    total, missing = 0, []
    rows = tx.execute(
        "SELECT seq, token_counts FROM ctxwarden_messages "
        "WHERE tenant = ? AND session_id = ? AND seq > ? AND seq <= ?",
        (tenant, session_id, after_seq, upto_seq),
    )
    for seq, counts in rows:
        value = json.loads(counts).get(key)
        if isinstance(value, int):
            total += value
        else:
            missing.append(int(seq))
    return total, missing
