"""Needed-later retention over recorded agent traces, shared by the tau-bench and
swebench-mini rows.

At every assistant tool call of every run, a *builder* (a plain window, ctxwarden, a
peer) makes the context from the messages before the call. A trace module says which
values of the call were *needed* (they occurred in an earlier message) and how they are
grouped (``id`` / ``other`` for tau-bench, ``token`` for swebench-mini); this module
counts, per needed value, whether it still occurs in the built context (a whole-token,
case-sensitive match in a message's text: content, plus function name and arguments of
its tool calls). It also checks every built context for the invariants a provider or an
agent depends on (system prompt first, the newest message kept, tool calls paired with
their results, no message twice) and for the budget, so a builder that "retains" by
sending too much or a broken history is seen in the same run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import REPLY_PRIMING, TokenCounter
from ctxwarden.tune.measures import (
    Builder,
    EngineBuilder,
    Mentions,
    invariant_problems,
    message_text,
    plain_builder,
)
from ctxwarden_bench.metrics import cache_calls, sawtooth_window

__all__ = [
    "Builder",
    "EngineBuilder",
    "Mentions",
    "NeededFn",
    "Retention",
    "call_retention",
    "engine_builder",
    "invariant_problems",
    "message_text",
    "newest_kept",
    "plain_builder",
    "policy_file",
    "sawtooth_builder",
]


Progress = Callable[[str], None] | None


NeededFn = Callable[[Message, "Mentions", Sequence[Message]], list[tuple[str, str]]]
"""(the calling message, mentions of the earlier messages, the earlier messages) ->
the needed ``(value, group)`` pairs of its calls."""


def newest_kept(before: Sequence[Message], ctx: Sequence[Message]) -> bool:
    """Whether the newest message (the result or request the call answers) is in
    ``ctx``, whole or shortened (same id). Not an invariant: a newest result larger
    than the budget cannot be sent whole, but it is counted beside."""
    if not before:
        return True
    newest = before[-1]
    if newest.id:
        return any(m.id == newest.id for m in ctx)
    return any(m.fingerprint == newest.fingerprint for m in ctx)


@dataclass(frozen=True)
class LoopCost:
    """A builder's contexts priced as an agent loop sends them (a build before every
    assistant message), at Anthropic's and OpenAI-style cache prices and at the bench
    model's own (the registry's ``cached_input`` / ``cache_write``: the prices the
    default policy weighs its rewrites at), beside the full history with caching and the
    plain sawtooth window of the same calls (units: input tokens at the input price; see
    :mod:`ctxwarden.core.registry.cache_cost`; every cache idealised: no minimum length)."""

    calls: int = 0
    anthropic: float = 0.0
    openai: float = 0.0
    full_anthropic: float = 0.0
    full_openai: float = 0.0
    sawtooth_anthropic: float = 0.0
    sawtooth_openai: float = 0.0
    whole_prefix_share: float = 1.0
    own: float = 0.0
    full_own: float = 0.0
    sawtooth_own: float = 0.0
    own_label: str = ""

    def to_json(self) -> dict[str, Any]:
        def ratio(a: float, b: float) -> float:
            return round(a / b, 4) if b else 0.0

        return {
            "loop_calls": self.calls,
            "cache_cost_units": round(self.anthropic),
            "cache_cost_vs_full": ratio(self.anthropic, self.full_anthropic),
            "cache_cost_vs_full_openai": ratio(self.openai, self.full_openai),
            "cache_cost_vs_full_model": ratio(self.own, self.full_own),
            "cache_cost_vs_sawtooth": ratio(self.anthropic, self.sawtooth_anthropic),
            "cache_cost_vs_sawtooth_openai": ratio(self.openai, self.sawtooth_openai),
            "cache_cost_vs_sawtooth_model": ratio(self.own, self.sawtooth_own),
            "model_cache_prices": self.own_label,
            "whole_prefix_share": round(self.whole_prefix_share, 4),
        }


@dataclass(frozen=True)
class Retention:
    """One builder at one budget: needed values kept, per group and overall."""

    retention: float
    reduction: float
    calls: int
    built_tokens: int
    full_tokens: int
    values: int = 0
    groups: dict[str, tuple[int, int]] = field(default_factory=dict)  # group: (kept, needed)
    per_call_retention: float = 0.0  # the mean over calls of the share kept (first group)
    violations: int = 0
    over_budget: int = 0
    newest_dropped: int = 0
    examples: tuple[str, ...] = ()
    per_call_tokens: tuple[int, ...] = ()
    cost: LoopCost = field(default_factory=LoopCost)

    def group(self, name: str) -> float:
        kept, needed = self.groups.get(name, (0, 0))
        return kept / needed if needed else 1.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "retention": round(self.retention, 4),
            "reduction": round(self.reduction, 4),
            "values": self.values,
            "calls": self.calls,
        }
        for name, (kept, needed) in self.groups.items():
            out[f"retention_{name}"] = round(kept / needed if needed else 1.0, 4)
            out[f"values_{name}"] = needed
        out |= {
            "per_call_retention": round(self.per_call_retention, 4),
            "violations": self.violations,
            "over_budget": self.over_budget,
            "newest_dropped": self.newest_dropped,
            "violation_examples": list(self.examples),
            "total_input_tokens": self.built_tokens,
            "full_history_tokens": self.full_tokens,
            "input_tokens_per_turn": list(self.per_call_tokens),
        }
        out |= self.cost.to_json()
        return out


class SawtoothBuilder:
    """The plain sawtooth window (:func:`~ctxwarden_bench.metrics.sawtooth_window`) as a
    builder: its start is kept from call to call of one run (a new run, whose history
    does not extend the last one, starts over)."""

    def __init__(self) -> None:
        self._head: Message | None = None
        self._length = 0
        self._start = 0

    def __call__(
        self, before: Sequence[Message], counts: Sequence[int], budget: int
    ) -> list[Message]:
        if not before or before[0] is not self._head or len(before) < self._length:
            self._start = 0
        self._head, self._length = (before[0] if before else None), len(before)
        kept, self._start = sawtooth_window(before, counts, budget, self._start)
        return [before[i] for i in kept]


def sawtooth_builder() -> Builder:
    """A fresh :class:`SawtoothBuilder` (the cache-friendly baseline's row)."""
    return SawtoothBuilder()


def policy_file(path: Path | None) -> Any:
    """The policy a bench command's ``--policy FILE`` names (``None``: the default); a
    file that is not a policy stops the command with what is wrong in it."""
    if path is None:
        return None
    from ctxwarden.core.errors import ConfigError
    from ctxwarden.pipeline.policy import Policy

    try:
        return Policy.from_toml(path)
    except ConfigError as exc:
        raise SystemExit(f"--policy: {exc}") from exc


def engine_builder(
    model: str = "gpt-4o", *, loop: bool = True, policy: Any = None
) -> EngineBuilder:
    """A fresh :class:`EngineBuilder` (one per row: its error count is the row's)."""
    return EngineBuilder(model, loop=loop, policy=policy)


def call_retention(
    runs: Sequence[Sequence[Message]],
    budget: int,
    builder: Builder,
    needed: NeededFn,
    *,
    model: str = "gpt-4o",
    primary: str | None = None,
    progress: Progress = None,
    label: str = "run",
) -> Retention:
    """Retention and reduction of ``builder`` at ``budget`` over every tool call;
    ``primary`` names the group whose per-call mean is reported beside (the old
    tau-bench figure averaged the id share per call)."""
    counter = TokenCounter.for_model(model)
    kept_by: Counter[str] = Counter()
    need_by: Counter[str] = Counter()
    per_call_sum, per_call_n, calls, built_sum, full_sum = 0.0, 0, 0, 0, 0
    violations = over = newest_dropped = 0
    examples: list[str] = []
    per_call: list[int] = []
    loop = _LoopPricing(counter, model)
    for n, run in enumerate(runs):
        counts = [counter.count_message(m) for m in run]
        earlier = Mentions()
        full = REPLY_PRIMING
        sawtooth = SawtoothBuilder()
        sent: list[list[Message]] = []
        for k, m in enumerate(run):
            if m.role == "assistant" and k:  # the agent loop: a build before every reply
                before = run[:k]
                ctx = builder(before, counts[:k], budget)
                sent.append(ctx)
                loop.add_call(before, sawtooth(before, counts[:k], budget))
            if m.tool_calls and k:
                tokens = counter.count_messages(ctx).tokens
                per_call.append(tokens)
                built_sum += tokens
                full_sum += full
                over += tokens > budget
                newest_dropped += not newest_kept(before, ctx)
                problems = invariant_problems(before, ctx)
                if problems:
                    violations += 1
                    if len(examples) < 5:
                        examples.append(f"{label} {n} message {k}: {'; '.join(problems[:3])}")
                need = needed(m, earlier, before)
                if need:
                    calls += 1
                    inside = Mentions(ctx)
                    hits = [(g, v in inside) for v, g in need]
                    for g, hit in hits:
                        need_by[g] += 1
                        kept_by[g] += hit
                    mine = [hit for g, hit in hits if primary is None or g == primary]
                    if mine:
                        per_call_sum += sum(mine) / len(mine)
                        per_call_n += 1
            earlier.add(m)
            full += counts[k]
        loop.end_run(sent)
        if progress:
            progress(f"{label} {n + 1}/{len(runs)}")
    total = sum(need_by.values())
    return Retention(
        sum(kept_by.values()) / total if total else 1.0,
        1 - built_sum / full_sum if full_sum else 0.0,
        calls,
        built_sum,
        full_sum,
        total,
        {g: (kept_by[g], need_by[g]) for g in sorted(need_by)},
        per_call_sum / per_call_n if per_call_n else 1.0,
        violations,
        over,
        newest_dropped,
        tuple(examples),
        tuple(per_call),
        loop.total(),
    )


class _LoopPricing:
    """The cache-price figures of :class:`LoopCost`, gathered run by run: the builder's
    contexts, the full history's and the sawtooth window's at the same calls."""

    def __init__(self, counter: TokenCounter, model: str) -> None:
        from dataclasses import replace

        from ctxwarden.core.errors import UnknownModelError
        from ctxwarden.core.registry.cache_cost import ANTHROPIC, OPENAI, CacheCost, CachePrices
        from ctxwarden.core.registry.catalog import get_model

        self.counter = counter
        try:  # the model's own prices, idealised like the others (no minimum length)
            own = replace(CachePrices.for_model(get_model(model)), min_tokens=0)
        except UnknownModelError:  # a model the registry does not know: Anthropic's
            own = ANTHROPIC
        self.prices = (ANTHROPIC, OPENAI, own)
        zero = CacheCost(0, 0, 0, 0.0, 0, 0)
        self.sums = {k: [zero, zero, zero] for k in ("ours", "full", "sawtooth")}
        self._full: list[Sequence[Message]] = []
        self._sawtooth: list[list[Message]] = []

    def add_call(self, before: Sequence[Message], sawtooth: list[Message]) -> None:
        self._full.append(before)
        self._sawtooth.append(sawtooth)

    def end_run(self, sent: Sequence[Sequence[Message]]) -> None:
        from ctxwarden.core.registry.cache_cost import session_cache_cost

        for key, contexts in (("ours", sent), ("full", self._full), ("sawtooth", self._sawtooth)):
            calls = cache_calls(contexts, self.counter)
            sums = self.sums[key]
            for i, prices in enumerate(self.prices):
                sums[i] = sums[i] + session_cache_cost(calls, prices)
        self._full, self._sawtooth = [], []

    def total(self) -> LoopCost:
        ours, full, saw = self.sums["ours"], self.sums["full"], self.sums["sawtooth"]
        return LoopCost(
            ours[0].calls,
            ours[0].units,
            ours[1].units,
            full[0].units,
            full[1].units,
            saw[0].units,
            saw[1].units,
            ours[0].whole_prefix_share,
            ours[2].units,
            full[2].units,
            saw[2].units,
            self.prices[2].label,
        )
