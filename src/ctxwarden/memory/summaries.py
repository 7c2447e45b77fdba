"""Rolling summarisation: when to summarise, where to cut, what the summary state is (R7).

Triggers (any combination; the plan is made if any fires):

- **message count** — more than ``max_messages`` unsummarised messages; the oldest are
  folded and the newest ``keep_recent`` stay verbatim (seed 000: 30 / 15);
- **tokens** — the unsummarised messages exceed ``max_tokens`` (seed 000 recommends
  reacting to tokens when tool results are heavy);
- **fill ratio** — the context would fill ``fill_ratio`` of the window (seed 004: 0.6);
- **user turns** — every ``every_user_turns`` user messages (seed 003: 10).

How much of a build's budget the summary layer takes is ``summary_share`` (None: the
summary as written). A summariser that can focus (:class:`QueryAwareSummarizer`, e.g.
the offline one) may keep a longer summary than it shows: each build of
``build_context(..., summarizer=...)`` shows the part most relevant to the newest user
message (R9), within the share — see :func:`summary_view` and
:mod:`ctxwarden.steps.layers`. The fill-ratio trigger counts the summary as shown.

The cut never separates an assistant tool call from its results (providers reject
the orphan), never folds the newest user message, and never folds system or pinned
messages: those stay where they are.

The summary is two-tier. Each cycle writes a level-one summary that merges the
previous level-one summary with the folded messages. After ``max_summaries`` cycles
the level-one summary is merged into the meta-summary (seed 004's cascade) and the
level one starts afresh, so the oldest part of the story is rewritten once every
``max_summaries`` cycles instead of every cycle — less rewriting, less drift.

Everything here is pure except :func:`summarize_cycle`, which only calls the
summariser and fact extractor it is given and turns any failure into "nothing
changed" (failure is never loss).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Protocol, runtime_checkable

from ctxwarden.core.errors import ConfigError, CtxwardenError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.memory.facts import FactExtractor, Facts, FactSchema
from ctxwarden.memory.summary_scan import block_start_at, cut_for, shown_tokens, trigger_reasons

__all__ = [
    "CycleResult",
    "QueryAwareSummarizer",
    "Summarizer",
    "SummaryPlan",
    "SummaryResult",
    "SummaryState",
    "SummaryTrigger",
    "block_start_at",
    "plan_summary",
    "summarize_cycle",
    "summary_view",
    "view_fills",
]


@dataclass(frozen=True)
class SummaryTrigger:
    """When to summarise and how much to keep. ``None`` turns a trigger off.

    Defaults: seed 000's 30 / 15 by message count and seed 004's 60 % fill (which only
    fires when the window size is known). ``keep_recent_tokens`` additionally caps the
    verbatim tail by tokens, for conversations with heavy tool results.

    ``summary_share`` is the budget split: the share of a build's input budget the
    summary layer may take (the window gets the rest). ``None`` shows the summary as
    the summariser wrote it. With a share, ``summarizer="offline"`` keeps up to one
    budget of sentences and each build shows those most relevant to the newest user
    message. Long-memory chats (people, events, dates asked about much
    later) gain from a large share; tool-heavy agents, whose next step depends on the
    newest results, from a small one.

    ``max_summary_share`` and ``max_facts_share`` bound what the layers may take of what
    the system prompt leaves of the budget, whatever they hold (a summary written long,
    hundreds of facts): the summary is cut to its newest lines, the facts ranked by how
    recently they were stated, and the audit warns. The window always keeps the rest.
    """

    max_messages: int | None = 30
    keep_recent: int = 15
    max_tokens: int | None = None
    fill_ratio: float | None = 0.6
    every_user_turns: int | None = None
    keep_recent_tokens: int | None = None
    max_summaries: int = 4
    min_fold: int = 2
    summary_share: float | None = None
    max_summary_share: float = 0.35
    max_facts_share: float = 0.2

    def __post_init__(self) -> None:
        for name in ("max_messages", "max_tokens", "every_user_turns", "keep_recent_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(
                    f"SummaryTrigger.{name} must be at least 1 (or None), got {value}"
                )
        if self.keep_recent < 0:
            raise ConfigError(f"SummaryTrigger.keep_recent must be >= 0, got {self.keep_recent}")
        if self.fill_ratio is not None and not 0 < self.fill_ratio <= 1:
            raise ConfigError(
                f"SummaryTrigger.fill_ratio is a fraction in (0, 1], got {self.fill_ratio}"
            )
        if self.summary_share is not None and not 0 < self.summary_share < 1:
            raise ConfigError(
                f"SummaryTrigger.summary_share is a fraction in (0, 1), got {self.summary_share}"
            )
        for name in ("max_summary_share", "max_facts_share"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"SummaryTrigger.{name} is a fraction in (0, 1]")
        if self.max_summaries < 1 or self.min_fold < 1:
            raise ConfigError("SummaryTrigger.max_summaries and min_fold must be at least 1")
        if not any(
            v is not None
            for v in (self.max_messages, self.max_tokens, self.fill_ratio, self.every_user_turns)
        ):
            raise ConfigError("SummaryTrigger: enable at least one trigger")
        if self.max_messages is not None and self.keep_recent >= self.max_messages:
            raise ConfigError(
                f"SummaryTrigger.keep_recent ({self.keep_recent}) must be below max_messages "
                f"({self.max_messages}), or nothing would ever be summarised"
            )


@dataclass(frozen=True)
class SummaryState:
    """The summary layer as it stands, and which messages it covers.

    ``summaries`` are the level-one summaries since the last meta-summary, oldest first;
    the last one merges the others, so only it (after the meta-summary) is shown.
    ``covered_ids`` are the messages folded so far (the layout leaves them out);
    ``as_of_id`` is the newest message that existed at the last cycle (user turns are
    counted from there); ``version`` grows with every change (optimistic writes).
    ``view`` says how builds given no summariser show it
    (:func:`~ctxwarden.pipeline.summarize.summary_viewer`): ``"offline"`` when the offline
    summariser wrote it (its sentences focused on each request), ``None`` as written.
    """

    summaries: tuple[str, ...] = ()
    meta_summary: str | None = None
    covered_ids: frozenset[str] = frozenset()
    covered_count: int = 0
    as_of_id: str | None = None
    version: int = 0
    cycles: int = 0
    view: str | None = None

    @property
    def text(self) -> str:
        """What goes in the context: the meta-summary, then the current level-one summary."""
        parts = [
            p for p in (self.meta_summary, self.summaries[-1] if self.summaries else None) if p
        ]
        return "\n\n".join(parts)

    @cached_property
    def covered_key(self) -> str:
        """A digest of ``covered_ids`` (``""`` for none), made once per state: what a
        build's carried trigger sums (:mod:`~ctxwarden.memory.summary_scan`) depend on."""
        if not self.covered_ids:
            return ""
        digest = hashlib.sha1(usedforsecurity=False)
        for i in sorted(self.covered_ids):
            digest.update(i.encode("utf-8", "surrogatepass") + b"\x00")
        return digest.hexdigest()

    @property
    def level_one(self) -> str | None:
        return self.summaries[-1] if self.summaries else None

    def needs_meta(self, max_summaries: int) -> bool:
        return len(self.summaries) >= max_summaries

    def apply(self, plan: SummaryPlan, text: str) -> SummaryState:
        """The state after the plan's messages were folded into the new summary ``text``."""
        return replace(
            self,
            summaries=(*self.summaries, text),
            covered_ids=self.covered_ids | {m.id for m in plan.fold},
            covered_count=self.covered_count + len(plan.fold),
            as_of_id=plan.as_of_id,
            version=self.version + 1,
            cycles=self.cycles + 1,
        )

    def with_meta(self, text: str) -> SummaryState:
        """Level-one summaries folded into the meta-summary ``text``."""
        return replace(self, summaries=(), meta_summary=text, version=self.version + 1)


