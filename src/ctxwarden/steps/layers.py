"""The summary and facts layers of a build (R7, R8, R10): shown, never made, here.

A build shows the summary and facts of its :class:`LayerState` — made by
:func:`ctxwarden.pipeline.summarize.summarize_history` or a session's summary cycle, outside the
build — and, when a summariser is in use, says whether a summary is due
(``audit.summary_due``); it never calls a model.

The summary layer is the *view* of the stored summary for the newest user message
(:func:`~ctxwarden.memory.summaries.summary_view`): with the policy's
``summary.summary_share`` and a summariser that can focus (the offline one), the sentences
most relevant to the request, within that share of the budget (heading included);
otherwise the summary as written. Builds for one user message (an agent's tool-call
turns) share the layer, and so the cached prefix.

The facts layer shows the standing facts. A fact the user restates with a new value at
each of the last two user messages ("My order is ORD-3", then "... ORD-11") is the
subject of the request, not a standing fact: shown at the top it would change the cached
prefix at every user turn. It is held back while it keeps changing — its value is in the
newest user message, which a build never drops — and shown again from the first user
message that does not replace it. The record keeps every value either way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import count_key
from ctxwarden.memory.facts import Facts
from ctxwarden.memory.layer_state import LayerState
from ctxwarden.memory.summaries import plan_summary, summary_view, view_fills
from ctxwarden.memory.summary_scan import SummaryScan, scan_key, summary_due_of
from ctxwarden.steps.base import Draft, StepContext, StepResult, system_block
from ctxwarden.steps.memos import memo_of, register_memo

__all__ = [
    "HELD_VIEW_SHARE",
    "SUMMARY_HEADING",
    "LayerState",
    "LayersStep",
    "facts_layer_text",
    "held_layers",
    "layers_key",
    "layers_sent",
    "summary_in_share",
]

SUMMARY_HEADING = "Summary of the earlier conversation:\n"
# The layers step's memo (memos["layers"]): the summary triggers' sums over the history
register_memo("layers", SummaryScan)

_RESTATED_TURNS = 2  # a fact new at each of this many latest user messages is held back


@dataclass(frozen=True)
class LayersStep:
    """Adds the facts and summary layers and reports a summary that is due."""

    name: str = "layers"
    keeps_pairs: ClassVar[bool] = True  # adds layers, not window messages

    def held(self, draft: Draft, ctx: StepContext) -> Draft:
        """What a build between compactions sends of the layers: :func:`held_layers`."""
        return held_layers(draft, ctx)

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        layers: list[tuple[str, Message]] = []
        warnings: list[str] = []
        state = ctx.layer_state
        facts = ctx.facts_text
        summary = ctx.summary_text
        floor = draft.floor
        due = scan = None
        room = max(ctx.budget - ctx.fixed, 0)
        trigger = ctx.policy.summary
        facts_cap = int(room * trigger.max_facts_share)
        if state is not None:
            facts = facts_layer_text(state.facts, draft.history) or facts
        if facts and state is not None and len(state.facts):
            facts = _facts_within(state.facts, draft.history, facts_cap, ctx, warnings)
            if ctx.facts_text:  # a built context fed back: its facts, updated by the record's
                facts = _text_within(
                    _carried(ctx.facts_text, facts), facts_cap, ctx, "facts", warnings
                )
        elif facts:
            facts = _text_within(facts, facts_cap, ctx, "facts", warnings)
        focused = False
        if state is not None:
            if state.summary.text:
                fill = None
                if view_fills(trigger, ctx.summarizer):
                    fill = fill_room(draft, ctx, state.cut, _tokens(facts, ctx) if facts else 0)
                view, left_out = summary_in_share(
                    ctx.summarizer,
                    state.summary.text,
                    draft.history,
                    budget=ctx.budget,
                    share=trigger.summary_share,
                    count=ctx.count,
                    fill=fill,
                )
                focused = trigger.summary_share is not None or fill is not None
                summary = SUMMARY_HEADING + view if view else summary
                warnings.extend(left_out)
            floor = max(floor, state.cut)
            due, scan = summary_due(draft.history, state, ctx)
        if summary and not focused:
            # (a focused view is already held within the share you chose)
            cap = int(room * trigger.max_summary_share)
            summary = _text_within(summary, cap, ctx, "summary", warnings)
        if facts:
            layers.append(("facts", system_block(facts, "ctxwarden:facts")))
        if summary:
            layers.append(("summary", system_block(summary, "ctxwarden:summary")))
        new = draft.but(layers=(*draft.layers, *layers), floor=floor, summary_due=due)
        new = new.with_memo("layers", scan)
        return StepResult(new, (), tuple(warnings))


def _carried(carried: str, shown: str) -> str:
    """The facts an earlier build showed (``carried``: fed back as history, or passed as
    ``facts=``), each replaced by the record's line for its key where the record has one,
    then the record's other facts (``shown``). The record is made from the history it is
    given, which may hold less than the one the earlier build read (the agent's task, cut
    to its share, is fed back cut): a fact it no longer finds stays as it was shown, so a
    built context built again is itself."""
    head, *lines = shown.splitlines()
    mine = {_fact_key(line): line for line in lines}
    out = [mine.pop(_fact_key(line), line) for line in carried.splitlines()[1:]]
    return "\n".join([head, *out, *mine.values()])


def _fact_key(line: str) -> str:
    return line.split(": ", 1)[0]


def _tokens(text: str, ctx: StepContext) -> int:
    return ctx.count(Message.system(text))


def _text_within(text: str, cap: int, ctx: StepContext, layer: str, warnings: list[str]) -> str:
    """``text`` if it fits ``cap`` tokens as a layer, else its newest lines that do (the
    first line, a heading, kept): a summary's latest part is its level-one summary."""
    if _tokens(text, ctx) <= cap:
        return text
    lines = text.splitlines()
    head, body = (lines[0], lines[1:]) if len(lines) > 1 else ("", lines)
    lo, hi = 0, len(body)  # the largest tail of body that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _tokens("\n".join([head, *body[-mid:]]), ctx) <= cap:
            lo = mid
        else:
            hi = mid - 1
    kept = body[len(body) - lo :] if lo else []
    warnings.append(
        f"{layer} layer cut to its newest {lo} of {len(body)} line(s) to stay within "
        f"{cap:,} tokens (summary.max_{layer}_share)"
    )
    return "\n".join([head, *kept]) if kept else ""


