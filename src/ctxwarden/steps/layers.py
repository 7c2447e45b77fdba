"""The summary and facts layers of a build (R7, R8): when to summarise, and with what.

``build_context(..., summarizer="offline")`` calls :func:`update_layers` before the
cascade. It runs one summarisation cycle when the policy's trigger fires, and keeps
the facts current: the offline rule-based extractor reads every new user message (it
is free); a model-backed extractor runs on the messages a cycle folds (one call for
all facts). A failing summariser never costs a message: the build falls back to the
window and the audit says why.

The summary layer a build shows is the *view* of the stored summary for the newest
user message (:func:`~ctxwarden.memory.summaries.summary_view`): with the policy's
``summary.summary_share`` set and a summariser that can focus (the offline one), the
sentences most relevant to the request, within that share of the budget (heading
included); otherwise the summary as written. With a share, ``"offline"`` stores up to
one budget of sentences (meta-summary and level-one summary together), so the view
has more to choose from than it shows, and the store stays a summary, not an index
of the whole history. The view only changes when the request changes what is most relevant:
builds for one user message (an agent's tool-call turns) share the layer, and so the
cached prefix.

The facts layer shows the standing facts. A fact the user restates with a new value at
each of the last two user messages ("My order is ORD-3", then "... ORD-11") is the
subject of the request, not a standing fact: shown at the top it would change the
cached prefix at every user turn. It is held back while it keeps changing — its value
is in the newest user message, which a build never drops — and shown again from the
first user message that does not replace it. The record keeps every value either way;
a fact stated for the first time, or corrected after a turn of rest, shows at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxwarden.errors import ConfigError
from ctxwarden.memory.facts import FactExtractor, Facts, FactSchema
from ctxwarden.memory.summaries import (
    Summarizer,
    SummaryState,
    SummaryTrigger,
    summarize_cycle,
    summary_view,
)
from ctxwarden.messages import Message
from ctxwarden.registry.usage import Usage
from ctxwarden.steps.base import Action

__all__ = [
    "SUMMARY_HEADING",
    "LayerState",
    "LayerUpdate",
    "facts_layer_text",
    "resolve_summarizer",
    "update_layers",
]

SUMMARY_HEADING = "Summary of the earlier conversation:\n"
_RESTATED_TURNS = 2  # a fact new at each of this many latest user messages is held back


@dataclass(frozen=True)
class LayerState:
    """Summary and facts as of a build; ``cut`` is where the summary's coverage ends."""

    summary: SummaryState = field(default_factory=SummaryState)
    facts: Facts = field(default_factory=Facts)
    cut: int = 0
    seen: int = 0  # messages whose user turns were read by the rule-based extractor


@dataclass(frozen=True)
class LayerUpdate:
    """One build's layer update: the new state, what it did, and the layer texts to show
    (``""`` for a layer with nothing in it)."""

    state: LayerState
    actions: list[Action]
    warnings: list[str]
    usage: Usage
    facts_text: str
    summary_text: str


