"""A logged build's compact forms read back as what they stand for (R15).

:mod:`ctxwarden.session.build_log` writes a build's row compactly, and these read it back
for :mod:`~ctxwarden.store.service_tables`, so a reader sees what the row would hold
written out:

- the audit's actions, logged as rows of their values under the field names named once
  (``{"fields": [...], "rows": [[...], ...]}``), come back as one object each
  (:func:`audit_from_text`);
- a built message that is a stored message as stored, logged as its sequence number
  (``{"layer": ..., "seq": n}``), or a run of them as the first number and a count
  (``..., "count": k}``), comes back as the stored message (:func:`context_from_rows`);
- a context that begins as an earlier build's did, logged as a first row naming that
  build and how many of its messages (``{"base": build_id, "count": n}``), begins with
  those messages of the base's context, one row each (:func:`based_on`,
  :func:`one_row_each`: the reader joins them, since the base is another row).

Rows logged before any of these forms read as they always did.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ctxwarden.store._sql import sql_store
from ctxwarden.store.base import SessionStore

__all__ = ["audit_from_text", "based_on", "context_from_rows", "logged_context", "one_row_each"]


def audit_from_text(text: str) -> Any:
    """A logged audit, with its actions as objects (logged as rows, or as the objects)."""
    audit = json.loads(text)
    actions = audit.get("actions") if isinstance(audit, dict) else None
    if isinstance(actions, dict) and "rows" in actions:
        names = actions["fields"]
        audit["actions"] = [dict(zip(names, row, strict=True)) for row in actions["rows"]]
    return audit


def context_from_rows(
    found: list[dict[str, Any]], read: Callable[[int, int], Iterable[tuple[int, Any]]]
) -> list[dict[str, Any]]:
    """The logged context rows ``found`` with each stored message logged by number read
    back whole: ``read(lo, hi)`` gives ``(seq, message as its JSON object)`` for the stored
    messages with ``lo <= seq < hi``, one call per run of consecutive numbers. A number
    no longer stored is left as it is (a run's as one row each)."""
    logged = [_refs(row) for row in found]
    refs = sorted({seq for seqs in logged for seq in seqs})
    if not refs:
        return found
    whole: dict[int, Any] = {}
    for lo, hi in _runs(refs):
        whole.update(read(lo, hi + 1))
    out: list[dict[str, Any]] = []
    for row, seqs in zip(found, logged, strict=True):
        if isinstance(seqs, range):
            layer = row["layer"]
            out += ({"layer": layer, "message": whole[seq]} if seq in whole else
                    {"layer": layer, "seq": seq} for seq in seqs)  # fmt: skip
        elif seqs and seqs[0] in whole:
            out.append({"layer": row["layer"], "message": whole[seqs[0]]})
        else:
            out.append(row)
    return out


def _refs(row: Mapping[str, Any]) -> Sequence[Any]:
    """The sequence numbers a logged row stands for: none for a message logged whole,
    ``seq`` alone, or a run of ``count`` from ``seq`` on (a ``range``)."""
    if "message" in row or "seq" not in row:
        return ()
    seq, count = row["seq"], row.get("count")
    if type(seq) is int and type(count) is int and count > 0:
        return range(seq, seq + count)
    return (seq,)


def based_on(rows: Sequence[Any]) -> tuple[str, int] | None:
    """``(build id, n)`` when a logged context begins with the first ``n`` messages of
    that build's (its first row says so), else ``None``."""
    first = rows[0] if rows else None
    if isinstance(first, dict) and "base" in first and "layer" not in first:
        base, count = first["base"], first.get("count")
        if isinstance(base, str) and type(count) is int and count >= 0:
            return base, count
    return None


def one_row_each(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A logged context's rows with each run of stored messages split into one row per
    message (``{"layer": ..., "seq": n}``): one row per built message."""
    out: list[Mapping[str, Any]] = []
    for row in rows:
        seqs = _refs(row)
        if isinstance(seqs, range):
            layer = row["layer"]
            out += ({"layer": layer, "seq": seq} for seq in seqs)
        else:
            out.append(row)
    return out


def _runs(seqs: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted ``seqs`` as runs of consecutive numbers, ``(first, last)`` each."""
    runs: list[tuple[int, int]] = []
    for seq in seqs:
        if runs and seq == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], seq)
        else:
            runs.append((seq, seq))
    return runs


def logged_context(
    store: SessionStore, tenant: str, session_id: str, build_id: str
) -> list[dict[str, Any]] | None:
    """The built messages stored with a build (``None`` when it is too old to keep them),
    each ``{"layer": ..., "message": ...}``; one logged as the sequence number of the
    stored message it is, or in a run of them, or among the first messages of an earlier
    build's context (:mod:`ctxwarden.session.build_log`), is read back whole."""
    with sql_store(store)._read() as tx:

        def logged(of: str) -> Any:
            rows = tx.execute(
                "SELECT context FROM ctxwarden_build_contexts "
                "WHERE tenant = ? AND session_id = ? AND build_id = ?",
                (tenant, session_id, of),
            )
            return json.loads(rows[0][0]) if rows and rows[0][0] is not None else None

        found = logged(build_id)
        base = based_on(found) if found is not None else None
        if base is not None:
            first = logged(base[0])
            found = None if first is None else [*one_row_each(first)[: base[1]], *found[1:]]
    if found is None:
        return None
    from ctxwarden.formats.openai_json import meta_message_bytes

    def read(lo: int, hi: int) -> Iterable[tuple[int, Any]]:
        for m in store.range(tenant, session_id, lo, hi):
            yield m.seq, json.loads(meta_message_bytes(m.message))

    return context_from_rows(found, read)
