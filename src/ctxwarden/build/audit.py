"""What a build did, and what the next build must remember (R11, R10).

:class:`Audit` is the user-facing report: tokens per layer, every message dropped,
masked, truncated or summarised with the reason and the tokens saved, fill ratio,
estimated cost, prefix shared with the previous build, and warnings when something
that should never drift (a pinned message, a ledger entry) had to be cut.

:class:`BuildState` is the small memory that makes decisions sticky across builds: the
window only moves forward, a masked result stays masked, and the fingerprints of the
previous context let the next build measure how much of its prefix a provider cache
can reuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ctxwarden.steps.base import Action, ActionKind

__all__ = ["LAYERS", "Audit", "BuildState"]

LAYERS = ("system", "facts", "ledger", "summary", "pinned", "window", "current")


@dataclass(frozen=True)
class BuildState:
    """Decisions carried to the next build (JSON-serialisable, stored by sessions)."""

    history_length: int = 0
    last_id: str = ""
    window_start: int = 0
    sticky: Mapping[str, ActionKind] = field(default_factory=dict)
    prefix: tuple[str, ...] = ()  # fingerprints of the previous context, in order
    # where the ledger's sources begin (a position in this history: kept in memory only;
    # a session keeps its own ledger checkpoint)
    ledger_from: int = 0
    layers: Any = field(default=None, compare=False)  # summary and facts (LayerState)

    def to_dict(self) -> dict[str, Any]:
        return {
            "history_length": self.history_length,
            "last_id": self.last_id,
            "window_start": self.window_start,
            "sticky": dict(self.sticky),
            "prefix": list(self.prefix),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildState:
        return cls(
            history_length=int(data.get("history_length", 0)),
            last_id=str(data.get("last_id", "")),
            window_start=int(data.get("window_start", 0)),
            sticky=dict(data.get("sticky", {})),
            prefix=tuple(data.get("prefix", ())),
        )


@dataclass(frozen=True)
class Audit:
    """The report of one build."""

    model: str
    budget: int
    input_tokens: int
    exact: bool
    layers: Mapping[str, int]
    actions: tuple[Action, ...]
    warnings: tuple[str, ...]
    context_window: int | None
    history_messages: int
    kept_messages: int
    prefix_shared_tokens: int
    cacheable_prefix_tokens: int
    estimated_cost_usd: float | None
    effective_cost_usd: float | None
    prompt_cache_key: str
    cache_breakpoints: tuple[str, ...] = ()

    @property
    def fill_ratio(self) -> float | None:
        """Input tokens over the model's context window."""
        return self.input_tokens / self.context_window if self.context_window else None

    @property
    def budget_ratio(self) -> float:
        return self.input_tokens / self.budget if self.budget else 0.0

    @property
    def tokens_saved(self) -> int:
        return sum(a.tokens_saved for a in self.actions)

    def by_action(self, kind: ActionKind) -> list[Action]:
        return [a for a in self.actions if a.action == kind]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``ctxwarden build --report``)."""
        return {
            "model": self.model,
            "budget": self.budget,
            "input_tokens": self.input_tokens,
            "exact": self.exact,
            "fill_ratio": self.fill_ratio,
            "budget_ratio": self.budget_ratio,
            "layers": dict(self.layers),
            "history_messages": self.history_messages,
            "kept_messages": self.kept_messages,
            "tokens_saved": self.tokens_saved,
            "actions": [asdict(a) for a in self.actions],
            "warnings": list(self.warnings),
            "prefix_shared_tokens": self.prefix_shared_tokens,
            "cacheable_prefix_tokens": self.cacheable_prefix_tokens,
            "estimated_cost_usd": self.estimated_cost_usd,
            "effective_cost_usd": self.effective_cost_usd,
            "prompt_cache_key": self.prompt_cache_key,
            "cache_breakpoints": list(self.cache_breakpoints),
        }
