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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ctxwarden.core.messages import Message
from ctxwarden.core.registry.cache_cost import tail_edit_pays
from ctxwarden.core.tokens.counter import REPLY_PRIMING
from ctxwarden.steps.base import (
    Action,
    Draft,
    Edit,
    StepContext,
    StepResult,
    Strategy,
    StrategyContext,
    StrategyResult,
    edit_marker,
)
from ctxwarden.steps.newest import newest_room, unanswered_results
from ctxwarden.steps.state import PREFIX_DIGITS

__all__ = ["TAIL_EDIT_ANSWERS", "EditStep", "hold_sent", "left_share", "tail_edit"]


@dataclass(frozen=True)
class EditStep:
    """Runs ``strategy`` on the window."""

    strategy: Strategy

    @property
    def name(self) -> str:
        return self.strategy.name

    @property
    def keeps_pairs(self) -> bool:
        """The strategy's ``keeps_pairs`` (truncation and masking edit results in place;
        a user's filter is checked after it unless it says so)."""
        return bool(getattr(self.strategy, "keeps_pairs", False))

    @property
    def edits_stick(self) -> bool:
        """The strategy's ``edits_stick`` (default: its masks and cuts stay)."""
        return bool(getattr(self.strategy, "edits_stick", True))

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
        edited_from = draft.edited_from
        if ctx.hold and len(result.messages) == len(draft.window):
            messages, actions, why, tail = hold_sent(
                draft, result.messages, result.actions, ctx, result.edits
            )
            result = StrategyResult(messages, actions, result.warnings, result.edits)
            if why is not None and compact is None:
                compact = f"{self.name}: {why}"
            if tail and not edited_from:
                edited_from = tail
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
        new = draft.but(
            window=tuple(result.messages), edits=edits, compact=compact, edited_from=edited_from
        )
        return StepResult(new, tuple(result.actions), tuple(result.warnings))


def hold_sent(
    draft: Draft,
    out: Sequence[Message],
    actions: Sequence[Action],
    ctx: StepContext,
    edits: Mapping[str, Edit] | None = None,
) -> tuple[list[Message], list[Action], str | None, str]:
    """Between compactions (cache-aware, :mod:`ctxwarden.pipeline.compaction`): a window
    message the previous context sent as it was is sent so again, whatever the strategy
    now makes of it (a mask landing on an older result, a cut of a result once sent
    whole), except the cuts of a *tail edit* (:func:`tail_edit`). Returns the messages,
    the actions that stand, what was held back (``None``: nothing), which the engine
    weighs against the cost of a rewrite, and the id of the first message the tail edit
    changed (``""``: none)."""
    sent = frozenset(ctx.previous.prefix)
    held = list(out)
    reverted: list[int] = []
    for i, (before, after) in enumerate(zip(draft.window, out, strict=True)):
        if after is before or after.fingerprint[:PREFIX_DIGITS] in sent:
            continue
        if before.fingerprint[:PREFIX_DIGITS] in sent:
            held[i] = before
            reverted.append(i)
    if not reverted:
        return held, list(actions), None, ""
    tail = tail_edit(draft, out, reverted, ctx, edits or {}, sent)
    for i in tail:
        held[i] = out[i]
    first = draft.window[min(tail)].id if tail else ""
    if tail:
        reverted = [i for i in reverted if i not in tail]
    gone = {draft.window[i].id for i in reverted}
    why = f"{len(reverted)} sent message(s) held as they were" if reverted else None
    return held, [a for a in actions if a.message_id not in gone], why, first


TAIL_EDIT_ANSWERS = 2
"""A result sent whole is cut between compactions only once this many assistant messages
follow it: the model answered it and went on. Coding runs (swebench-mini dev) at
8,000 tokens, the cautious prices: after 1 answer 75.0% of the full history's cost at
Anthropic prices, retention 0.9846 (values the next calls reuse, lost with the cut);
after 2, 75.9% and 0.9858; never (hold until the compaction), 77.7% and 0.9855."""


