"""Shared measuring tools for the bench: token series, tables, cache and cost, windows.

Every scenario produces, per strategy, the list of messages sent at each turn. From
those lists alone this module computes what the report shows:

* input tokens per turn, counted exactly (OpenAI models) by one shared
  :class:`~ctxwarden.core.tokens.counter.TokenCounter`, whose per-message cache makes a 50-turn run
  cost O(new messages) per turn;
* the seeds' "% of Basic" and "reduction vs Basic" tables at chosen turns;
* the prompt-cache share: for each pair of consecutive calls the longest common prefix,
  first in whole messages (a message is either byte-identical or not), then in tokens
  (the sum of those messages' counts, plus the tool definitions that precede them). Those
  tokens are what a provider's prompt cache serves as cache reads;
* dollars from the model registry: plain input price, and the effective cost with cache
  reads priced as cached input (other input at the plain price), plus summariser calls.

It also holds the plain pair-safe "newest that fit" window the real-trace baselines use,
and ours (:class:`OursStrategy`), driven turn by turn. Summarisers live in
:mod:`ctxwarden_bench.summarizers`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ctxwarden.core.messages import Message
from ctxwarden.core.pairing import group_blocks
from ctxwarden.core.registry.usage import Usage
from ctxwarden.core.tokens.counter import REPLY_PRIMING, TokenCounter
from ctxwarden.tune.measures import common_prefix_tokens, plain_window
from ctxwarden_bench.summarizers import Account, BenchSummarizer, Summarizer, get_summarizer

if TYPE_CHECKING:
    from ctxwarden.core.registry.cache_cost import CallPrefix

__all__ = [
    "EngineStrategy",
    "OursStrategy",
    "StrategyRun",
    "cache_calls",
    "common_prefix_messages",
    "common_prefix_tokens",
    "plain_window",
    "price_run",
    "price_strategy",
    "reduction_table",
    "sawtooth_window",
]

Tools = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class StrategyRun:
    """What one strategy sent at every turn of one scenario, and what that cost."""

    name: str
    input_tokens_per_turn: list[int]
    cached_tokens_per_turn: list[int]
    summarizer_usage: Usage = field(default_factory=lambda: Usage(calls=0))
    cost_usd: float = 0.0
    effective_cost_usd: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def total_input_tokens(self) -> int:
        return sum(self.input_tokens_per_turn)

    def to_json(self) -> dict[str, Any]:
        return {
            "input_tokens_per_turn": list(self.input_tokens_per_turn),
            "total_input_tokens": self.total_input_tokens,
            "cached_tokens_per_turn": list(self.cached_tokens_per_turn),
            "summarizer_calls": self.summarizer_usage.calls,
            "summarizer_input_tokens": self.summarizer_usage.input_tokens,
            "summarizer_output_tokens": self.summarizer_usage.output_tokens,
            "cost_usd": round(self.cost_usd, 6),
            "effective_cost_usd": round(self.effective_cost_usd, 6),
            **dict(self.extra),
        }


def common_prefix_messages(previous: Sequence[Message], current: Sequence[Message]) -> int:
    """How many messages ``current`` opens with that are ``previous``'s, byte for byte."""
    same = 0
    for a, b in zip(previous, current, strict=False):
        if a.fingerprint != b.fingerprint:
            break
        same += 1
    return same


def cache_calls(
    contexts: Sequence[Sequence[Message]],
    counter: TokenCounter,
    tools: Tools | None = None,
) -> list[CallPrefix]:
    """One session's calls as a prompt cache sees them (for
    :func:`~ctxwarden.core.registry.cache_cost.session_cache_cost`): each call's input tokens,
    the tokens it shares with the previous call from the start, and whether the previous
    context is a whole prefix of it (an append-only call)."""
    from ctxwarden.core.registry.cache_cost import CallPrefix

    tools_tokens = counter.count_tools(tools) if tools else 0
    out: list[CallPrefix] = []
    previous: Sequence[Message] = ()
    for ctx in contexts:
        same = common_prefix_messages(previous, ctx)
        shared = tools_tokens + sum(map(counter.count_message, ctx[:same])) if same else 0
        tokens = counter.count_messages(ctx, tools).tokens
        out.append(CallPrefix(tokens, shared, bool(previous) and same == len(previous)))
        previous = ctx
    return out