@dataclass(frozen=True)
class SummaryPlan:
    """Where to cut: ``fold`` goes into the summary, ``keep`` stays verbatim (in order).

    ``cut`` is the index in the conversation before which every unsummarised,
    non-system, non-pinned message is folded; ``reasons`` say which triggers fired.
    """

    fold: tuple[Message, ...]
    keep: tuple[Message, ...]
    cut: int
    reasons: tuple[str, ...]
    as_of_id: str | None = None


def _held(
    messages: Sequence[Message],
    live: Sequence[int],
    count: Callable[[Message], int],
    previous: SummaryState,
) -> int:
    """Tokens of the messages that are neither live nor covered: the system prompt and
    the pinned messages (folding cannot reduce them)."""
    live_set = set(live)
    return sum(
        count(m)
        for i, m in enumerate(messages)
        if i not in live_set and m.id not in previous.covered_ids
    )


def _fill_fixed(
    trigger: SummaryTrigger,
    messages: Sequence[Message],
    live: Sequence[int],
    count: Callable[[Message], int],
    window: int,
    previous: SummaryState,
    fills: bool = False,
) -> int:
    """Tokens the fill ratio counts that folding cannot reduce: the system prompt, pinned
    messages, and the summary as shown."""
    return _held(messages, live, count, previous) + shown_tokens(
        trigger, count, window, previous, fills
    )


