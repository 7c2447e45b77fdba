"""What a later build needs from this one: one explicit, serialisable value (R10, R13).

:class:`BuildState` is owned by the caller: ``build_context(..., previous=state)`` reads it,
every build returns the next one, a session stores it (``to_dict``) and a new process —
another replica — loads it (``from_dict``) and builds exactly what this process would have.
Nothing a build's output depends on lives anywhere else: the process-wide caches left
(token counts, extracted entities, masked copies) are bounded, locked memos of pure
functions, and their absence changes no output.

It holds the sticky decisions (window start, masked and truncated messages), the
digests of the last context's messages (prefix reuse: :data:`PREFIX_DIGITS` hex digits of
each fingerprint, stored packed: 8 characters a message, where a whole one took 44),
the entity ledger of the messages before the window and where it began, the rendered
ledger block, the pinned positions found so far, the summary and facts
(:class:`~ctxwarden.steps.layers.LayerState`), when a summary is due, what it would fold,
and the sums its triggers test
(:class:`~ctxwarden.memory.summary_scan.SummaryScan`: the next build adds only the new
messages), and what cache-aware compaction weighs (the context's tokens, its tokens after
the last compaction, the append-only builds since: :mod:`ctxwarden.pipeline.compaction`).

Positions count messages of the list the build was given; a session translates them to
stored sequence numbers and back (:mod:`ctxwarden.session.rows`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxwarden.core.errors import ConfigError
from ctxwarden.memory.entity_ledger import EntityLedger
from ctxwarden.memory.layer_state import LayerState
from ctxwarden.memory.summary_scan import SummaryScan
from ctxwarden.steps.base import ActionKind

__all__ = [
    "PREFIX_DIGITS",
    "BuildState",
    "HistoryTurns",
    "LedgerMemo",
    "RecallMemo",
    "SummaryDue",
]

STATE_VERSION = 3  # 3: ``prefix`` holds digests, packed (2 and 1: whole fingerprints, a list)

PREFIX_DIGITS = 12
"""Hex digits of a message's fingerprint kept in :attr:`BuildState.prefix` (48 bits, as in
an automatic message id): a digest is only compared with the one at the same position of
the next context, so two different messages would have to agree in 48 bits to be taken for
one."""
_DIGEST_BYTES = PREFIX_DIGITS // 2


def _pack_prefix(prefix: Sequence[str]) -> str | list[str]:
    """The digests as one base64 string of their bytes (6 a digest); a prefix of other
    strings (a state made by hand) stays a list."""
    joined = "".join(prefix)
    try:
        raw = bytes.fromhex(joined)
    except ValueError:
        return list(prefix)
    if len(joined) != PREFIX_DIGITS * len(prefix) or raw.hex() != joined:  # (lowercase only)
        return list(prefix)
    return base64.b64encode(raw).decode("ascii")


def _unpack_prefix(data: Any, version: int) -> tuple[str, ...]:
    """:func:`_pack_prefix` undone; a list stored before version 3 holds whole
    fingerprints, of which the digests are their first :data:`PREFIX_DIGITS` digits."""
    if isinstance(data, str):
        raw = base64.b64decode(data, validate=True)  # (binascii.Error: a ValueError)
        if len(raw) % _DIGEST_BYTES:
            raise ValueError(f"a packed prefix of {len(raw)} bytes")
        return tuple(raw.hex(" ", _DIGEST_BYTES).split())  # (whole digests: from either end)
    if version < 3:
        return tuple(str(f)[:PREFIX_DIGITS] for f in data)
    return tuple(map(str, data))


@dataclass(frozen=True)
class SummaryDue:
    """A summary the build found due (the build never calls a model): the triggers that
    fired and the span it would fold. ``Session.summarize`` or
    :func:`ctxwarden.summarize_history` runs it; the next build shows the result."""

    reasons: tuple[str, ...]
    first_id: str
    last_id: str
    messages: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "reasons": list(self.reasons),
            "first_id": self.first_id,
            "last_id": self.last_id,
            "messages": self.messages,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SummaryDue:
        return cls(
            tuple(str(r) for r in data["reasons"]),
            str(data["first_id"]),
            str(data["last_id"]),
            int(data["messages"]),
        )


@dataclass(frozen=True)
class LedgerMemo:
    """The entity ledger of ``history[first:upto]`` less pinned messages (on top of
    the caller's ``earlier`` seed named by ``seed``), and the block last rendered from it
    with what it was rendered for (``key``): the next build extends the ledger by the
    messages that left the window since, and reuses the block when nothing changed."""

    first: int = 0
    upto: int = 0
    seed: str = ""
    ledger: EntityLedger = field(default_factory=EntityLedger)
    key: str = ""
    text: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "first": self.first,
            "upto": self.upto,
            "seed": self.seed,
            "ledger": self.ledger.to_dict(),
            "key": self.key,
            "text": self.text,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LedgerMemo:
        text = data.get("text")
        return cls(
            first=int(data.get("first", 0)),
            upto=int(data["upto"]),
            seed=str(data.get("seed", "")),
            ledger=EntityLedger.from_dict(data["ledger"]),
            key=str(data.get("key", "")),
            text=None if text is None else str(text),
        )


@dataclass(frozen=True)
class RecallMemo:
    """The recall block last rendered (``text``; ``None``: nothing relevant), the ids it
    shows with their tokens, and what it was rendered for (``key``): the next build
    reuses it without re-indexing when the query and the sources are unchanged."""

    key: str
    text: str | None = None
    shown: tuple[tuple[str, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "text": self.text, "shown": [list(s) for s in self.shown]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecallMemo:
        text = data.get("text")
        shown = tuple((str(i), int(t)) for i, t in data.get("shown", ()))
        return cls(str(data["key"]), None if text is None else str(text), shown)


@dataclass(frozen=True)
class HistoryTurns:
    """The whole history's assistant turns and its tokens after the system prompt, summed
    build by build: what a call of the loop adds on average
    (:func:`~ctxwarden.pipeline.compaction.growth_per_call`). Carried, not recounted, so
    a session that reads a slice of its store weighs a rewrite as ``build_context`` over
    the whole history does. ``tokens`` 0: not known (a state stored before these sums)."""

    turns: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class BuildState:
    """Decisions carried to the next build; see the module docstring."""

    history_length: int = 0
    last_id: str = ""
    window_start: int = 0
    sticky: Mapping[str, ActionKind] = field(default_factory=dict)
    prefix: tuple[str, ...] = ()  # the previous context's digests, in order (PREFIX_DIGITS)
    ledger_from: int = 0  # where the ledger's sources begin
    ledger: LedgerMemo | None = None
    flagged: tuple[int, ...] = ()  # pinned / critical positions before ``flagged_upto``
    flagged_upto: int = 0
    layers: LayerState | None = None  # summary and facts
    summary_due: SummaryDue | None = None
    recall: RecallMemo | None = None  # the recall step's last block
    summary_scan: SummaryScan | None = None  # the summary triggers' sums over the history
    # cache-aware compaction (ctxwarden.pipeline.compaction): the context's tokens, its tokens
    # right after the last compaction, and the held (append-only) builds since
    input_tokens: int = 0
    compacted_tokens: int = 0
    held_calls: int = 0
    kept_from: str = ""  # the fit's drops inside the window end before this message (its id)
    layers_sent: tuple[tuple[str, str, str], ...] = ()  # facts / summary: (layer, id, text)
    layers_key: str = ""  # what those layers were made of (compaction.layers_key)
    ledger_sent: str = ""  # the ledger block's text as sent (held between compactions)
    ledger_base_sent: str = ""  # the ledger block kept before it, as sent ("": none)
    turns: HistoryTurns = HistoryTurns()

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready; :meth:`from_dict` gives back an equal state."""
        return {
            "version": STATE_VERSION,
            "history_length": self.history_length,
            "last_id": self.last_id,
            "window_start": self.window_start,
            "sticky": dict(self.sticky),
            "prefix": _pack_prefix(self.prefix),
            "ledger_from": self.ledger_from,
            "ledger": None if self.ledger is None else self.ledger.to_dict(),
            "flagged": list(self.flagged),
            "flagged_upto": self.flagged_upto,
            "layers": None if self.layers is None else self.layers.to_dict(),
            "summary_due": None if self.summary_due is None else self.summary_due.to_dict(),
            "recall": None if self.recall is None else self.recall.to_dict(),
            "summary_scan": None if self.summary_scan is None else self.summary_scan.to_dict(),
            "input_tokens": self.input_tokens,
            "compacted_tokens": self.compacted_tokens,
            "held_calls": self.held_calls,
            "kept_from": self.kept_from,
            "layers_sent": [list(t) for t in self.layers_sent],
            "layers_key": self.layers_key,
            "ledger_sent": self.ledger_sent,
            "ledger_base_sent": self.ledger_base_sent,
            "turns": [self.turns.turns, self.turns.tokens],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildState:
        """The state :meth:`to_dict` wrote, by this version or an earlier one (a version-1
        dict: its five fields); :class:`~ctxwarden.core.errors.ConfigError` names what is
        malformed."""
        try:
            ledger, layers, due = data.get("ledger"), data.get("layers"), data.get("summary_due")
            recall, scan = data.get("recall"), data.get("summary_scan")
            return cls(
                history_length=int(data.get("history_length", 0)),
                last_id=str(data.get("last_id", "")),
                window_start=int(data.get("window_start", 0)),
                sticky={str(k): v for k, v in dict(data.get("sticky", {})).items()},
                prefix=_unpack_prefix(data.get("prefix", ()), int(data.get("version", 1))),
                ledger_from=int(data.get("ledger_from", 0)),
                ledger=None if ledger is None else LedgerMemo.from_dict(ledger),
                flagged=tuple(int(i) for i in data.get("flagged", ())),
                flagged_upto=int(data.get("flagged_upto", 0)),
                layers=None if layers is None else LayerState.from_dict(layers),
                summary_due=None if due is None else SummaryDue.from_dict(due),
                recall=None if recall is None else RecallMemo.from_dict(recall),
                summary_scan=None if scan is None else SummaryScan.from_dict(scan),
                input_tokens=int(data.get("input_tokens", 0)),
                compacted_tokens=int(data.get("compacted_tokens", 0)),
                held_calls=int(data.get("held_calls", 0)),
                kept_from=str(data.get("kept_from", "")),
                layers_sent=tuple(
                    (str(n), str(i), str(t)) for n, i, t in data.get("layers_sent", ())
                ),
                layers_key=str(data.get("layers_key", "")),
                ledger_sent=str(data.get("ledger_sent", "")),
                ledger_base_sent=str(data.get("ledger_base_sent", "")),
                turns=HistoryTurns(*map(int, data.get("turns", (0, 0)))),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"not a stored build state ({type(exc).__name__}: {exc})") from None