def price_run(
    name: str,
    contexts: Sequence[Sequence[Message]],
    counter: TokenCounter,
    model: str,
    *,
    tools: Tools | None = None,
    summarizer_usage: Usage | None = None,
    summarizer_cost: float | None = None,
    extra: Mapping[str, Any] | None = None,
) -> StrategyRun:
    """Count, cache-match and price the contexts one strategy sent, turn by turn.

    Summariser calls cost ``summarizer_cost`` dollars when given (a real summariser,
    priced at its own model), else ``summarizer_usage`` priced at ``model``.
    """
    from ctxwarden.core.registry.cost import estimate_cost

    tools_tokens = counter.count_tools(tools) if tools else 0
    per_turn: list[int] = []
    cached: list[int] = []
    previous: Sequence[Message] = ()
    for ctx in contexts:
        per_turn.append(counter.count_messages(ctx, tools).tokens)
        cached.append(common_prefix_tokens(previous, ctx, counter, tools_tokens))
        previous = ctx
    total = sum(per_turn)
    summ = summarizer_usage or Usage(calls=0)
    plain = estimate_cost(Usage(input_tokens=total), model)
    effective = estimate_cost(Usage(input_tokens=total, cached_input_tokens=sum(cached)), model)
    if summarizer_cost is None:
        summarizer_cost = estimate_cost(summ, model) if summ.calls else 0.0
    return StrategyRun(
        name,
        per_turn,
        cached,
        summ,
        plain + summarizer_cost,
        effective + summarizer_cost,
        dict(extra or {}),
    )


def price_strategy(
    name: str,
    contexts: Sequence[Sequence[Message]],
    counter: TokenCounter,
    model: str,
    summarizer: BenchSummarizer,
    strategy: object,
    *,
    tools: Tools | None = None,
    extra: Mapping[str, Any] | None = None,
) -> StrategyRun:
    """:func:`price_run` for ``strategy``, its summariser calls (its ``account``; a
    strategy without one never summarises) priced by ``summarizer``, failures reported."""
    account = getattr(strategy, "account", None)
    usage = account.usage if isinstance(account, Account) else Usage(calls=0)
    return price_run(
        name,
        contexts,
        counter,
        model,
        tools=tools,
        summarizer_usage=usage,
        summarizer_cost=summarizer.cost(usage, model),
        extra={
            **(account if isinstance(account, Account) else Account()).to_json(),
            **dict(extra or {}),
        },
    )


def reduction_table(
    series: Mapping[str, Sequence[int]], turns: Sequence[int], baseline: str
) -> dict[str, dict[int, dict[str, float]]]:
    """``{strategy: {turn: {"tokens", "pct_of_baseline", "reduction"}}}`` (turns 1-based)."""
    base = series[baseline]
    table: dict[str, dict[int, dict[str, float]]] = {}
    for name, values in series.items():
        row: dict[int, dict[str, float]] = {}
        for turn in turns:
            if turn > len(values):
                continue
            pct = 100.0 * values[turn - 1] / base[turn - 1]
            row[turn] = {"tokens": values[turn - 1], "pct_of_baseline": pct, "reduction": 100 - pct}
        table[name] = row
    return table


def sawtooth_window(
    messages: Sequence[Message], counts: Sequence[int], budget: int, start: int
) -> tuple[list[int], int]:
    """The plain *sawtooth* window, the cache-friendly baseline: the system prompt and
    every message from ``start`` on while that fits the budget (append-only: a prompt
    cache serves all of it); when it does not, the start moves, whole blocks at a time,
    until the window holds at most half of the room the system prompt leaves (the newest
    block is kept even when it alone is larger). Returns the kept indices and the new
    ``start`` (the caller keeps it for the next call: the window never moves back)."""
    sys_end = 1 if messages and messages[0].role == "system" else 0
    fixed = REPLY_PRIMING + sum(counts[:sys_end])
    start = max(start, sys_end)
    if fixed + sum(counts[start:]) > budget:
        target = (budget - fixed) // 2
        used, new_start = 0, len(messages)
        for block in reversed(group_blocks(messages[sys_end:], sys_end)):
            lo, hi = block.start, block.end
            if lo < start:
                break
            size = sum(counts[lo:hi])
            if used + size > target and new_start < len(messages):
                break
            used += size
            new_start = lo
        start = new_start
    return [*range(sys_end), *range(start, len(messages))], start


# -- our engine, driven turn by turn ---------------------------------------------------------


