"""Score a policy on recorded sessions: needed-later retention and cost at cache prices.

Each session is replayed as the agent loop that recorded it: before every assistant
message the context is built from the messages before it, with the previous build
chained (``previous=``), through the
:class:`~ctxwarden.tune.measures.EngineBuilder` (a build the budget cannot hold falls
back to the plain window and is counted in ``errors``). From those contexts:

* **retention** — the bench's needed-later measure: at every assistant tool call, the
  values it passes that an earlier message showed, and the share of them still in the
  built context (whole-token match, :class:`~ctxwarden.tune.measures.Mentions`). The
  values of a call are the union of the two trace rules, so one measure serves any
  agent: every argument leaf of at least three characters (tau-bench,
  :func:`~ctxwarden.tune.measures.needed_values`) and every distinctive token of a string
  argument not already in the system prompt or task (swebench-mini,
  :func:`~ctxwarden.tune.measures.needed_tokens`);
* **cost** — the effective input cost against the full history, both with an idealised
  prefix cache: a call pays ``cache_read`` per token it shares with the previous call's
  context (:func:`~ctxwarden.tune.measures.common_prefix_tokens`) and ``cache_write``
  per other token (Anthropic: 0.1 and 1.25). ``cost`` is the ratio of the two sums;
* **violations** — the invariants (:func:`~ctxwarden.tune.measures.invariant_problems`:
  tool calls paired, system prompt first, no message twice) plus builds over budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import REPLY_PRIMING, TokenCounter
from ctxwarden.pipeline.policy import Policy
from ctxwarden.tune.measures import (
    EngineBuilder,
    Mentions,
    common_prefix_tokens,
    invariant_problems,
    json_leaves,
    needed_tokens,
    needed_values,
    plain_builder,
)

__all__ = [
    "ANTHROPIC",
    "CachePrices",
    "Needed",
    "Score",
    "needed_in",
    "needed_later",
    "score_policy",
]


@dataclass(frozen=True)
class CachePrices:
    """Input price multipliers of a prompt cache: a token read from it, a token written."""

    read: float = 0.1
    write: float = 1.25

    def cost(self, tokens: int, cached: int) -> float:
        return self.read * cached + self.write * (tokens - cached)


ANTHROPIC = CachePrices(0.1, 1.25)
"""Anthropic's prompt cache: a read costs 0.1x the input price, a write 1.25x."""


@dataclass(frozen=True)
class Score:
    """One policy on a set of sessions."""

    retention: float
    cost: float  # effective input cost / the full history's, both cached
    kept: int
    needed: int
    calls: int
    violations: int
    over_budget: int
    errors: int
    tokens: int
    full_tokens: int
    prefix_calls: float  # share of calls whose previous context is a whole prefix
    kept_values: frozenset[tuple[int, int, str]] = frozenset()  # (session, call, value)
    cost_per_session: tuple[float, ...] = ()  # effective input cost, session by session

    @property
    def feasible(self) -> bool:
        return self.violations == 0 and self.over_budget == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "retention": round(self.retention, 4),
            "cost_vs_full_cached": round(self.cost, 4),
            "values": self.needed,
            "calls": self.calls,
            "violations": self.violations,
            "over_budget": self.over_budget,
            "build_errors": self.errors,
            "input_tokens": self.tokens,
            "full_history_tokens": self.full_tokens,
            "whole_prefix_calls": round(self.prefix_calls, 4),
        }


def needed_later(m: Message, earlier: Mentions, given: Mentions) -> list[str]:
    """The values ``m``'s tool calls pass that an earlier message showed (module doc)."""
    found: dict[str, None] = {}
    for call in m.tool_calls:
        args = call.parsed_arguments()
        for value, _ in needed_values(args, earlier):
            found.setdefault(value)
        for _, leaf in json_leaves(args):
            if isinstance(leaf, str) and len(leaf) > 3:
                for token in needed_tokens(leaf, earlier, given):
                    found.setdefault(token)
    return list(found)


Needed = dict[int, tuple[str, ...]]
"""A session's needed-later values, by the index of the calling message."""