def _facts_within(
    facts: Facts, history: Sequence[Message], cap: int, ctx: StepContext, warnings: list[str]
) -> str:
    """The facts layer within ``cap`` tokens: the most recently stated facts first (the
    rest stay in the record)."""
    text = facts_layer_text(facts, history)
    if not text or _tokens(text, ctx) <= cap:
        return text
    where = {m.id: i for i, m in enumerate(history)}
    keys = list(facts)
    rank = sorted(
        range(len(keys)),
        key=lambda k: (where.get(facts.source(keys[k]) or "", -1), k),
        reverse=True,
    )
    lo, hi = 0, len(keys)
    best = ""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        shown = {keys[k] for k in rank[:mid]}
        candidate = facts.render(leave_out={k for k in keys if k not in shown})
        if _tokens(candidate, ctx) <= cap:
            lo, best = mid, candidate
        else:
            hi = mid - 1
    warnings.append(
        f"facts layer shows the {lo} most recent of {len(keys)} facts to stay within "
        f"{cap:,} tokens (summary.max_facts_share; every fact stays in the record)"
    )
    return best


def fill_room(draft: Draft, ctx: StepContext, cut: int, facts: int) -> int:
    """The summary layer's room when no ``summary_share`` is set and the summariser can
    focus: what the budget leaves after the system prompt, the facts layer, the
    messages the summary does not cover (the window shows them) and the ledger's cap.
    The layers then fill the budget whatever its size, with no split to tune: a short
    unsummarised tail leaves the summary most of it, a long one (heavy tool results)
    leaves it less, but never less than ``summary.max_summary_share`` of what the system
    prompt leaves (what a summary as written may take): under a tight budget the window
    gives way (its oldest messages go to the ledger), not the whole summary."""
    room = max(ctx.budget - ctx.fixed, 0)
    tail = ctx.total(draft.history[max(cut, draft.sys_end) :])
    rest = room - facts - tail - ctx.ledger_cap(draft, grows=False)
    return max(rest, int(room * ctx.policy.summary.max_summary_share))