def _fired(
    trigger: SummaryTrigger,
    messages: Sequence[Message],
    live: Sequence[int],
    count: Callable[[Message], int],
    window: int | None,
    previous: SummaryState,
    fills: bool = False,
) -> list[str]:
    def turns() -> int:
        start = 0
        if previous.as_of_id is not None:
            ids = [m.id for m in messages]
            start = ids.index(previous.as_of_id) + 1 if previous.as_of_id in ids else 0
        return sum(1 for i in live if i >= start and messages[i].role == "user")

    return trigger_reasons(
        trigger,
        len(live),
        lambda: sum(count(messages[i]) for i in live),
        lambda: _fill_fixed(trigger, messages, live, count, window or 0, previous, fills),
        window,
        turns,
    )


def plan_summary(
    messages: Sequence[Message],
    trigger: SummaryTrigger,
    count: Callable[[Message], int],
    window: int | None = None,
    previous: SummaryState | None = None,
    *,
    fills: bool = False,
) -> SummaryPlan | None:
    """The messages to fold and the ones to keep, or ``None`` when no trigger fires
    (or firing would fold fewer than ``trigger.min_fold`` messages).

    ``messages`` is the whole conversation, including what earlier cycles covered;
    ``count`` gives one message's tokens; ``window`` is the model's context window
    (or the input budget) the fill ratio is measured against. ``fills``: builds show a
    view of the summary that fills what the messages leave (:func:`view_fills`), so the
    fill ratio does not count it.
    """
    if (
        window is None
        and trigger.fill_ratio is not None
        and trigger.max_messages is None
        and trigger.max_tokens is None
        and trigger.every_user_turns is None
    ):
        raise ConfigError("a fill-ratio trigger needs the window size (window=...)")
    prev = previous or SummaryState()
    msgs = list(messages)
    live = [
        i
        for i, m in enumerate(msgs)
        if m.role != "system" and not m.pinned and m.id not in prev.covered_ids
    ]
    if not live:
        return None
    reasons = _fired(trigger, msgs, live, count, window, prev, fills)
    if not reasons:
        return None

    users = [i for i, m in enumerate(msgs) if m.role == "user"]
    cut = cut_for(
        trigger,
        msgs,
        reasons,
        len(live),
        live[0],
        lambda: reversed(live),
        count,
        window,
        lambda: _fill_fixed(trigger, msgs, live, count, window or 0, prev, fills),
        users[-1] if users else -1,
    )

    fold = tuple(msgs[i] for i in live if i < cut)
    if len(fold) < trigger.min_fold:
        return None
    folded = {m.id for m in fold}
    keep = tuple(m for m in msgs if m.id not in folded and m.id not in prev.covered_ids)
    return SummaryPlan(fold, keep, cut, tuple(reasons), as_of_id=msgs[-1].id)


# -- summarisers and the cycle ----------------------------------------------------------------


@dataclass(frozen=True)
class SummaryResult:
    text: str
    usage: Usage = field(default_factory=lambda: Usage(calls=0))


class Summarizer(Protocol):
    """Writes summaries: offline (extractive) or through a model."""

    async def summarize(
        self, messages: Sequence[Message], previous: str | None = None
    ) -> SummaryResult:
        """A summary of ``messages`` merged with ``previous`` (the summary so far)."""
        ...

    async def merge(self, summaries: Sequence[str]) -> SummaryResult:
        """One summary from several, oldest first (the meta-summary step)."""
        ...


@runtime_checkable
class QueryAwareSummarizer(Summarizer, Protocol):
    """A summariser that also takes the current request (``query``, the newest user
    message) and can show a stored summary focused on it.

    Optional on purpose: every :class:`Summarizer` still works everywhere; code that
    has a request checks ``isinstance(s, QueryAwareSummarizer)`` (or calls
    :func:`summary_view`) and passes it only then.
    """

    async def summarize(
        self, messages: Sequence[Message], previous: str | None = None, query: str | None = None
    ) -> SummaryResult:
        """As :meth:`Summarizer.summarize`, ranked also by relevance to ``query``."""
        ...

    def focus(self, summary: str, query: str | None, max_tokens: int) -> SummaryResult:
        """The part of a stored ``summary`` most relevant to ``query``, within
        ``max_tokens``, with nothing rewritten (no model call)."""
        ...


