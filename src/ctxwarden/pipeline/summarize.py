"""Summarising outside the build (R7, R8): one cycle over the history, its result a state.

The build never calls a model: it shows the summary and facts it is given and reports
when a summary is due (``audit.summary_due``). This module is the call that makes one:
:func:`summarize_history` (and ``_sync``) for a history held in memory, and what
:meth:`ctxwarden.Session.summarize` runs between its read and write transactions. Both
take the same summarisers: a spec (``"offline"``, ``"openai:gpt-4o-mini"``) or an object.

A cycle keeps the facts current — the offline rule-based extractor reads every user
message not read before (it is free); a model-backed extractor reads the messages a
cycle folds (one call for all facts) — and, when the policy's trigger fires, folds the
older messages into the rolling summary (a meta-summary when they pile up). A failing
summariser costs no message: the old layers stay and the result says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxwarden.core.errors import ConfigError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.memory.facts import FactExtractor, FactSchema
from ctxwarden.memory.layer_state import LayerState
from ctxwarden.memory.summaries import Summarizer, SummaryState, SummaryTrigger, summarize_cycle
from ctxwarden.steps.base import Action
from ctxwarden.telemetry import SUMMARIZE_SPAN, layer_update_attributes, traced_async

__all__ = ["LayerUpdate", "resolve_summarizer", "summarize_history", "summarize_history_sync"]


@dataclass(frozen=True)
class LayerUpdate:
    """One cycle's outcome: the new layer state, what it did and what it cost."""

    state: LayerState
    actions: tuple[Action, ...] = ()
    warnings: tuple[str, ...] = ()
    usage: Usage = field(default_factory=lambda: Usage(calls=0))
    folded: tuple[Message, ...] = ()
    meta: bool = False
    error: str | None = None


STORE_BUDGETS = 4
"""How many input budgets of sentences the offline summary keeps. One is too few once
the view fills the budget (it would show nearly all of them: no choice by relevance);
LoCoMo dev at 4,000 tokens, fed session by session: one budget 0.550 answer recall, two
0.592, four 0.626, six 0.626 (the view's choice, not the store, limits it from there)."""