def summary_due(
    history: Sequence[Message], state: LayerState, ctx: StepContext
) -> tuple[Any, SummaryScan | None]:
    """What a summary cycle would fold now (``None``: no trigger fires): the trigger's plan,
    a pure function of the messages (see :func:`~ctxwarden.memory.summaries.plan_summary`);
    and the trigger sums the next build extends. The previous build's sums are extended
    when they fit this history (:mod:`~ctxwarden.memory.summary_scan`), so a build reads
    the messages appended since, not the whole history."""
    from ctxwarden.steps.state import SummaryDue

    trigger = ctx.policy.summary
    fills = view_fills(trigger, ctx.summarizer)
    if trigger.every_user_turns is not None:  # counted from the last summary: the plan's
        plan = plan_summary(history, trigger, ctx.count, ctx.budget, state.summary, fills=fills)
        if plan is None:
            return None, None
        return SummaryDue(plan.reasons, plan.fold[0].id, plan.fold[-1].id, len(plan.fold)), None
    key = scan_key(count_key(ctx.counter), state.summary)
    scan = memo_of(ctx.previous, "layers", SummaryScan) if ctx.previous.history_length else None
    if scan is None or not scan.fits(history, key):
        scan = SummaryScan(key=key)
    due, scan = summary_due_of(
        history, trigger, ctx.count, ctx.budget, state.summary, fills=fills, scan=scan
    )
    return (SummaryDue(*due) if due is not None else None), scan


def summary_in_share(
    summarizer: Any,
    summary: str,
    history: Sequence[Message],
    *,
    budget: int,
    share: float | None,
    count: Callable[[Message], int],
    fill: int | None = None,
) -> tuple[str, tuple[str, ...]]:
    """``(view, warnings)``: the stored ``summary`` as a build shows it (no heading).

    With a ``share`` of the budget and a summariser that can focus, the view for the
    newest user message in ``history`` within that share, less the heading message; a
    share too small for any sentence gives ``""`` and a warning (the summary stays
    stored). Without a share, ``fill`` (tokens, see :func:`fill_room`) is the layer's
    room instead. Otherwise the summary as stored."""
    room = None
    if share is not None:  # the layer (heading and message framing too) within the share
        room = int(budget * share) - count(Message.system(SUMMARY_HEADING))
    elif fill is not None:  # what the rest of the context leaves (see fill_room)
        room = fill - count(Message.system(SUMMARY_HEADING))
    view = summary_view(summarizer, summary, _newest_user_text(history), room)
    if view:
        return view, ()
    return "", (
        f"summary left out: its share of the budget ({room or 0:,} tokens after the heading) "
        "holds none of its sentences; raise summary.summary_share (the summary stays stored)",
    )


def facts_layer_text(facts: Facts, history: Sequence[Message]) -> str:
    """The facts layer: every fact but those given a new value by each of the last
    ``_RESTATED_TURNS`` user messages (see the module docstring); ``""`` when empty."""
    if not len(facts):
        return ""
    recent = [m.id for m in _newest_users(history, _RESTATED_TURNS)]
    held = facts.changed_at_each(recent) if len(recent) == _RESTATED_TURNS else frozenset()
    return facts.render(leave_out=held)


def _newest_users(history: Sequence[Message], n: int) -> list[Message]:
    """The newest ``n`` user messages, oldest first (fewer if there are not)."""
    found: list[Message] = []
    for m in reversed(history):
        if m.role == "user":
            found.append(m)
            if len(found) == n:
                break
    return found[::-1]


def _newest_user_text(history: Sequence[Message]) -> str | None:
    newest = _newest_users(history, 1)
    return newest[0].text if newest else None


# -- between compactions: the layers as they were sent --------------------------------------

_HELD_LAYERS = frozenset({"facts", "summary"})


