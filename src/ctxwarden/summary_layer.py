"""The summary and facts layers of a build (R7, R8): when to summarise, and with what.

``build_context(..., summarizer="offline")`` calls :func:`update_layers` before the
cascade. It runs one summarisation cycle when the policy's trigger fires, and keeps
the facts current: the offline rule-based extractor reads every new user message (it
is free); a model-backed extractor runs on the messages a cycle folds (one call for
all facts). A failing summariser never costs a message: the build falls back to the
window and the audit says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .facts import FactExtractor, Facts, FactSchema
from .messages import Message
from .strategies.base import Action
from .summarize import Summarizer, SummaryState, SummaryTrigger, summarize_cycle
from .usage import Usage

__all__ = ["LayerState", "resolve_summarizer", "update_layers"]


@dataclass(frozen=True)
class LayerState:
    """Summary and facts as of a build; ``cut`` is where the summary's coverage ends."""

    summary: SummaryState = field(default_factory=SummaryState)
    facts: Facts = field(default_factory=Facts)
    cut: int = 0
    seen: int = 0  # messages whose user turns were read by the rule-based extractor


def resolve_summarizer(
    spec: str | Summarizer, schema: FactSchema = None
) -> tuple[Summarizer, FactExtractor, bool]:
    """``(summarizer, extractor, extractor_is_free)`` for a spec or a summariser object."""
    from .llm.offline import OfflineSummarizer, RuleBasedFactExtractor

    if not isinstance(spec, str):
        return spec, RuleBasedFactExtractor(), True
    if spec == "offline":
        return OfflineSummarizer(), RuleBasedFactExtractor(), True
    from .llm.spec import parse_spec
    from .llm.summarizers import LLMFactExtractor, LLMSummarizer

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
) -> tuple[LayerState, list[Action], list[str], Usage]:
    """Run the facts extractor and, when the trigger fires, one summary cycle."""
    from .llm.base import run_sync

    state = previous or LayerState()
    summarizer, extractor, free = resolve_summarizer(spec, schema)
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
    return new_state, actions, warnings, usage


def _extract_sync(
    extractor: Any, messages: Sequence[Message], facts: Facts, schema: FactSchema
) -> Facts:
    extracted: Facts = extractor.extract_sync(messages, facts, schema)
    return extracted