def tail_edit(
    draft: Draft,
    out: Sequence[Message],
    reverted: Sequence[int],
    ctx: StepContext,
    edits: Mapping[str, Edit],
    sent: frozenset[str],
) -> frozenset[int]:
    """Which of ``reverted`` (window positions of held-back edits, in order) are sent
    now (a *tail edit*; empty: none). A compaction rewrites the whole window; an edit near
    the end of the context rewrites only what follows it. So the newest held-back cuts —
    results sent whole while unanswered, answered :data:`TAIL_EDIT_ANSWERS` times since —
    are applied at once when what they free pays for that short rewrite at the build's
    cache prices (:func:`~ctxwarden.core.registry.cache_cost.tail_edit_pays`: the reads
    until the next compaction, and the room that puts it off, as far as the loop is
    likely to go on; room weighed at the lower of the low-water mark the policy aims at
    and the one the loop's context was last left at, :func:`left_share`). Only cuts that
    list their cut values in place: the ledger is held between compactions, so a value it
    would take must stay shown."""
    prices = ctx.prices
    # only with a growth measured since the last compaction (right after one it is only
    # estimated from the window's tokens per turn)
    if prices is None or ctx.growth <= 0 or ctx.previous.held_calls <= 0:
        return frozenset()
    window = draft.window
    rewritten = [0] * (len(window) + 1)  # what the previous context sent from i on, as now
    answers = [0] * (len(window) + 1)  # assistant messages from i on
    for i in range(len(window) - 1, -1, -1):
        was_sent = window[i].fingerprint[:PREFIX_DIGITS] in sent
        rewritten[i] = rewritten[i + 1] + (ctx.count(out[i]) if was_sent else 0)
        answers[i] = answers[i + 1] + (window[i].role == "assistant")
    calls = max(ctx.budget - ctx.previous.input_tokens, 0) / ctx.growth
    so_far = ctx.calls  # (carried in the state: a session's history is a slice)
    low_water = min(ctx.refill_ratio, left_share(ctx))
    candidates: list[int] = []
    best = 0
    freed = 0
    for i in reversed(reverted):
        if answers[i] < TAIL_EDIT_ANSWERS:
            continue  # answered once at most: held whole (its cut waits)
        marker = edits.get(window[i].id)
        if marker is None or marker.action != "truncated" or not marker.listed:
            break
        freed += ctx.count(window[i]) - ctx.count(out[i])
        candidates.append(i)
        if tail_edit_pays(rewritten[i], freed, calls, so_far, low_water, prices):
            best = len(candidates)
    return frozenset(candidates[:best])


def left_share(ctx: StepContext) -> float:
    """The share of the room above the fixed part (system prompt, tools) that the context
    was left at by the last build that was not held: the last compaction, or the first
    build of the loop. A token of room saves what a compaction rewrites per token the
    context grows between compactions, ``q / (1 - q)`` with ``q`` this share; a compaction
    aims at ``window.refill_ratio``, but where the context was left lower (a loop's first
    builds, a compaction that kept little) a compaction rewrites less, and room is worth
    less. :func:`tail_edit` weighs room at the lower of the two: the rewrite is paid for
    certain, its saving is a forecast. Swebench-mini dev as Responses-client agent loops,
    the refill ratio alone -> the lower share: @8,000 68.9% -> 68.1% of the full history
    with caching (100.0% -> 98.9% of the sawtooth window), retention .9840 -> .9855 (a
    tail edit of a result early in the context, rewriting 3,064 tokens where the
    compaction it put off rewrote 1,667); @4,000 56.4% both; tau-bench @4,000 99.5% ->
    99.8% (102.4% -> 102.6% of the sawtooth), @1,600 and @2,000 the same contexts."""
    room = ctx.budget - ctx.fixed
    if room <= 0:
        return 0.0
    return max(ctx.previous.compacted_tokens - ctx.fixed, 0) / room
