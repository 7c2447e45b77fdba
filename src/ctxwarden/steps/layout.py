"""The layout (R10): stable parts first, so provider caches reuse the prefix::

    [system prompt][facts][ledger][summary][other layers][pinned][window ...]
        [recall][newest user message ...]

The recall layer (:mod:`~ctxwarden.steps.recall_relevant`) follows the query it answers: it sits
right before the newest user message, so a new question changes only the tail and the
window before it stays cached.

and the Anthropic cache breakpoints (at most four): the end of the system prompt, of the
layers, of the pinned messages, and the newest message.

For a model whose chat template takes one system message (the registry's
``system_messages = "one"``) the layers are folded into the system prompt, after it
(:mod:`~ctxwarden.steps.fold`); the audit still gives each layer its tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from ctxwarden.core.messages import Message
from ctxwarden.formats.anthropic import MAX_CACHE_BREAKPOINTS
from ctxwarden.steps.base import Draft, StepContext, StepResult
from ctxwarden.steps.fold import fold_system

__all__ = ["STABLE_LAYERS", "LayoutStep"]

STABLE_LAYERS = frozenset({"system", "facts", "ledger", "summary", "pinned"})
# Anthropic cache breakpoints go at the end of each of these groups of stable layers.
_BREAKPOINT_GROUP = {"system": 0, "facts": 1, "ledger": 1, "summary": 1, "pinned": 2}


@dataclass(frozen=True)
class LayoutStep:
    """Orders the draft's parts into the context to send."""

    name: str = "layout"
    keeps_pairs: ClassVar[bool] = True  # orders the blocks it is given
    lays_out: ClassVar[bool] = True  # run again after the engine's final pair check

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        layer_of: dict[str, str] = {m.id: "system" for m in draft.system}
        ordered: list[Message] = list(draft.system)
        facts = [(n, m) for n, m in draft.layers if n == "facts"]
        recall = [m for n, m in draft.layers if n == "recall"]
        others = [(n, m) for n, m in draft.layers if n not in ("facts", "recall")]
        ledger = [("ledger", m) for m in (draft.ledger_base, draft.ledger) if m is not None]
        for name, m in [*facts, *ledger, *others]:
            ordered.append(m)
            layer_of[m.id] = name
        for m in draft.pinned_messages:
            ordered.append(m)
            layer_of[m.id] = "pinned"
        newest = draft.history[draft.newest].id if draft.newest is not None else None
        current = False
        for m in draft.window:
            if not current and m.id == newest:
                for r in recall:
                    ordered.append(r)
                    layer_of[r.id] = "recall"
            current = current or m.id == newest
            ordered.append(m)
            layer_of[m.id] = "current" if current else "window"
        folded: tuple[tuple[str, str], ...] = ()
        if ctx.one_system:  # the model's template takes one system message: fold
            systems = [m for m in ordered if m.role == "system"]
            folded = tuple((layer_of[m.id], m.text) for m in systems[1:])
            ordered = fold_system(ordered)
        marks = _breakpoints(ordered, layer_of) if ctx.policy.cache_breakpoints else ()
        return StepResult(
            draft.but(ordered=tuple(ordered), layer_of=layer_of, breakpoints=marks, folded=folded)
        )


def _breakpoints(ordered: Sequence[Message], layer_of: Mapping[str, str]) -> tuple[str, ...]:
    """The end of each stable part, and the newest message."""
    if not ordered:
        return ()
    last: dict[int, str] = {}
    for m in ordered:  # the stable parts come first: stop at the window
        group = _BREAKPOINT_GROUP.get(
            layer_of[m.id], 1 if layer_of[m.id] in STABLE_LAYERS else None
        )
        if group is None:
            break
        last[group] = m.id
    marks = [last[g] for g in sorted(last)]
    marks.append(ordered[-1].id)
    unique = list(dict.fromkeys(marks))
    return tuple(unique[-MAX_CACHE_BREAKPOINTS:])