def resolve_summarizer(
    spec: str | Summarizer, schema: FactSchema = None, *, store_tokens: int | None = None
) -> tuple[Summarizer, FactExtractor, bool]:
    """``(summarizer, extractor, extractor_is_free)`` for a spec or a summariser object.

    ``store_tokens`` bounds what the offline summary stores when a build shows a
    focused view of it: a third for the level-one summary, two thirds for the
    meta-summary (the offline defaults' 1:2), so the stored text stays within it.
    ``None`` keeps the offline defaults.
    """
    from ctxwarden.llm.offline import OfflineSummarizer, RuleBasedFactExtractor

    if not isinstance(spec, str):
        return spec, RuleBasedFactExtractor(), True
    if spec == "offline":
        if store_tokens is None:
            return OfflineSummarizer(), RuleBasedFactExtractor(), True
        level_one = max(1, store_tokens // 3)
        stored = OfflineSummarizer(max_tokens=level_one, meta_max_tokens=store_tokens - level_one)
        return stored, RuleBasedFactExtractor(), True
    from ctxwarden.llm.spec import parse_spec
    from ctxwarden.llm.summarizers import LLMFactExtractor, LLMSummarizer

    model = parse_spec(spec)
    if isinstance(model, str):  # pragma: no cover - parse_spec returns "offline" only
        raise ConfigError(f"unexpected summarizer spec {spec!r}")
    return LLMSummarizer(model), LLMFactExtractor(model, schema), False


def update_layers(
    history: Sequence[Message],
    previous: LayerState | None,
    *,
    spec: str | Summarizer,
    trigger: SummaryTrigger,
    schema: FactSchema,
    count: Callable[[Message], int],
    window: int,
) -> LayerUpdate:
    """Run the facts extractor and, when the trigger fires, one summary cycle; then the
    layer texts, the summary as its view for the newest user message (see the module
    docstring). ``window`` is the build's input budget."""
    from ctxwarden.llm.base import run_sync

    state = previous or LayerState()
    share = trigger.summary_share
    store = window if share is not None else None
    summarizer, extractor, free = resolve_summarizer(spec, schema, store_tokens=store)
    facts = state.facts
    actions: list[Action] = []
    warnings: list[str] = []
    usage = Usage(calls=0)
    if free:
        new_users = [m for m in history[state.seen :] if m.role == "user"]
        if new_users:
            facts = _extract_sync(extractor, new_users, facts, schema)
    result = run_sync(
        summarize_cycle(
            history,
            state=state.summary,
            facts=facts,
            trigger=trigger,
            summarizer=summarizer,
            count=count,
            window=window,
            extractor=None if free else extractor,
            schema=schema,
        )
    )
    usage = usage + result.usage
    cut = state.cut
    if result.error is not None:
        warnings.append(f"summarisation failed, kept every message: {result.error}")
    elif result.plan is not None:
        cut = result.plan.cut
        fold = result.plan.fold
        span = fold[0].id if len(fold) == 1 else f"{fold[0].id}..{fold[-1].id}"
        tokens = sum(count(m) for m in fold)
        reason = (
            f"{len(fold)} message(s) folded into the summary ({', '.join(result.plan.reasons)})"
        )
        actions.append(Action(span, "summarized", reason, tokens, 0, "summary"))
    new_state = LayerState(result.state, result.facts if not free else facts, cut, len(history))
    facts_text = facts_layer_text(new_state.facts, history)  # headed by render
    summary_text = ""
    if new_state.summary.text:
        view, left_out = summary_in_share(
            summarizer, new_state.summary.text, history, budget=window, share=share, count=count
        )
        summary_text = SUMMARY_HEADING + view if view else ""
        warnings.extend(left_out)
    return LayerUpdate(new_state, actions, warnings, usage, facts_text, summary_text)


def summary_in_share(
    summarizer: Any,
    summary: str,
    history: Sequence[Message],
    *,
    budget: int,
    share: float | None,
    count: Callable[[Message], int],
) -> tuple[str, tuple[str, ...]]:
    """``(view, warnings)``: the stored ``summary`` as a build shows it (no heading).

    With a ``share`` of the budget and a summariser that can focus, the view for the
    newest user message in ``history`` within that share, less the heading message; a
    share too small for any sentence gives ``""`` and a warning (the summary stays
    stored). Otherwise the summary as stored. Engine builds and sessions both use it,
    so the two show the same sentences."""
    room = None
    if share is not None:  # the layer (heading and message framing too) within the share
        room = int(budget * share) - count(Message.system(SUMMARY_HEADING))
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
    """The request a build answers: the newest user message's text."""
    newest = _newest_users(history, 1)
    return newest[0].text if newest else None


def _extract_sync(
    extractor: Any, messages: Sequence[Message], facts: Facts, schema: FactSchema
) -> Facts:
    extracted: Facts = extractor.extract_sync(messages, facts, schema)
    return extracted
