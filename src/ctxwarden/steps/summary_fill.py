"""The summary view takes what the built context leaves (R7, R10).

The layers step sizes a filling summary view (:func:`~ctxwarden.steps.layers.fill_room`)
before the window and the ledger exist, so it reserves the ledger's whole cap and
assumes the window shows every message the summary does not cover. What those parts
really take is known only once they are placed: a ledger of a chat's dates and names
often fills half its cap, and whatever the reservation did not use is left unsent.

This step runs after the fit and the eviction, when every part is final: if the context
is under budget and the summary layer is a view that fills (no ``summary.summary_share``
and a summariser that can focus), the view is made again for the same request with the
room it had plus what is left. The new layer is kept only when it fits that room, so the
context stays within budget; the window, ledger and other layers are unchanged. A build
with no such view (an agent loop without a focusing summariser) is returned as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxwarden.core.messages import Message
from ctxwarden.memory.summaries import view_fills
from ctxwarden.steps.base import Draft, StepContext, StepResult, system_block
from ctxwarden.steps.evict import context_tokens
from ctxwarden.steps.layers import SUMMARY_HEADING, summary_in_share

__all__ = ["SummaryFillStep"]

_SUMMARY_ID = "ctxwarden:summary"
_MIN_SLACK = 8  # fewer tokens left than this hold no sentence worth a new view


@dataclass(frozen=True)
class SummaryFillStep:
    """Grows a filling summary view into the room the placed context left unused."""

    name: str = "summary_fill"

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        state = ctx.layer_state
        if state is None or not state.summary.text:
            return StepResult(draft)
        if not view_fills(ctx.policy.summary, ctx.summarizer):
            return StepResult(draft)
        at = next((i for i, (n, _) in enumerate(draft.layers) if n == "summary"), None)
        if at is None:
            return StepResult(draft)
        slack = ctx.budget - context_tokens(draft, ctx)
        if slack < _MIN_SLACK:
            return StepResult(draft)
        old = draft.layers[at][1]
        room = ctx.count(old) + slack
        grown = _view_within(draft, ctx, state.summary.text, room)
        if grown is None or ctx.count(grown) <= ctx.count(old):
            return StepResult(draft)
        layers = list(draft.layers)
        layers[at] = ("summary", grown)
        return StepResult(draft.but(layers=tuple(layers)))


def _view_within(draft: Draft, ctx: StepContext, summary: str, room: int) -> Message | None:
    """The summary layer for the draft's request within ``room`` tokens, or ``None``.
    The view's own room is the layer's less the heading; the layer's framing can count a
    token or two over it, so one shorter try follows an overshoot."""
    fill = room
    for _ in range(2):
        view, _warnings = summary_in_share(
            ctx.summarizer,
            summary,
            draft.history,
            budget=ctx.budget,
            share=None,
            count=ctx.count,
            fill=fill,
        )
        if not view:
            return None
        layer = system_block(SUMMARY_HEADING + view, _SUMMARY_ID)
        over = ctx.count(layer) - room
        if over <= 0:
            return layer
        fill -= over
    return None