def needed_in(run: Sequence[Message]) -> Needed:
    """Every call's needed-later values in ``run``: the same for every policy, so a
    search works them out once per session (a regex over every earlier message for a
    value that is not one word: a quarter of a replay's time when done per trial)."""
    head = [m for m in run[:3] if m.role == "system"]
    head += [next((m for m in run if m.role == "user"), Message.user(""))]
    given, earlier = Mentions(head), Mentions()
    out: Needed = {}
    for k, m in enumerate(run):
        if m.role == "assistant" and k and m.tool_calls:
            values = needed_later(m, earlier, given)
            if values:
                out[k] = tuple(values)
        earlier.add(m)
    return out


def score_policy(
    sessions: Sequence[Sequence[Message]],
    policy: Policy,
    budget: int,
    *,
    model: str = "gpt-4o",
    prices: CachePrices = ANTHROPIC,
    summarizer: str | None = None,
    needed: Sequence[Needed] | None = None,
) -> Score:
    """Replay every session under ``policy`` at ``budget`` and score it (module doc);
    with ``summarizer`` (``"offline"`` or a provider spec) every build runs it as
    ``build_context(summarizer=...)`` does, so the policy's summary trigger applies.
    ``needed``: :func:`needed_in` of each session, when already worked out."""
    plans = list(needed) if needed is not None else [needed_in(run) for run in sessions]
    counter = TokenCounter.for_model(model)
    kept = wanted = calls = violations = over = errors = 0
    tokens = full_tokens = prefix_hits = 0
    ours_cost = full_cost = 0.0
    kept_values: set[tuple[int, int, str]] = set()
    per_session: list[float] = []
    for n, (run, plan) in enumerate(zip(sessions, plans, strict=True)):
        cost_before = ours_cost
        builder = (
            EngineBuilder(model, loop=True, policy=policy)
            if summarizer is None
            else _SummarizingBuilder(model, policy, summarizer)
        )
        counts = [counter.count_message(m) for m in run]
        previous: list[Message] = []
        full = REPLY_PRIMING
        full_previous = 0
        for k, m in enumerate(run):
            if m.role == "assistant" and k:
                before = run[:k]
                ctx = builder(before, counts[:k], budget)
                sent = counter.count_messages(ctx).tokens
                shared = common_prefix_tokens(previous, ctx, counter, 0)
                calls += 1
                prefix_hits += bool(previous) and shared >= sum(
                    counter.count_message(x) for x in previous
                )
                tokens += sent
                full_tokens += full
                ours_cost += prices.cost(sent, shared)
                full_cost += prices.cost(full, full_previous)
                full_previous = full - REPLY_PRIMING
                over += sent > budget
                violations += bool(invariant_problems(before, ctx))
                values = plan.get(k, ())
                if values:
                    inside = Mentions(ctx)
                    wanted += len(values)
                    hits = [v for v in values if v in inside]
                    kept += len(hits)
                    kept_values.update((n, k, v) for v in hits)
                previous = ctx
            full += counts[k]
        errors += builder.errors
        per_session.append(ours_cost - cost_before)
    return Score(
        retention=kept / wanted if wanted else 1.0,
        cost=ours_cost / full_cost if full_cost else 1.0,
        kept=kept,
        needed=wanted,
        calls=calls,
        violations=violations,
        over_budget=over,
        errors=errors,
        tokens=tokens,
        full_tokens=full_tokens,
        prefix_calls=prefix_hits / calls if calls else 0.0,
        kept_values=frozenset(kept_values),
        cost_per_session=tuple(per_session),
    )


class _SummarizingBuilder:
    """The agent loop with a summariser: ``build_context(summarizer=..., previous=...)``;
    a budget that cannot hold the newest turn falls back to the plain window, as
    :class:`~ctxwarden.tune.measures.EngineBuilder` does."""

    def __init__(self, model: str, policy: Policy, summarizer: str) -> None:
        self.model, self.policy, self.summarizer = model, policy, summarizer
        self.errors = 0
        self._built: Any = None

    def __call__(
        self, before: Sequence[Message], counts: Sequence[int], budget: int
    ) -> list[Message]:
        from ctxwarden.core.errors import BudgetError
        from ctxwarden.pipeline.engine import build_context

        try:
            self._built = build_context(
                list(before),
                model=self.model,
                max_input_tokens=budget,
                policy=self.policy,
                previous=self._built,
                summarizer=self.summarizer,
            )
        except BudgetError:
            self.errors += 1
            self._built = None
            return plain_builder()(before, counts, budget)
        return list(self._built.messages)
