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
the summary and facts (:class:`~ctxwarden.steps.layers.LayerState`), when a summary is
due and what it would fold, what cache-aware compaction weighs (the context's tokens, its
tokens after the last compaction, the append-only builds since, the blocks as sent:
:mod:`ctxwarden.pipeline.compaction`), and each step's own memo under the step's name
(``memos``, :mod:`ctxwarden.steps.memos`): the window's pinned positions found so far
(``window``), the fit's earlier drops (``fit``), the entity ledger of the messages before
the window, where its sources begin and the block rendered from it (``ledger``,
:class:`~ctxwarden.steps.ledger.LedgerSources`), the recall block (``recall``) and the
sums the summary triggers test (``layers``,
:class:`~ctxwarden.memory.summary_scan.SummaryScan`: the next build adds only the new
messages). A state stored before the memos had their own mapping (version 3 and before,
flat fields) is read into it.

Positions count messages of the list the build was given; a session translates them to
stored sequence numbers and back (:mod:`ctxwarden.session.rows`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ctxwarden.core.errors import ConfigError
from ctxwarden.memory.layer_state import LayerState
from ctxwarden.steps.base import ActionKind
from ctxwarden.steps.memos import Memo, decode_memo, memos_with

__all__ = [
    "PREFIX_DIGITS",
    "BuildState",
    "SummaryDue",
]

# 4: the steps' memos under ``memos``, by step name (3 and before: flat fields, still read);
# 3: ``prefix`` holds digests, packed (2 and 1: whole fingerprints, a list)
STATE_VERSION = 4

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
class BuildState:
    """Decisions carried to the next build; see the module docstring."""

    history_length: int = 0
    last_id: str = ""
    window_start: int = 0
    sticky: Mapping[str, ActionKind] = field(default_factory=dict)
    prefix: tuple[str, ...] = ()  # the previous context's digests, in order (PREFIX_DIGITS)
    layers: LayerState | None = None  # summary and facts
    summary_due: SummaryDue | None = None
    # cache-aware compaction (ctxwarden.pipeline.compaction): the context's tokens, its tokens
    # right after the last compaction, and the held (append-only) builds since
    input_tokens: int = 0
    compacted_tokens: int = 0
    held_calls: int = 0
    layers_sent: tuple[tuple[str, str, str], ...] = ()  # facts / summary: (layer, id, text)
    layers_key: str = ""  # what those layers were made of (compaction.layers_key)
    ledger_sent: str = ""  # the ledger block's text as sent (held between compactions)
    ledger_base_sent: str = ""  # the ledger block kept before it, as sent ("": none)
    # the whole history's assistant turns (the loop's model calls so far), carried build by
    # build: a session reads a slice of its store, so recounting would differ by path
    turns: int = 0
    # each step's own memo, by the step's name (ctxwarden.steps.memos): read with memo_of
    memos: Mapping[str, Memo] = field(default_factory=dict)

    def with_memo(self, step: str, memo: Memo | None) -> BuildState:
        """A copy whose memo of ``step`` is ``memo`` (``None``: none)."""
        return replace(self, memos=memos_with(self.memos, step, memo))

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready; :meth:`from_dict` gives back an equal state."""
        return {
            "version": STATE_VERSION,
            "history_length": self.history_length,
            "last_id": self.last_id,
            "window_start": self.window_start,
            "sticky": dict(self.sticky),
            "prefix": _pack_prefix(self.prefix),
            "layers": None if self.layers is None else self.layers.to_dict(),
            "summary_due": None if self.summary_due is None else self.summary_due.to_dict(),
            "input_tokens": self.input_tokens,
            "compacted_tokens": self.compacted_tokens,
            "held_calls": self.held_calls,
            "layers_sent": [list(t) for t in self.layers_sent],
            "layers_key": self.layers_key,
            "ledger_sent": self.ledger_sent,
            "ledger_base_sent": self.ledger_base_sent,
            "turns": self.turns,
            "memos": {name: memo.to_dict() for name, memo in self.memos.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildState:
        """The state :meth:`to_dict` wrote, by this version or an earlier one (a version-1
        dict: its five fields; before version 4, the memos as flat fields:
        :func:`_flat_memos`); :class:`~ctxwarden.core.errors.ConfigError` names what is
        malformed."""
        try:
            layers, due = data.get("layers"), data.get("summary_due")
            stored = {**_flat_memos(data), **dict(data.get("memos") or {})}
            return cls(
                history_length=int(data.get("history_length", 0)),
                last_id=str(data.get("last_id", "")),
                window_start=int(data.get("window_start", 0)),
                sticky={str(k): v for k, v in dict(data.get("sticky", {})).items()},
                prefix=_unpack_prefix(data.get("prefix", ()), int(data.get("version", 1))),
                layers=None if layers is None else LayerState.from_dict(layers),
                summary_due=None if due is None else SummaryDue.from_dict(due),
                input_tokens=int(data.get("input_tokens", 0)),
                compacted_tokens=int(data.get("compacted_tokens", 0)),
                held_calls=int(data.get("held_calls", 0)),
                layers_sent=tuple(
                    (str(n), str(i), str(t)) for n, i, t in data.get("layers_sent", ())
                ),
                layers_key=str(data.get("layers_key", "")),
                ledger_sent=str(data.get("ledger_sent", "")),
                ledger_base_sent=str(data.get("ledger_base_sent", "")),
                turns=int(data.get("turns", 0)),
                memos={str(k): decode_memo(str(k), v) for k, v in stored.items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"not a stored build state ({type(exc).__name__}: {exc})") from None


def _flat_memos(data: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The memos a state stored before version 4 kept as flat fields, in the form each
    step's memo stores now: the ledger's (``ledger_from``, ``ledger``), the window's
    pinned positions (``flagged``, ``flagged_upto``), the fit's earlier drops
    (``kept_from``), the recall block (``recall``) and the summary triggers' sums
    (``summary_scan``, the layers step's)."""
    found: dict[str, Mapping[str, Any]] = {}
    if "ledger_from" in data or "ledger" in data:
        found["ledger"] = {"begin": data.get("ledger_from", 0), "memo": data.get("ledger")}
    if "flagged" in data or "flagged_upto" in data:
        found["window"] = {
            "flagged": data.get("flagged", ()),
            "upto": data.get("flagged_upto", 0),
        }
    if "kept_from" in data:
        found["fit"] = {"kept_from": data["kept_from"]}
    for name, key in (("recall", "recall"), ("layers", "summary_scan")):
        if data.get(key) is not None:
            found[name] = data[key]
    return found