def layers_key(ctx: StepContext) -> str:
    """The layer texts the caller passed (``build_context(summary=..., facts=...)``) and
    the policy's ``summary`` settings: a held build shows the layers it sent last while
    these are unchanged (the caller's own decision to change them, or to size the
    summary differently, is not held back)."""
    raw = f"{ctx.summary_text or ''}|{ctx.facts_text or ''}|{ctx.policy.summary!r}"
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def held_layers(draft: Draft, ctx: StepContext) -> Draft:
    """The facts and summary blocks the previous context sent, sent again where they still
    hold (with ``[cache] hold_layers``, the default): a summariser that focuses its view
    on the newest message, a fact just extracted from it, or a new summary cycle would
    otherwise rewrite everything after the layers at every call.

    The summary is held, between compactions and through them, while it is mostly what
    the build would show (:data:`HELD_VIEW_SHARE`): a compaction had to move the window,
    and the summary before it stays cached. The facts are held between compactions while
    every value they show is still current (:func:`_still_stated`; a fact only added
    waits, its message is in the window) and renewed at a compaction whenever they differ
    (a held block would keep a new fact out for good). Between compactions a layer the
    previous context did not have waits for the next compaction, and the window keeps its
    start while the summary is held (the floor a new summary would move it to waits too,
    so what the new summary covers is still shown verbatim). The recall layer follows the
    query at the tail and is not held."""
    previous = ctx.previous
    holding = ctx.hold or ctx.compacting
    if not ctx.policy.cache.hold_layers or not holding or not previous.layers_sent:
        return draft
    if previous.layers_key != layers_key(ctx):
        return draft
    now = {name: m for name, m in draft.layers if name in _HELD_LAYERS}
    sent = {name: system_block(text, block_id) for name, block_id, text in previous.layers_sent}
    shown = {
        name: sent[name] if name in sent and _holds(name, m.text, sent[name].text, ctx) else m
        for name, m in now.items()
    }
    if ctx.hold:  # between compactions a new layer waits; a held summary stays
        shown = {name: m for name, m in shown.items() if name in sent}
        if "summary" in sent and "summary" not in now:
            shown["summary"] = sent["summary"]
    layers = [(name, shown[name]) for name in ("facts", "summary") if name in shown]
    rest = [(name, m) for name, m in draft.layers if name not in _HELD_LAYERS]
    floor = draft.floor
    if "summary" in sent and shown.get("summary") is sent["summary"]:
        floor = min(floor, max(previous.window_start, draft.sys_end))
    return draft.but(layers=(*layers, *rest), floor=floor)


def _holds(name: str, now: str, held: str, ctx: StepContext) -> bool:
    """Whether the ``held`` block of layer ``name`` is sent again instead of ``now``'s."""
    if name == "facts":
        if ctx.compacting:
            return held == now
        state = ctx.layer_state
        return _still_stated(state.facts.render() if state is not None else now, held)
    return _mostly_shown(now, held)


HELD_VIEW_SHARE = 0.5
"""A layer is held while the held text shows at least this share of the lines the build
would show now: a summary view focused on a new question that shows mostly other
sentences is worth its rewrite. LoCoMo dev at 4,000 tokens, fed session by session,
answer recall / the chat loop's cost against the full history with caching: 0.6601 / 87%
with the layers held (0.687 / 271% renewed at every build: the view follows each chat
turn and rewrites what follows it)."""


def _still_stated(now: str, held: str) -> bool:
    """Whether every line of the held facts block is still a line of ``now`` (every
    current value, those the layer holds back as the request's subject too): a fact only
    added since waits for the next compaction (its message is in the window), but a
    value replaced since must not be shown as current."""
    stated = set(now.splitlines())
    return all(line in stated for line in held.splitlines() if line.strip())


def _mostly_shown(now: str, held: str) -> bool:
    lines = [line for line in now.splitlines() if line.strip()]
    if not lines:
        return True
    shown = set(held.splitlines())
    return sum(line in shown for line in lines) >= HELD_VIEW_SHARE * len(lines)


def layers_sent(draft: Draft) -> tuple[tuple[str, str, str], ...]:
    """The facts and summary blocks of a build, for the next one to hold."""
    return tuple((name, m.id, m.text) for name, m in draft.layers if name in _HELD_LAYERS)
