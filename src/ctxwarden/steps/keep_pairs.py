"""Pair safety (R6): a tool call and all its results travel together, or not at all.

A provider answers an orphan tool result, or a call without its results, with a 400. This
is a property of the final context, so the engine checks it after every step — a user's
own step included — with :func:`keep_pairs_whole`: a block a provider would refuse is
taken out whole, audited as ``rejected`` with the step that left it. A call still waiting
for its results (an agent mid-turn) is such a block; it is back, answered, next turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxwarden.core.messages import Message
from ctxwarden.core.pairing import all_sendable, group_blocks
from ctxwarden.steps.base import Action, Draft, StepContext, StepResult

__all__ = ["PairingStep", "keep_pairs_whole"]


def keep_pairs_whole(draft: Draft, ctx: StepContext, after: str) -> StepResult:
    """``draft`` with every block a provider would refuse taken out of the window."""
    if all_sendable(draft.window):
        return StepResult(draft)
    blocks = group_blocks(draft.window)
    kept: list[Message] = []
    actions: list[Action] = []
    rejected = set(draft.rejected)
    for b in blocks:
        if b.sendable:
            kept.extend(b.messages)
            continue
        if b.orphan:
            reason = "tool result with no matching tool call before it"
        else:
            reason = f"tool call(s) {', '.join(b.unanswered)} without results"
        if after not in ("pairing", "window"):
            reason += f" (left so by step {after!r})"
        for m in b.messages:
            rejected.add(m.id)
            actions.append(Action(m.id, "rejected", reason, ctx.count(m), 0, "pairing"))
    return StepResult(draft.but(window=tuple(kept), rejected=frozenset(rejected)), tuple(actions))


@dataclass(frozen=True)
class PairingStep:
    """Takes out of the window what a provider would refuse (see the module docstring)."""

    name: str = "pairing"

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        return keep_pairs_whole(draft, ctx, self.name)
