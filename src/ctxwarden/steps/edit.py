"""A message strategy (truncation, masking, a user's filter) run as a step of the build.

A :class:`~ctxwarden.steps.base.Strategy` sees the window's messages and returns new ones;
:class:`EditStep` gives it the :class:`~ctxwarden.steps.base.StrategyContext` it expects
(counting, the budget, the protected ids, the previous build's sticky decisions) and
records what it did as typed :class:`~ctxwarden.steps.base.Edit` markers for later
steps (the ledger reads them), so no step reads another's private message metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxwarden.core.tokens.counter import REPLY_PRIMING
from ctxwarden.steps.base import (
    Draft,
    StepContext,
    StepResult,
    Strategy,
    StrategyContext,
    edit_marker,
)
from ctxwarden.steps.newest import newest_room

__all__ = ["EditStep"]


@dataclass(frozen=True)
class EditStep:
    """Runs ``strategy`` on the window."""

    strategy: Strategy

    @property
    def name(self) -> str:
        return self.strategy.name

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        # The newest call block is kept by the fit, but may be cut or masked like any other
        # result (shrunk first); the newest user message and the window's pins (pinned,
        # critical, pin_first: protected, not anchors) are untouchable here.
        newest = draft.history[draft.newest].id if draft.newest is not None else None
        pins = draft.protected - draft.anchors
        sctx = StrategyContext(
            count=ctx.counter.count_message,
            budget=ctx.budget,
            total=lambda ms: REPLY_PRIMING + ctx.counter.total(ms),  # count_messages' tokens
            protected=pins | {newest} if newest else pins,
            sticky=ctx.previous.sticky,
            count_text=ctx.counter.count_text,
            newest_room=newest_room(draft, ctx),
        )
        result = self.strategy(list(draft.window), sctx)
        edits = dict(draft.edits)
        for action in result.actions:
            if action.action in ("masked", "truncated"):
                edits[action.message_id] = edit_marker(action.action)
        # a truncation that lists its cut values says so (a message an earlier step edited
        # and this one did not keeps the marker it has)
        cut = {a.message_id for a in result.actions if a.action == "truncated"}
        if cut:
            for m in result.messages:
                if m.id in cut and "values_listed" in m.meta and "masked_from" not in m.meta:
                    edits[m.id] = edit_marker(edits[m.id].action, listed=True)
        new = draft.but(window=tuple(result.messages), edits=edits)
        return StepResult(new, tuple(result.actions), tuple(result.warnings))
