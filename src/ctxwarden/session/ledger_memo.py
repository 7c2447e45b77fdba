"""The last build's memos kept by an open session, by sequence number (speed only).

A build's :class:`~ctxwarden.steps.ledger.LedgerMemo` (in its ``memos["ledger"]``) holds
the entity ledger of the messages its window no longer shows and the block it rendered;
the engine extends it on the next build instead of extracting and ranking those messages
again. A session stores its sticky decisions without it (the ledger of what lies before
the slice has its own checkpoint), so each :meth:`~ctxwarden.Session.build` used to
re-extract and re-rank the masked and dropped part of its slice: in the proxy, about half
of a steady-state build.

:class:`SeqMemo` is that memo with its positions turned into the sequence numbers of the
messages it covers, kept in memory by the open :class:`~ctxwarden.Session` (never stored:
a replica that has not built the session builds the same context without it).
:meth:`SeqMemo.for_slice` gives it back in positions of a new slice only when that slice
holds exactly the same messages in the covered range; the engine's own checks (the
ledger seed, where the sources begin, the rendered block's key) decide the rest, as for
``build_context(previous=...)``. The build's
:class:`~ctxwarden.memory.summary_scan.SummaryScan` (the summary triggers' sums over
the slice) is kept the same way, and given back when the new slice begins with the
very messages it summed; so is the window's :class:`~ctxwarden.steps.window.WindowMemo`
(the pinned and critical messages before the window, and where the newest user message
is: given back when the new slice begins with the whole slice of the build that made it;
in a coding agent's long turn the slice is the whole run, which the build walked again
for both at each call). Without them every output is the same.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ctxwarden.memory.summary_scan import SummaryScan
from ctxwarden.steps.ledger import LedgerMemo, LedgerSources, carried_ledger, ledger_memo
from ctxwarden.steps.memos import memo_of
from ctxwarden.steps.state import BuildState
from ctxwarden.steps.window import WindowMemo

__all__ = ["SeqMemo"]


@dataclass(frozen=True)
class SeqMemo:
    """A :class:`LedgerMemo` whose sources are the messages ``seqs`` (in order), a
    :class:`SummaryScan` of the slice ``scanned`` (the summary triggers' sums) and a
    :class:`WindowMemo` of the build's whole slice ``windowed`` (the pinned messages
    before the window, the newest user message)."""

    memo: LedgerMemo | None
    seqs: tuple[int, ...]
    scan: SummaryScan | None = None
    scanned: tuple[int, ...] = ()
    window: WindowMemo | None = None
    windowed: tuple[int, ...] = ()

    @classmethod
    def of(cls, state: BuildState, seqs: Sequence[int]) -> SeqMemo | None:
        """The memos of a build over the slice ``seqs`` (None: it has none)."""
        memo, scan = carried_ledger(state), memo_of(state, "layers", SummaryScan)
        window = memo_of(state, "window", WindowMemo)
        if memo is None or not state.history_length or memo.upto > len(seqs):
            memo = None
        if scan is None or scan.upto > len(seqs):
            scan = None
        if window is None or window.seen > len(seqs):
            window = None
        if memo is None and scan is None and window is None:
            return None
        covered = tuple(seqs[memo.first : memo.upto]) if memo is not None else ()
        return cls(
            memo,
            covered,
            scan,
            tuple(seqs[: scan.upto]) if scan is not None else (),
            window,
            tuple(seqs[: window.seen]) if window is not None else (),
        )

    def for_slice(self, state: BuildState, seqs: Sequence[int]) -> BuildState:
        """``state`` (the stored one, in positions of ``seqs``) with these memos: the
        ledger's when ``seqs`` holds the covered messages at consecutive positions, the
        scan and the window's when ``seqs`` begins with the slice they read; else
        unchanged."""
        if self.scan is not None and tuple(seqs[: len(self.scanned)]) == self.scanned:
            state = state.with_memo("layers", self.scan)
        if self.window is not None and tuple(seqs[: len(self.windowed)]) == self.windowed:
            state = state.with_memo("window", self.window)
        if self.memo is None:
            return state
        sources = ledger_memo(state) or LedgerSources()
        first = bisect.bisect_left(seqs, self.seqs[0]) if self.seqs else sources.begin
        upto = first + len(self.seqs)
        if tuple(seqs[first:upto]) != self.seqs:
            return state
        return state.with_memo(
            "ledger", replace(sources, memo=replace(self.memo, first=first, upto=upto))
        )
