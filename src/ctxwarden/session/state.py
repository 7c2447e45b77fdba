"""A session's stored rows turned into the engine's inputs, and its outputs back (R13).

The engine counts positions in the list it is given and keeps the summary as a
:class:`~ctxwarden.memory.summaries.SummaryState`; a session stores sequence numbers and
JSON. These pure translations sit apart from :class:`~ctxwarden.session.session.Session` so
the session module keeps to the store and the cycle. :func:`summary_shown` is the
summary layer a session build shows: the same view of the summary that
``build_context(..., summarizer=...)`` shows (see :mod:`ctxwarden.steps.layers`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ctxwarden.messages import Message

if TYPE_CHECKING:
    from ctxwarden.build.audit import BuildState
    from ctxwarden.memory.summaries import SummaryState
    from ctxwarden.store import StoredSession

__all__ = ["levels_of", "state_for", "sticky_from", "summary_shown", "summary_state"]


def levels_of(state: SummaryState) -> dict[str, Any]:
    """The stored form of the summary's tiers (``covered_ids`` are not kept: the store
    knows coverage by sequence number)."""
    return {
        "summaries": list(state.summaries),
        "meta_summary": state.meta_summary,
        "covered_count": state.covered_count,
        "as_of_id": state.as_of_id,
        "cycles": state.cycles,
    }


def summary_state(record: StoredSession) -> SummaryState:
    """The summary's tiers as stored; a summary written without them (before migration
    003, or by ``write_summary`` alone) is one level-one summary."""
    from ctxwarden.memory.summaries import SummaryState

    levels = record.summary_levels
    if not levels:
        summaries = (record.summary,) if record.summary else ()
        return SummaryState(summaries=summaries, version=record.version, cycles=record.version)
    return SummaryState(
        summaries=tuple(str(t) for t in levels.get("summaries", ())),
        meta_summary=levels.get("meta_summary"),
        covered_count=int(levels.get("covered_count", 0)),
        as_of_id=levels.get("as_of_id"),
        version=record.version,
        cycles=int(levels.get("cycles", 0)),
    )


def sticky_from(state: BuildState, seqs: Sequence[int]) -> dict[str, Any]:
    """The engine state with its positions turned into sequence numbers."""
    data = state.to_dict()
    if state.history_length:
        data["last_seq"] = seqs[state.history_length - 1]
        data["window_start_seq"] = seqs[min(state.window_start, len(seqs) - 1)]
    return data


def state_for(sticky: Mapping[str, Any], seqs: Sequence[int]) -> BuildState | None:
    """The stored state with its sequence numbers turned into positions of ``seqs``;
    ``None`` (a cold build) when the last build's newest message is not in this slice."""
    from ctxwarden.build.audit import BuildState

    last_seq = sticky.get("last_seq")
    if last_seq is None:
        return None
    at = bisect.bisect_left(seqs, last_seq)
    if at == len(seqs) or seqs[at] != last_seq:
        return None
    state = BuildState.from_dict(sticky)
    start = bisect.bisect_left(seqs, int(sticky.get("window_start_seq", 0)))
    return replace(state, history_length=at + 1, window_start=min(start, at))


def summary_shown(
    summary: str | None,
    summarizer: object,
    history: Sequence[Message],
    *,
    budget: int,
    share: float | None,
    count: Callable[[Message], int],
) -> tuple[str | None, tuple[str, ...]]:
    """``(text, warnings)``: the stored ``summary`` as a build shows it
    (:func:`~ctxwarden.steps.layers.summary_in_share`, as ``build_context`` does)."""
    from ctxwarden.steps.layers import summary_in_share

    if not summary:
        return summary, ()
    view, left_out = summary_in_share(
        summarizer, summary, history, budget=budget, share=share, count=count
    )
    return view or None, left_out
