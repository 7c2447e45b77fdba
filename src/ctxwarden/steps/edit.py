"""A message strategy (truncation, masking, a user's filter) run as a step of the build.

A :class:`~ctxwarden.steps.base.Strategy` sees the window's messages and returns new ones;
:class:`EditStep` gives it the :class:`~ctxwarden.steps.base.StrategyContext` it expects
(counting, the budget, the protected ids, the previous build's sticky decisions) and
records what it did as typed :class:`~ctxwarden.steps.base.Edit` markers for later
steps (the ledger reads them): one per masked or truncated message, or the one the
strategy gives (``StrategyResult.edits``: a truncation that lists its cut values says
so), so no step reads another's private message metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import REPLY_PRIMING
from ctxwarden.steps.base import (
    Action,
    Draft,
    StepContext,
    StepResult,
    Strategy,
    StrategyContext,
    StrategyResult,
    edit_marker,
)
from ctxwarden.steps.newest import newest_room, unanswered_results

__all__ = ["EditStep"]


@dataclass(frozen=True)
class EditStep:
    """Runs ``strategy`` on the window."""

    strategy: Strategy

    @property
    def name(self) -> str:
        return self.strategy.name

    @property
    def sent_tokens(self) -> Callable[[Message, int], int] | None:
        """The strategy's ``sent_tokens(message, tokens)``, when it foresees the tokens a
        message is sent at once it ran (the truncation does); ``None`` otherwise."""
        found = getattr(self.strategy, "sent_tokens", None)
        return found if callable(found) else None

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
            # only a window with results not answered yet has use for their room, which
            # costs a walk of the window to measure (twice a build: truncate and mask)
            newest_room=newest_room(draft, ctx) if unanswered_results(draft.window) else None,
            tool_rules=ctx.policy.tools or None,
            compacting=ctx.compacting,
        )
        result = self.strategy(list(draft.window), sctx)
        compact = draft.compact
        if ctx.hold and len(result.messages) == len(draft.window):
            messages, actions, why = hold_sent(draft, result.messages, result.actions, ctx)
            result = StrategyResult(messages, actions, result.warnings, result.edits)
            if why is not None and compact is None:
                compact = f"{self.name}: {why}"
        edits = dict(draft.edits)
        for action in result.actions:
            if action.action in ("masked", "truncated"):
                edits[action.message_id] = edit_marker(action.action)
        # the strategy's own markers, for the messages whose actions stand (a held build
        # sends some as they were; a message an earlier step edited and this one did not
        # keeps the marker it has)
        if result.edits:
            stand = {a.message_id for a in result.actions}
            for message_id, marker in result.edits.items():
                if message_id in stand:
                    edits[message_id] = marker
        new = draft.but(window=tuple(result.messages), edits=edits, compact=compact)
        return StepResult(new, tuple(result.actions), tuple(result.warnings))


def hold_sent(
    draft: Draft, out: Sequence[Message], actions: Sequence[Action], ctx: StepContext
) -> tuple[list[Message], list[Action], str | None]:
    """Between compactions (cache-aware, :mod:`ctxwarden.pipeline.compaction`): a window
    message the previous context sent as it was is sent so again, whatever the strategy
    now makes of it (a mask landing on an older result, a cut of a result once sent
    whole). Returns the messages, the actions that stand, and what was held back
    (``None``: nothing), which the engine weighs against the cost of a rewrite."""
    from ctxwarden.steps.state import PREFIX_DIGITS

    sent = frozenset(ctx.previous.prefix)
    held = list(out)
    reverted: list[str] = []
    for i, (before, after) in enumerate(zip(draft.window, out, strict=True)):
        if after is before or after.fingerprint[:PREFIX_DIGITS] in sent:
            continue
        if before.fingerprint[:PREFIX_DIGITS] in sent:
            held[i] = before
            reverted.append(before.id)
    if not reverted:
        return held, list(actions), None
    gone = set(reverted)
    return (
        held,
        [a for a in actions if a.message_id not in gone],
        f"{len(reverted)} sent message(s) held as they were",
    )
