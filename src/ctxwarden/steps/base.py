"""The one small protocol every strategy implements, and what it reports.

A strategy is a configurable, callable dataclass: ``strategy(messages, ctx)`` returns a
:class:`StrategyResult` with a *new* list of messages and the :class:`Action` s it took.
It never mutates its input and does no I/O; anything it needs to know (token counts,
the budget, what earlier builds decided) comes in through :class:`StrategyContext`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from ctxwarden.messages import Message

__all__ = ["Action", "ActionKind", "Strategy", "StrategyContext", "StrategyResult"]

ActionKind = Literal["truncated", "masked", "dropped", "evicted", "summarized", "rejected"]


@dataclass(frozen=True)
class Action:
    """One thing a strategy did to one message, with the reason and the tokens it saved."""

    message_id: str
    action: ActionKind
    reason: str
    tokens_before: int = 0
    tokens_after: int = 0
    strategy: str = ""

    @property
    def tokens_saved(self) -> int:
        return self.tokens_before - self.tokens_after


@dataclass(frozen=True)
class StrategyContext:
    """What a strategy may read: counting, the budget, and earlier decisions.

    ``count`` returns the tokens of one message as sent (cached by the counter).
    ``budget`` is the input-token budget for the whole context; ``protected`` holds ids
    no strategy may remove (the system prompt, the newest user message).
    ``sticky`` maps message id -> the action an earlier build took on it, so a message
    masked or truncated at turn t stays so at t+1 and the prompt prefix stays stable.
    ``count_text`` counts a bare string (no framing): strategies that try drafts use it
    instead of wrapping each draft in a message.
    """

    count: Callable[[Message], int]
    budget: int
    total: Callable[[Sequence[Message]], int]
    protected: frozenset[str] = frozenset()
    sticky: Mapping[str, ActionKind] = field(default_factory=dict)
    count_text: Callable[[str], int] | None = None  # a bare string, when the caller has one


@dataclass(frozen=True)
class StrategyResult:
    messages: list[Message]
    actions: list[Action] = field(default_factory=list)


@runtime_checkable
class Strategy(Protocol):
    """A pure step of the cascade."""

    name: str

    def __call__(self, messages: Sequence[Message], ctx: StrategyContext) -> StrategyResult: ...