class OursStrategy:
    """ctxwarden's own pipeline as an agent loop runs it: facts from each new user message
    (rule-based offline, one model call with a real summariser), a rolling summary when
    ``trigger`` fires, then :func:`ctxwarden.pipeline.engine.build_context` with the previous
    build for sticky decisions. A failed summary or extraction changes nothing (the
    window holds every message it can; the next trigger tries again) and is counted in
    :attr:`account`.

    The summary is shown as written (see :class:`EngineStrategy` for the engine's own
    summary path, with its query-aware view).

    Stateful on purpose (one instance per scenario run): it is called once per turn with
    the whole history so far and returns the messages to send; :meth:`build` builds
    without advancing the state (to ask several questions of one history).
    """

    def __init__(
        self,
        model: str,
        max_input_tokens: int,
        *,
        trigger: Any = None,
        schema: Any = None,
        summarizer: Summarizer | BenchSummarizer | None = None,
        tools: Tools | None = None,
        policy: Any = None,
    ) -> None:
        from ctxwarden.memory.facts import Facts
        from ctxwarden.memory.summaries import SummaryState

        self.model = model
        self.budget = max_input_tokens
        self.trigger = trigger
        self.schema = schema
        self.summarizer = get_summarizer(summarizer or "offline")
        self.tools = tools
        self.policy = policy
        self.counter = TokenCounter.for_model(model)
        self.facts = Facts()
        self.state = SummaryState()
        self.account = Account()
        self.seen = 0
        self.previous: Any = None
        self.last: Any = None

    def __call__(self, history: Sequence[Message]) -> list[Message]:
        self.update(history)
        built = self._build(history)
        self.previous = self.last = built
        return list(built.messages)

    def update(self, history: Sequence[Message]) -> None:
        """Read the new user messages for facts; run a summary cycle if the trigger fires."""
        from ctxwarden.memory.summaries import plan_summary

        new = [m for m in history[self.seen :] if m.role == "user"]
        self.seen = len(history)
        if new:
            found = self.summarizer.extract(new, self.facts, self.schema)
            self.facts = found.facts
            self.account.add(found.usage, found.error)
        if self.trigger is not None:
            plan = plan_summary(
                history, self.trigger, self.counter.count_message, self.budget, self.state
            )
            if plan is not None:
                call = self.summarizer.summarize(plan.fold, self.state.level_one, self.counter)
                self.account.add(call.usage, call.error)
                if call.text is not None:
                    self.state = self.state.apply(plan, call.text)
                    self.previous = None  # positions changed: the next build starts cold

    def build(self, history: Sequence[Message]) -> list[Message]:
        """The context for ``history`` from the current state, leaving the state as it is."""
        return list(self._build(history).messages)

    def _build(self, history: Sequence[Message]) -> Any:
        from ctxwarden.pipeline.engine import build_context
        from ctxwarden.steps.layers import facts_layer_text

        covered = self.state.covered_ids
        live = [m for m in history if m.id not in covered]
        facts = facts_layer_text(self.facts, history) or None  # as build_context shows it
        summary = self.state.text or None
        return build_context(
            live,
            model=self.model,
            max_input_tokens=self.budget,
            policy=self.policy,
            previous=self.previous,
            summary=summary,
            facts=facts,
            tools=self.tools,
        )


class EngineStrategy:
    """ctxwarden as a user calls it: ``build_context(history, summarizer=...,
    policy=...)`` with the previous build, the engine keeping the summary and facts
    in its state (the policy's ``summary`` trigger and ``summary_share`` apply, and a
    summariser that can focus shows its view for the newest user message).

    Stateful like :class:`OursStrategy`: called once per turn with the whole history
    so far; :meth:`build` builds from the current state without advancing it.
    Summarisation failures the audit reports are counted in :attr:`account`.
    """

    def __init__(
        self,
        model: str,
        max_input_tokens: int,
        *,
        policy: Any,
        summarizer: Any = "offline",
        tools: Tools | None = None,
    ) -> None:
        self.model = model
        self.budget = max_input_tokens
        self.policy = policy
        self.summarizer = summarizer
        self.tools = tools
        self.account = Account()
        self.last: Any = None

    def __call__(self, history: Sequence[Message]) -> list[Message]:
        built = self._build(history)
        self.last = built
        return list(built.messages)

    def build(self, history: Sequence[Message]) -> list[Message]:
        """The context for ``history`` from the current state, leaving the state as it is
        (to ask several questions of one history)."""
        return list(self.built(history).messages)

    def built(self, history: Sequence[Message]) -> Any:
        """:meth:`build`'s :class:`~ctxwarden.pipeline.engine.BuiltContext` (audit included)."""
        return self._build(history)

    def _build(self, history: Sequence[Message]) -> Any:
        from ctxwarden.pipeline.engine import build_context

        built = build_context(
            list(history),
            model=self.model,
            max_input_tokens=self.budget,
            policy=self.policy,
            previous=self.last,
            summarizer=self.summarizer,
            tools=self.tools,
        )
        for warning in built.audit.warnings:
            if warning.startswith("summarisation failed"):
                self.account.add(Usage(calls=0), warning)
        return built