def view_of(summarizer: object) -> str | None:
    """How a summary ``summarizer`` wrote is shown by builds that are given none: the
    offline summariser's as a focused view (its ``summary_view``, ``"offline"``), any
    other as written (see :func:`ctxwarden.pipeline.summarize.summary_viewer`)."""
    view = getattr(type(summarizer), "summary_view", None)
    return view if isinstance(view, str) else None


def view_fills(trigger: SummaryTrigger, summarizer: object) -> bool:
    """Whether builds show the summary as a view that fills what the rest of the context
    leaves: no ``summary_share`` set and a summariser that can focus (the offline one).
    Then the budget is used whatever its size, with no split to choose."""
    return (
        trigger.summary_share is None
        and summarizer is not None  # (a protocol's isinstance costs tens of µs, even for None)
        and isinstance(summarizer, QueryAwareSummarizer)
    )


def summary_view(
    summarizer: Summarizer | None, summary: str, query: str | None, max_tokens: int | None
) -> str:
    """The summary layer one build shows: ``summary`` focused on ``query`` within
    ``max_tokens`` when the summariser can focus, else ``summary`` as written (a
    model's summary is already as long as it was asked to be)."""
    if max_tokens is None or not summary or not isinstance(summarizer, QueryAwareSummarizer):
        return summary
    return summarizer.focus(summary, query, max_tokens).text


@dataclass(frozen=True)
class CycleResult:
    """What one cycle did. On failure ``error`` is set and state and facts are unchanged."""

    state: SummaryState
    facts: Facts
    plan: SummaryPlan | None = None
    usage: Usage = field(default_factory=lambda: Usage(calls=0))
    meta: bool = False
    error: str | None = None

    @property
    def summarized(self) -> bool:
        return self.plan is not None and self.error is None


async def summarize_cycle(
    messages: Sequence[Message],
    *,
    state: SummaryState,
    facts: Facts,
    trigger: SummaryTrigger,
    summarizer: Summarizer,
    count: Callable[[Message], int],
    window: int | None = None,
    extractor: FactExtractor | None = None,
    schema: FactSchema = None,
    step_timeout: float | None = None,
) -> CycleResult:
    """Plan, extract facts from what leaves, summarise, and cascade to a meta-summary.

    Facts are extracted first, from the messages about to be folded, so they are exact
    whatever the summary does with them. Any failure (a provider error, an empty
    answer, unparseable facts, or a call longer than ``step_timeout`` seconds) returns
    the old state and facts with ``error`` set: every message stays, and the next
    trigger tries again.
    """
    plan = plan_summary(
        messages, trigger, count, window, state, fills=view_fills(trigger, summarizer)
    )
    if plan is None:
        return CycleResult(state, facts)
    usage = Usage(calls=0)
    try:
        new_facts = facts
        if extractor is not None:
            new_facts, used = await asyncio.wait_for(
                _extract(extractor, plan.fold, facts, schema), step_timeout
            )
            usage = usage + used
        result = await asyncio.wait_for(
            summarizer.summarize(plan.fold, state.level_one), step_timeout
        )
    except (CtxwardenError, TimeoutError) as exc:
        return CycleResult(state, facts, plan, usage, error=_describe(exc))
    usage = usage + result.usage
    if not result.text.strip():
        return CycleResult(state, facts, plan, usage, error="the summariser returned nothing")
    new_state = replace(state.apply(plan, result.text), view=view_of(summarizer))
    if not new_state.needs_meta(trigger.max_summaries):
        return CycleResult(new_state, new_facts, plan, usage)
    parts = [p for p in (new_state.meta_summary, new_state.level_one) if p]
    try:
        meta = await asyncio.wait_for(summarizer.merge(parts), step_timeout)
    except (CtxwardenError, TimeoutError) as exc:  # the level-one summary stays in place
        return CycleResult(new_state, new_facts, plan, usage, error=f"meta: {_describe(exc)}")
    usage = usage + meta.usage
    if not meta.text.strip():
        return CycleResult(new_state, new_facts, plan, usage, error="meta-summary came back empty")
    return CycleResult(new_state.with_meta(meta.text), new_facts, plan, usage, meta=True)


async def _extract(
    extractor: FactExtractor, fold: Sequence[Message], facts: Facts, schema: FactSchema
) -> tuple[Facts, Usage]:
    with_usage = getattr(extractor, "extract_with_usage", None)
    if with_usage is not None:  # model-backed extractors report their tokens
        found, used = await with_usage(fold, facts, schema)
        return found, used
    return await extractor.extract(fold, facts, schema), Usage(calls=0)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"
