"""A session's stored rows turned into the engine's inputs, and its outputs back (R13).

The engine counts positions in the list it is given and keeps the summary as a
:class:`~ctxwarden.memory.summaries.SummaryState`; a session stores sequence numbers and
JSON. These pure translations sit apart from :class:`~ctxwarden.session.session.Session` so
the session module keeps to the store and the cycle. :func:`layers_for` gives the
stored summary and facts to the build as the same layer state ``build_context`` carries,
so both show the same layers (see :mod:`ctxwarden.steps.layers`).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from ctxwarden.core.caching import memoize
from ctxwarden.core.messages import Message

if TYPE_CHECKING:
    from ctxwarden.memory.summaries import SummaryState
    from ctxwarden.steps.state import BuildState
    from ctxwarden.store import StoredSession

__all__ = [
    "SavedState",
    "layers_for",
    "levels_of",
    "state_for",
    "sticky_from",
    "summary_state",
]


def levels_of(state: SummaryState, seen_seq: int = -1) -> dict[str, Any]:
    """The stored form of the summary's tiers (``covered_ids`` are not kept: the store
    knows coverage by sequence number)."""
    return {
        "summaries": list(state.summaries),
        "meta_summary": state.meta_summary,
        "covered_count": state.covered_count,
        "as_of_id": state.as_of_id,
        "cycles": state.cycles,
        "seen_seq": seen_seq,
        "view": state.view,
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
        view=levels.get("view"),
    )


# Parts of the engine state a session keeps elsewhere (summary, facts and the ledger of
# what lies before the slice have their own columns) or that count positions of one
# slice only (the next build reads another slice and finds them again, cheaply): fields,
# and step memos (BuildState.memos) by step name. Of the ledger's memo only where its
# sources begin is stored, as a sequence number (``ledger_from_seq``).
_NOT_STORED = ("layers", "summary_due")
_MEMOS_NOT_STORED = ("window", "layers")


def sticky_from(state: BuildState, seqs: Sequence[int]) -> dict[str, Any]:
    """The engine state with its positions turned into sequence numbers."""
    return _sticky(_stored_part(state), seqs)


def _sticky(stored: BuildState, seqs: Sequence[int]) -> dict[str, Any]:
    """:func:`sticky_from` of a state already without its unstored parts (what is not
    stored is not written only to go)."""
    from ctxwarden.steps.ledger import ledger_begin

    data = stored.to_dict()
    for name in _NOT_STORED:
        del data[name]
    if stored.history_length:
        data["last_seq"] = seqs[stored.history_length - 1]
        data["window_start_seq"] = seqs[min(stored.window_start, len(seqs) - 1)]
        data["ledger_from_seq"] = seqs[min(ledger_begin(stored), len(seqs) - 1)]
    return data


def _stored_part(state: BuildState) -> BuildState:
    """``state`` with the parts a session does not store (:data:`_NOT_STORED`,
    :data:`_MEMOS_NOT_STORED`, the ledger's memo but where its sources begin) at their
    defaults: what ``BuildState.from_dict(sticky_from(state, ...))`` gives back,
    positions aside."""
    from ctxwarden.steps.ledger import LedgerSources, ledger_memo

    memos = {k: v for k, v in state.memos.items() if k not in _MEMOS_NOT_STORED}
    ledger = ledger_memo(state)
    if ledger is not None:
        memos["ledger"] = LedgerSources(ledger.begin)
    return replace(state, **_unstored_defaults(), memos=memos)


@memoize(64)
def _unstored_defaults() -> dict[str, Any]:
    from ctxwarden.steps.state import BuildState

    defaults = {f.name: f.default for f in fields(BuildState) if f.name in _NOT_STORED}
    assert MISSING not in defaults.values() and len(defaults) == len(_NOT_STORED)
    return defaults


def state_for(
    sticky: Mapping[str, Any], seqs: Sequence[int], saved: SavedState | None = None
) -> BuildState | None:
    """The stored state with its sequence numbers turned into positions of ``seqs``;
    ``None`` (a cold build) when the last build's newest message is not in this slice.
    ``saved`` is what this process stored last: when ``sticky`` is that, its state is
    taken as built instead of decoded (equal, by :meth:`BuildState.from_dict`'s
    round trip). A state stored before the step memos had their own mapping (flat
    fields) is read as well."""
    from ctxwarden.steps.ledger import LedgerSources, ledger_memo
    from ctxwarden.steps.state import BuildState

    last_seq = sticky.get("last_seq")
    if last_seq is None:
        return None
    at = bisect.bisect_left(seqs, last_seq)
    if at == len(seqs) or seqs[at] != last_seq:
        return None
    if saved is not None and saved.sticky == sticky:
        state = saved.state
    else:
        data = {k: v for k, v in sticky.items() if k not in _FLAT_NOT_STORED}
        memos = data.get("memos")
        if isinstance(memos, Mapping):
            data["memos"] = {k: v for k, v in memos.items() if k not in _MEMOS_NOT_STORED}
        state = BuildState.from_dict(data)
    start = bisect.bisect_left(seqs, int(sticky.get("window_start_seq", 0)))
    ledger_from = bisect.bisect_left(seqs, int(sticky.get("ledger_from_seq", 0)))
    ledger = replace(ledger_memo(state) or LedgerSources(), begin=ledger_from)
    state = replace(state, history_length=at + 1, window_start=min(start, at))
    return state.with_memo("ledger", ledger)


# What a session stored before the step memos had their own mapping and does not keep
# (a state stored then: flat fields)
_FLAT_NOT_STORED = (*_NOT_STORED, "ledger", "flagged", "flagged_upto", "summary_scan")


@dataclass(frozen=True)
class SavedState:
    """The sticky decisions a session stored last and the state they hold (speed only:
    the next build of the session in this process reads them back)."""

    sticky: Mapping[str, Any]
    state: BuildState

    @classmethod
    def of(cls, state: BuildState, seqs: Sequence[int]) -> SavedState:
        stored = _stored_part(state)
        return cls(_sticky(stored, seqs), stored)

    @classmethod
    def forgotten(cls, saved: SavedState) -> SavedState:
        """``saved`` without what a build holds as sent (:meth:`Session.forget_sent`): the
        context's digests, and the ledger blocks as sent (a compaction keeps the block it
        sent in place, :func:`~ctxwarden.steps.ledger.stacked_ledger`; one the provider never
        answered holds nothing in its cache, so the ledger is rendered anew)."""
        state = replace(saved.state, prefix=(), ledger_sent="", ledger_base_sent="")
        state = state.with_memo("fit", None)  # the fit's earlier drops (kept_from)
        fresh = state.to_dict()
        sent = {k: fresh[k] for k in ("prefix", "ledger_sent", "ledger_base_sent", "memos")}
        return cls({**saved.sticky, **sent}, state)


def layers_for(record: StoredSession, history: Sequence[Message], seqs: Sequence[int]) -> Any:
    """The stored summary and facts as the engine's layer state for this slice (empty
    when the session has neither, so the build still reports when a first summary is
    due): the summary covers everything up to ``record.summary_upto``, so its cut is the
    slice's first position after that."""
    from ctxwarden.memory.facts import Facts
    from ctxwarden.memory.layer_state import LayerState

    cut = bisect.bisect_right(seqs, record.summary_upto)
    facts = Facts.from_json(record.facts) if record.facts else Facts()
    return LayerState(summary_state(record), facts, cut, len(history))