def resolve_summarizer(
    spec: str | Summarizer,
    schema: FactSchema = None,
    *,
    store_tokens: int | None = None,
    timeout: float | None = None,
) -> tuple[Summarizer, FactExtractor, bool]:
    """``(summarizer, extractor, extractor_is_free)`` for a spec or a summariser object.

    ``store_tokens`` is the input budget the builds have: the offline summary stores
    :data:`STORE_BUDGETS` times it (a third for the level-one summary, two thirds for the
    meta-summary), so the view a build shows for the newest request, however much of the
    budget it fills, is a choice among more sentences than it can show.
    ``timeout`` (seconds) is passed to a provider spec's client."""
    from ctxwarden.llm.offline import OfflineSummarizer, RuleBasedFactExtractor

    if not isinstance(spec, str):
        return spec, RuleBasedFactExtractor(), True
    if spec == "offline":
        if store_tokens is None:
            return OfflineSummarizer(), RuleBasedFactExtractor(), True
        store = STORE_BUDGETS * store_tokens
        level_one = max(1, store // 3)
        stored = OfflineSummarizer(max_tokens=level_one, meta_max_tokens=store - level_one)
        return stored, RuleBasedFactExtractor(), True
    from ctxwarden.llm.spec import parse_spec
    from ctxwarden.llm.summarizers import LLMFactExtractor, LLMSummarizer

    model = parse_spec(spec, timeout=timeout)
    if isinstance(model, str):  # pragma: no cover - parse_spec returns "offline" only
        raise ConfigError(f"unexpected summarizer spec {spec!r}")
    return LLMSummarizer(model), LLMFactExtractor(model, schema), False


def summary_viewer(summarizer: Any, state: SummaryState | None) -> Any:
    """The one decision of how the summary is laid out, and so what a fold plans for
    (:func:`~ctxwarden.memory.summaries.view_fills`): the summariser a build is given
    (the spec ``"offline"`` as the offline summariser; a provider spec cannot focus and is
    not resolved), else the one the stored summary says wrote it
    (:attr:`~ctxwarden.memory.summaries.SummaryState.view`). ``build_context``,
    ``Session.build`` (the proxy's build, whose summary-due signal a worker acts on) and
    the summary cycle all take it from here, so one summary is shown the same way on
    every path, whichever of them wrote it."""
    if summarizer is None and state is not None and state.view == "offline":
        summarizer = "offline"
    if summarizer == "offline":
        from ctxwarden.llm.offline import OfflineSummarizer

        return OfflineSummarizer()
    return summarizer


def cycle_summarizer(
    spec: str, resolved: tuple[Summarizer, FactExtractor, bool]
) -> tuple[str | Summarizer, FactExtractor | None]:
    """What a long-lived process (the worker, ``serve --summarizer``) passes to
    :meth:`ctxwarden.Session.summarize` for its configured ``spec``: the spec
    ``"offline"`` itself, so each cycle sizes the offline summary for the budget it is
    measured against as ``build_context(summarizer="offline")`` does (``resolved``
    once, without a budget, would store another size); a provider spec's resolved
    summariser and extractor (one client per process)."""
    if spec == "offline":
        return spec, None
    return resolved[0], resolved[1]


@traced_async(SUMMARIZE_SPAN, layer_update_attributes)
async def summarize_history(
    history: Sequence[Message],
    previous: LayerState | None,
    *,
    summarizer: str | Summarizer,
    trigger: SummaryTrigger | None = None,
    count: Callable[[Message], int] | None = None,
    window: int | None = None,
    schema: FactSchema = None,
    resolved: tuple[Summarizer, FactExtractor, bool] | None = None,
    model: str = "gpt-4o",
) -> LayerUpdate:
    """Read new user messages for facts and, when the trigger fires, run one summary
    cycle over ``history`` (see the module docstring). ``previous`` is the layers so far
    (``built.state.layers``); ``trigger`` defaults to :class:`SummaryTrigger` ();
    ``window`` is the input budget the fill-ratio trigger is measured against (off when
    ``None``); ``count`` counts one message (default: ``model``'s counter)."""
    from ctxwarden.core.messages import check_message_list
    from ctxwarden.core.tokens.counter import TokenCounter
    from ctxwarden.pipeline.inputs import (
        check_budget_argument,
        check_layers_argument,
        check_summarizer_argument,
    )

    # every argument checked before any work, whether or not the trigger fires
    check_message_list(history, "history")
    check_layers_argument(previous, "previous")
    check_summarizer_argument(summarizer)
    check_budget_argument(window, "window")
    if trigger is not None and not isinstance(trigger, SummaryTrigger):
        raise ConfigError(f"trigger must be a SummaryTrigger or None, got {type(trigger).__name__}")
    trigger = trigger or SummaryTrigger()
    count = count or TokenCounter.for_model(model).count_message
    state = previous or LayerState()
    store = window  # the offline summariser keeps one budget; builds show a view
    chosen, extractor, free = resolved or resolve_summarizer(summarizer, schema, store_tokens=store)
    facts = state.facts
    if free:
        new_users = [m for m in history[state.seen :] if m.role == "user"]
        if new_users:
            facts = await extractor.extract(new_users, facts, schema)
    result = await summarize_cycle(
        history,
        state=state.summary,
        facts=facts,
        trigger=trigger,
        summarizer=chosen,
        count=count,
        window=window,
        extractor=None if free else extractor,
        schema=schema,
    )
    if result.error is not None and result.state.cycles == state.summary.cycles:
        kept = LayerState(state.summary, facts if free else state.facts, state.cut, len(history))
        warning = f"summarisation failed, kept every message: {result.error}"
        return LayerUpdate(kept, (), (warning,), result.usage, error=result.error)
    if result.plan is None:
        return LayerUpdate(LayerState(state.summary, facts, state.cut, len(history)))
    fold = result.plan.fold
    span = fold[0].id if len(fold) == 1 else f"{fold[0].id}..{fold[-1].id}"
    reason = f"{len(fold)} message(s) folded into the summary ({', '.join(result.plan.reasons)})"
    action = Action(span, "summarized", reason, sum(count(m) for m in fold), 0, "summary")
    new_facts = facts if free else result.facts
    new_state = LayerState(result.state, new_facts, result.plan.cut, len(history))
    warnings = () if result.error is None else (f"meta-summary failed: {result.error}",)
    return LayerUpdate(
        new_state, (action,), warnings, result.usage, fold, result.meta, result.error
    )


def summarize_history_sync(
    history: Sequence[Message], previous: LayerState | None, **kw: object
) -> LayerUpdate:
    """:func:`summarize_history` for callers without an event loop."""
    from ctxwarden.llm.base import run_sync

    update: LayerUpdate = run_sync(summarize_history(history, previous, **kw))  # type: ignore[arg-type]
    return update
