"""The layout (R10): stable parts first, so provider caches reuse the prefix::

    [system prompt][summary][other layers][facts][ledger][pinned][window ...]
        [recall][newest user message ...]

The summary comes first: it is held through compactions
(:func:`~ctxwarden.steps.layers.held_layers`), while the facts are renewed whenever a
value they show is replaced and the ledger takes in the values of what the window drops
at most compactions; each rewrites only what follows it (LoCoMo dev at 4,000 tokens,
the chat loop: 87% of the full history with caching, 121% with the facts and the ledger
before the summary).

When the window opens with a user message and nothing is pinned before it, the summary,
the other layers and the ledger may go right after that message instead (the facts stay
before it)::

    [system prompt][facts][user message][summary][other layers][ledger][window ...]

A coding agent's one task opens its window through every compaction (the window never
starts after the newest user message), while the ledger changes at most compactions:
before the task, each new ledger rendering wrote the task again (swebench-mini dev at
8,000 tokens: at ~90 of ~130 compactions); after it, the system prompt and the task stay
cached and only what a compaction rewrites anyway is written. In a chat the window's
first message changes at most compactions and the ledger often does not, so there the
layers are better before the window. The rule is the cache's own: a compaction (a build
not held, :mod:`~ctxwarden.pipeline.compaction`) puts the layers after the window's first
message when that shares more tokens with the previous context than the usual layout
does; between compactions they stay where the previous context had them; a build
without a previous context uses the usual layout. A cache that follows the messages'
order serves this (OpenAI's, the bench's idealised one). Anthropic's ``system`` parameter
and Gemini's ``systemInstruction`` come before every message, so there a system message
that follows the task is sent in place as text of the task's user turn
(:mod:`~ctxwarden.formats.anthropic`, :mod:`~ctxwarden.formats.gemini`) and the layers may
follow the task too. Where the layers fold into the one system prompt (a model whose
template takes one), they precede the task anyway and the usual layout is kept
(:func:`system_in_place`), so the cache-aware decisions price the prefix the wire sends.

The Anthropic cache breakpoints (at most four): the end of the system prompt, of the
layers, of the user message the layers follow (when they follow one), of the pinned
messages (when they do not: nothing is pinned then), and the newest message.

For a model whose chat template takes one system message (the registry's
``system_messages = "one"``) the layers are folded into the system prompt, after it
(:mod:`~ctxwarden.steps.fold`); the audit still gives each layer its tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise, repeat
from operator import attrgetter
from typing import ClassVar

from ctxwarden.core.messages import Message
from ctxwarden.core.registry.catalog import ModelInfo
from ctxwarden.formats.anthropic import MAX_CACHE_BREAKPOINTS
from ctxwarden.steps.base import Draft, StepContext, StepResult
from ctxwarden.steps.fold import fold_system
from ctxwarden.steps.state import PREFIX_DIGITS

__all__ = ["STABLE_LAYERS", "LayoutStep", "system_in_place"]

STABLE_LAYERS = frozenset({"system", "facts", "ledger", "summary", "pinned"})


def system_in_place(info: ModelInfo | None) -> bool:
    """Whether ``info``'s wire keeps a system message where it stands among the others:
    OpenAI's does, and so do Anthropic's and Gemini's as ctxwarden writes them
    (:func:`~ctxwarden.formats.anthropic.messages_to_anthropic` and
    :func:`~ctxwarden.formats.gemini.messages_to_gemini` send a system message that
    follows the conversation's first message in place, as text of its user turn); a
    model whose template takes one system message does not (its layers are folded)."""
    return info is None or not info.one_system_message


# Anthropic cache breakpoints go at the end of each of these groups of stable layers.
_BREAKPOINT_GROUP: dict[str, float] = {
    "system": 0,
    "facts": 1,
    "ledger": 1,
    "summary": 1,
    "pinned": 2,
}
# ... and at the end of the message the layers follow (the task), a group of its own: a
# compaction that renders the ledger again then reads the task from the cache (Anthropic
# writes an entry only where a breakpoint is; one at the layers' end alone would make the
# task be written again). Nothing is pinned when layers follow it: four marks at most.
_HEAD_GROUP = 1.5


@dataclass(frozen=True)
class LayoutStep:
    """Orders the draft's parts into the context to send."""

    name: str = "layout"
    keeps_pairs: ClassVar[bool] = True  # orders the blocks it is given
    lays_out: ClassVar[bool] = True  # run again after the engine's final pair check

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        sent = draft
        draft = _request_first(draft)
        head = 0
        if ctx.system_in_place and _may_follow_head(draft):
            head = _held_head(draft, ctx) if ctx.hold else _cheaper_head(draft, ctx)
        ordered, layer_of = _order(draft, head)
        folded: tuple[tuple[str, str], ...] = ()
        if ctx.one_system:  # the model's template takes one system message: fold
            systems = [m for m in ordered if m.role == "system"]
            folded = tuple((layer_of[m.id], m.text) for m in systems[1:])
            ordered = fold_system(ordered)
        marks = (
            _breakpoints(ordered, layer_of, draft.window[:head])
            if ctx.policy.cache_breakpoints
            else ()
        )
        return StepResult(
            sent.but(ordered=tuple(ordered), layer_of=layer_of, breakpoints=marks, folded=folded)
        )


def _request_first(draft: Draft) -> Draft:
    """The draft as the layout places it: the newest user message, pinned once the
    window's start passed it (:func:`~ctxwarden.steps.fit._new_start`), at the head of
    the window, where it stood while the window started at it (so a window that moves
    past it sends what it sent before)."""
    at = draft.newest
    if at is None or at not in draft.pinned:
        return draft
    pinned = tuple(i for i in draft.pinned if i != at)
    return draft.but(pinned=pinned, window=(*draft.pinned_at([at]), *draft.window))


_ID = attrgetter("id")


def _order(draft: Draft, head: int) -> tuple[list[Message], dict[str, str]]:
    """The context in layout order, the layers after the window's first ``head``
    messages (0: before the pinned messages), and each message's layer."""
    layer_of: dict[str, str] = {m.id: "system" for m in draft.system}
    ordered: list[Message] = list(draft.system)
    pinned = draft.pinned_messages
    if draft.task is not None and draft.task in draft.pinned:  # the task first (steps.task):
        task = pinned.pop(draft.pinned.index(draft.task))  # the layers' changes leave it cached
        ordered.append(task)
        layer_of[task.id] = "pinned"
    facts = [(n, m) for n, m in draft.layers if n == "facts"]
    recall = [m for n, m in draft.layers if n == "recall"]
    others = [(n, m) for n, m in draft.layers if n not in ("facts", "recall")]
    ledger = [("ledger", m) for m in (draft.ledger_base, draft.ledger) if m is not None]
    after = [*others, *ledger]
    for name, m in facts if head else [*others, *facts, *ledger]:
        ordered.append(m)
        layer_of[m.id] = name
    for m in pinned:
        ordered.append(m)
        layer_of[m.id] = "pinned"
    # the window in runs (a context is hundreds of messages): "window" up to the newest
    # user message, the recall block before it, "current" from it on; the other layers
    # after the first ``head`` messages
    window = draft.window
    ids = list(map(_ID, window))
    newest = draft.history[draft.newest].id if draft.newest is not None else None
    at = ids.index(newest) if newest is not None and newest in ids else len(ids)
    cuts = {0, at, len(ids)} | ({head} if 0 < head <= len(ids) else set())
    for lo, hi in pairwise(sorted(cuts)):
        if lo == at:
            for r in recall:
                ordered.append(r)
                layer_of[r.id] = "recall"
        ordered.extend(window[lo:hi])
        layer_of.update(zip(ids[lo:hi], repeat("current" if lo >= at else "window")))
        if hi == head:
            for name, layer in after:
                ordered.append(layer)
                layer_of[layer.id] = name
    return ordered, layer_of


def _may_follow_head(draft: Draft) -> bool:
    """Whether the layers may go after the window's first message: it is a user
    message, nothing is pinned before it, and there are layers to place."""
    return (
        bool(draft.window)
        and draft.window[0].role == "user"
        and not draft.pinned
        and (draft.ledger is not None or any(n not in ("facts", "recall") for n, _ in draft.layers))
    )


def _held_head(draft: Draft, ctx: StepContext) -> int:
    """Between compactions the window's start stays, and the layers stay where the
    previous context had them: after the window's first message when a layer followed
    it there (a message sent last, or one not sent, had none after it)."""
    sent = ctx.previous.prefix
    at = draft.window[0].fingerprint[:PREFIX_DIGITS]
    i = next((k for k, d in enumerate(sent) if d == at), None)
    if i is None or i + 1 == len(sent):
        return 0
    nxt = draft.window[1].fingerprint[:PREFIX_DIGITS] if len(draft.window) > 1 else ""
    return int(sent[i + 1] != nxt)


def _cheaper_head(draft: Draft, ctx: StepContext) -> int:
    """At a compaction, 1 when the context with the layers after the window's first
    message shares more tokens with the previous context than the usual layout does
    (a build without a previous context: 0)."""
    sent = ctx.previous.prefix
    if not sent:
        return 0
    shared = []
    for head in (0, 1):
        ordered, _ = _order(draft, head)
        n = 0
        for m, d in zip(ordered, sent, strict=False):
            if m.fingerprint[:PREFIX_DIGITS] != d:
                break
            n += 1
        shared.append(ctx.total(ordered[:n]))
    if shared[1] == shared[0] and _opens_with_task(draft):  # it stays first: layers after it
        return 1
    return int(shared[1] > shared[0])


def _opens_with_task(draft: Draft) -> bool:
    """Whether the window opens with the agent's task (:mod:`~ctxwarden.steps.task`): it
    stays there, so layers placed after it leave it cached when they change."""
    at = draft.task
    return at is not None and draft.history[at].id == draft.window[0].id


def _breakpoints(
    ordered: Sequence[Message], layer_of: Mapping[str, str], head: Sequence[Message] = ()
) -> tuple[str, ...]:
    """The end of each stable part (the task the layers follow counts with them), and
    the newest message."""
    if not ordered:
        return ()
    stable = {m.id for m in head}
    last: dict[float, str] = {}
    for m in ordered:  # the stable parts come first: stop at the window
        layer = layer_of[m.id]
        group = (
            _HEAD_GROUP
            if m.id in stable
            else _BREAKPOINT_GROUP.get(layer, 1 if layer in STABLE_LAYERS else None)
        )
        if group is None:
            break
        last[group] = m.id
    marks = [last[g] for g in sorted(last)]
    marks.append(ordered[-1].id)
    unique = list(dict.fromkeys(marks))
    return tuple(unique[-MAX_CACHE_BREAKPOINTS:])
