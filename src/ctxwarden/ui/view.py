"""What the session pages show, read from the store: plain data, no HTML (R15).

:func:`session_page` reads a session's logged builds
(:mod:`ctxwarden.session.build_log`), its summary and facts, and the details of one
turn: each message the build dropped, masked, truncated, summarised or recalled, with
the reason, the original's first lines (read back from the store by its handle) and the
values it carried (:func:`ctxwarden.memory.entities.extract_entities`), each marked as
still in the context (the ledger keeps it, or another message) or gone. Both the pages
of ``ctxwarden serve`` and the file ``ctxwarden session show --html`` render these.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ctxwarden.core.errors import UnknownModelError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.catalog import Registry
from ctxwarden.core.registry.cost import estimate_cost
from ctxwarden.core.registry.usage import Usage
from ctxwarden.formats.openai import message_from_openai
from ctxwarden.memory.entities import extract_entities
from ctxwarden.memory.facts import Facts
from ctxwarden.session import rows as session_state
from ctxwarden.store import SessionStore, StoredSession
from ctxwarden.store.service_tables import (
    BuildRecord,
    latest_builds,
    list_builds,
    logged_context,
)

__all__ = [
    "ACTION_ORDER",
    "LAYER_ORDER",
    "ActionView",
    "ContextMessage",
    "FactView",
    "SessionPage",
    "TurnView",
    "layer_names",
    "message_text",
    "session_page",
    "session_rows",
    "turn_view",
]

LAYER_ORDER = ("system", "facts", "ledger", "summary", "recall", "pinned", "window", "current")
"""The order of the layers in a bar, bottom up (a layer a build adds later goes on top)."""
ACTION_ORDER = ("dropped", "evicted", "masked", "truncated", "summarized", "recalled", "rejected")
_HANDLE = re.compile(r"^m(\d+)$")
_PREVIEW = 600
_GAP = 16  # read across gaps this small rather than split the read
_SPAN = 500


def message_text(message: Message) -> str:
    """The text a person reads: the content, then each tool call as ``name(arguments)``."""
    calls = "\n".join(f"{c.name}({c.arguments})" for c in message.tool_calls)
    return "\n".join(t for t in (message.text, calls) if t)


def layer_names(builds: Iterable[BuildRecord]) -> list[str]:
    """The layers the builds put tokens in, in :data:`LAYER_ORDER` (unknown ones after, by name)."""
    seen = {n for b in builds for n, tokens in b.audit.get("layers", {}).items() if tokens}
    known = [n for n in LAYER_ORDER if n in seen]
    return known + sorted(seen - set(LAYER_ORDER))


@dataclass(frozen=True)
class ActionView:
    """One thing the build did to one message, with what the message said and carried."""

    kind: str
    message_id: str
    reason: str
    tokens_before: int
    tokens_after: int
    strategy: str
    new: bool  # the previous build did not do this to this message
    role: str = ""
    preview: str = ""
    values: tuple[tuple[str, str, bool], ...] = ()  # (label, value, still in the context)


@dataclass(frozen=True)
class ContextMessage:
    layer: str
    role: str
    name: str
    message_id: str
    text: str


@dataclass(frozen=True)
class TurnView:
    """The selected turn: its build row, its actions by kind and its built messages."""

    build: BuildRecord
    actions: Mapping[str, tuple[ActionView, ...]]
    context: tuple[ContextMessage, ...] | None  # None: too old, its messages were not kept
    ledger_text: str | None
    history_cost_usd: float | None
    price: Mapping[str, float | None]

    @property
    def audit(self) -> Mapping[str, Any]:
        return self.build.audit

    @property
    def lost_values(self) -> list[tuple[str, str, str]]:
        """``(value, label, message id)`` of each value that left the context this turn."""
        out: dict[str, tuple[str, str, str]] = {}
        for views in self.actions.values():
            for a in views:
                for label, value, kept in a.values:
                    if not kept and a.new:
                        out.setdefault(value, (value, label, a.message_id))
        return list(out.values())


@dataclass(frozen=True)
class FactView:
    key: str
    history: tuple[tuple[str, str | None, int | None], ...]  # (value, source, turn)


@dataclass(frozen=True)
class SessionPage:
    record: StoredSession
    builds: tuple[BuildRecord, ...]
    layers: tuple[str, ...]
    turn: TurnView | None
    facts: tuple[FactView, ...]
    summary: str | None
    summary_turn: int | None
    summary_cycles: int
    turns: Mapping[int, TurnView] = field(default_factory=dict)  # every turn (static file)
    missing_turn: int | None = None  # asked for, but not in the log (the newest is shown)


def _seq(message_id: str) -> int | None:
    found = _HANDLE.match(message_id)
    return int(found.group(1)) if found else None


def _originals(store: SessionStore, tenant: str, sid: str, ids: Iterable[str]) -> dict[str, Any]:
    """The stored messages behind ``ids`` (handles ``m<seq>``; a message stored with an
    id of its own is not looked up), read in ranges that skip the gaps between them."""
    seqs = sorted({s for s in map(_seq, ids) if s is not None})
    found: dict[str, Any] = {}
    i = 0
    while i < len(seqs):
        j = i
        while j + 1 < len(seqs) and seqs[j + 1] - seqs[j] <= _GAP and seqs[j + 1] - seqs[i] < _SPAN:
            j += 1
        for row in store.range(tenant, sid, seqs[i], seqs[j] + 1):
            found[row.message.id or f"m{row.seq}"] = row.message
            found[f"m{row.seq}"] = row.message
        i = j + 1
    return found


def _context(rows: Sequence[Mapping[str, Any]] | None) -> tuple[ContextMessage, ...] | None:
    if rows is None:
        return None
    out = []
    for i, row in enumerate(rows):
        m = message_from_openai(row["message"], index=i)
        out.append(
            ContextMessage(str(row.get("layer", "")), m.role, m.name or "", m.id, message_text(m))
        )
    return tuple(out)


def _price(model: str, registry: Registry | None) -> dict[str, float | None]:
    try:
        info = (registry or Registry.default()).get(model)
    except UnknownModelError:
        return {}
    p = info.price
    return {"input": p.input, "cached_input": p.cached_input, "cache_write": p.cache_write}


def turn_view(
    store: SessionStore,
    tenant: str,
    build: BuildRecord,
    previous: BuildRecord | None,
    *,
    registry: Registry | None = None,
    with_context: bool = True,
) -> TurnView:
    """The details of one logged build (see the module docstring)."""
    sid = build.session_id
    actions = build.audit.get("actions", [])
    before = {
        (a["action"], a["message_id"])
        for a in (previous.audit if previous else {}).get("actions", [])
    }
    rows = (
        logged_context(store, tenant, sid, build.build_id)
        if with_context and build.has_context
        else None
    )
    context = _context(rows)
    sent = "\n".join(m.text for m in context) if context is not None else None
    originals = _originals(store, tenant, sid, (a["message_id"] for a in actions))
    grouped: dict[str, list[ActionView]] = {}
    for a in actions:
        original = originals.get(a["message_id"])
        values: list[tuple[str, str, bool]] = []
        if original is not None:
            for e in extract_entities(original):
                if all(v != e.value for _, v, _ in values):
                    values.append((e.label, e.value, sent is not None and e.value in sent))
        view = ActionView(
            kind=a["action"],
            message_id=a["message_id"],
            reason=a.get("reason", ""),
            tokens_before=int(a.get("tokens_before", 0)),
            tokens_after=int(a.get("tokens_after", 0)),
            strategy=a.get("strategy", ""),
            new=(a["action"], a["message_id"]) not in before,
            role=original.role if original is not None else "",
            preview=message_text(original)[:_PREVIEW] if original is not None else "",
            values=tuple(values),
        )
        grouped.setdefault(view.kind, []).append(view)
    listed = {v.message_id for v in grouped.get("recalled", [])}
    for m in context or ():  # brought back into the context by the recall layer
        if m.layer == "recall" and m.message_id not in listed:
            reason = "brought back: relevant to the newest user message"
            view = ActionView("recalled", m.message_id, reason, 0, 0, "recall", True, m.role)
            grouped.setdefault("recalled", []).append(replace(view, preview=m.text[:_PREVIEW]))
    ordered = {k: tuple(grouped[k]) for k in (*ACTION_ORDER, *sorted(grouped)) if k in grouped}
    ledger = next((m.text for m in context if m.layer == "ledger"), None) if context else None
    try:
        history_cost: float | None = estimate_cost(
            Usage(input_tokens=build.history_tokens), build.model, registry
        )
    except UnknownModelError:
        history_cost = None
    return TurnView(build, ordered, context, ledger, history_cost, _price(build.model, registry))


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _turn_of(builds: Sequence[BuildRecord], seq: int | None) -> int | None:
    """The first turn whose build saw message ``seq``."""
    if seq is None:
        return None
    for b in builds:
        if b.upto_seq >= seq:
            return b.turn
    return None


def session_page(
    store: SessionStore,
    tenant: str,
    record: StoredSession,
    *,
    turn: int | None = None,
    registry: Registry | None = None,
    every_turn: bool = False,
    limit: int = 100_000,
) -> SessionPage:
    """A session's page: its builds, the selected ``turn`` (default the newest), the
    summary and the facts with their history; ``every_turn`` adds the details of every
    turn (the self-contained file, which has no server to ask)."""
    sid = record.session_id
    builds = tuple(list_builds(store, tenant, sid, limit=limit))
    index = {b.turn: i for i, b in enumerate(builds)}
    selected: TurnView | None = None
    turns: dict[int, TurnView] = {}
    missing = turn if turn is not None and turn not in index else None
    if builds:
        i = index[turn] if turn is not None and missing is None else len(builds) - 1
        pick = builds[i]
        if every_turn:
            for k, b in enumerate(builds):
                turns[b.turn] = turn_view(
                    store, tenant, b, builds[k - 1] if k else None, registry=registry
                )
            selected = turns[pick.turn]
        else:
            selected = turn_view(
                store, tenant, pick, builds[i - 1] if i else None, registry=registry
            )
    history = Facts.from_json(record.facts).to_json()["history"]
    fact_views = tuple(
        FactView(
            key,
            tuple(
                (_shown(r["value"]), r["source"], _turn_of(builds, _seq(r["source"] or "")))
                for r in records
            ),
        )
        for key, records in history.items()
    )
    levels = session_state.summary_state(record)
    return SessionPage(
        record=record,
        builds=builds,
        layers=tuple(layer_names(builds)),
        turn=selected,
        facts=fact_views,
        summary=record.summary,
        summary_turn=_turn_of(builds, record.summary_upto) if record.summary_upto >= 0 else None,
        summary_cycles=levels.cycles,
        turns=turns,
        missing_turn=missing,
    )


def session_rows(store: SessionStore, tenant: str) -> list[dict[str, Any]]:
    """One row per session of ``tenant`` for the list page, most recently active first."""
    latest = latest_builds(store, tenant)
    rows: list[dict[str, Any]] = []
    for r in store.list_sessions(tenant):
        b = latest.get(r.session_id)
        rows.append(
            {
                "id": r.session_id,
                "messages": r.next_seq,
                "turns": b.turn if b else 0,
                "input_tokens": b.input_tokens if b else None,
                "history_tokens": b.history_tokens if b else None,
                "cost": r.dollars,
                "updated_at": max(r.updated_at, b.created_at if b else 0.0),
                "warnings": len(b.audit.get("warnings", [])) if b else 0,
            }
        )
    rows.sort(key=lambda row: -row["updated_at"])
    return rows
