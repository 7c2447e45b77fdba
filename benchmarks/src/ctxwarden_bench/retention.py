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
        return out


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
    for n, run in enumerate(runs):
        counts = [counter.count_message(m) for m in run]
        earlier = Mentions()
        full = REPLY_PRIMING
        for k, m in enumerate(run):
            if m.tool_calls and k:
                before = run[:k]
                ctx = builder(before, counts[:k], budget)
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
    )
