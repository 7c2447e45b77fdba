"""What a build did (R11, R10); what the next build must remember is
:class:`~ctxwarden.steps.state.BuildState`.

:class:`Audit` is the user-facing report: tokens per layer, every message dropped,
masked, truncated or summarised with the reason and the tokens saved, fill ratio,
estimated cost, prefix shared with the previous build, and warnings when something
that should never drift (a pinned message, a ledger entry) had to be cut.

``summary_due`` says a summary would fold older messages now (the build never calls a
model: ``Session.summarize`` or :func:`ctxwarden.summarize_history` makes it); ``steps``
names the pipeline's steps in the order they ran, a user's own included. ``prefix_break``
says where this build stopped repeating the previous one, why, and what the rewrite cost at
the model's cache prices (:mod:`ctxwarden.pipeline.compaction`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from ctxwarden.core.caching import memoize
from ctxwarden.steps.base import Action, ActionKind

if TYPE_CHECKING:
    from ctxwarden.pipeline.compaction import PrefixBreak
    from ctxwarden.steps.state import SummaryDue

__all__ = ["LAYERS", "Audit"]

LAYERS = ("system", "facts", "ledger", "summary", "pinned", "window", "current")
_SCALARS = (str, int, float, bool, type(None))


@memoize(64)  # per Action class (a handful)
def _field_names(kind: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(kind))


def _action_dict(action: Action) -> dict[str, Any]:
    """``dataclasses.asdict(action)``: read field by field when every value is a scalar
    (the built-in actions; a build logs one per masked or cut message, and ``asdict``'s
    recursive copy was most of the proxy's audit write), ``asdict`` otherwise."""
    out = {name: getattr(action, name) for name in _field_names(type(action))}
    if all(isinstance(v, _SCALARS) for v in out.values()):
        return out
    return asdict(action)


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
    summary_due: SummaryDue | None = None
    steps: tuple[str, ...] = ()
    prefix_break: PrefixBreak | None = None

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

    def to_dict(self, *, actions: bool = True) -> dict[str, Any]:
        """A JSON-ready dict (``ctxwarden build --report``); ``actions=False`` leaves
        ``"actions"`` as ``None`` in its place (for a writer that writes them itself)."""
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
            "actions": [_action_dict(a) for a in self.actions] if actions else None,
            "warnings": list(self.warnings),
            "prefix_shared_tokens": self.prefix_shared_tokens,
            "cacheable_prefix_tokens": self.cacheable_prefix_tokens,
            "estimated_cost_usd": self.estimated_cost_usd,
            "effective_cost_usd": self.effective_cost_usd,
            "prompt_cache_key": self.prompt_cache_key,
            "cache_breakpoints": list(self.cache_breakpoints),
            "summary_due": None if self.summary_due is None else self.summary_due.to_dict(),
            "steps": list(self.steps),
            "prefix_break": None if self.prefix_break is None else self.prefix_break.to_dict(),
        }
