"""What a call, and a whole session, cost in dollars (R3).

The classic bug is to bill every input token at the input price. Cached reads are
cheaper (OpenAI 50-90 % off, Anthropic 0.1x), cache writes dearer (Anthropic 1.25x),
and the providers report them differently: OpenAI counts cached tokens *inside*
``prompt_tokens``, Anthropic reports them *beside* ``input_tokens``. :class:`Usage`
normalises both so that cached and cache-write tokens are parts of ``input_tokens``;
here each part gets its own price:

    dollars = (uncached * input + cached * cached_input + writes * cache_write
               + output * output) / 1e6

A provider without a cached or cache-write price bills those tokens as plain input.
Tiered models (Gemini, Claude 1M beta) take the tier of the call's prompt length.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxwarden.core.registry.catalog import ModelInfo, Price, Registry, get_model
from ctxwarden.core.registry.usage import Usage

__all__ = ["ModelCost", "SessionCost", "estimate_cost"]

_PER = 1_000_000


def _dollars(usage: Usage, price: Price) -> float:
    cached = price.cached_input if price.cached_input is not None else price.input
    write = price.cache_write if price.cache_write is not None else price.input
    return (
        usage.uncached_input_tokens * price.input
        + usage.cached_input_tokens * cached
        + usage.cache_write_tokens * write
        + usage.output_tokens * price.output
    ) / _PER


def estimate_cost(usage: Usage, model: str | ModelInfo, registry: Registry | None = None) -> float:
    """Dollars for ``usage`` on ``model`` (a name, resolved in ``registry``: by default
    the built-in registry plus ``CTXWARDEN_MODELS``).

    When ``usage`` sums several calls (``calls > 1``) on a tiered model, the tier is
    chosen by the average prompt per call; add calls one by one to a
    :class:`SessionCost` for an exact figure.
    """
    info = get_model(model, registry) if isinstance(model, str) else model
    per_call_prompt = usage.input_tokens // max(usage.calls, 1)
    return _dollars(usage, info.price_for(per_call_prompt))


@dataclass(frozen=True)
class ModelCost:
    """Tokens and dollars spent on one model."""

    model: str
    usage: Usage
    dollars: float


class SessionCost:
    """Running cost of a session: add each call's usage, read totals and a per-model split.

    Mutable on purpose (it accumulates); each call is priced when added, so tiers apply
    per call. Models are keyed by their registry name, so ``gpt-4o-2024-08-06`` and
    ``gpt-4o`` add up together. Names are resolved in ``registry`` (default: the
    built-in registry plus ``CTXWARDEN_MODELS``), so a user's own models are priced too.
    """

    def __init__(self, registry: Registry | None = None) -> None:
        self._by_model: dict[str, ModelCost] = {}
        self.registry = registry

    def __repr__(self) -> str:
        models = list(self._by_model)
        return f"SessionCost(total=${self.total:.6f}, calls={len(self)}, models={models})"

    def add(self, usage: Usage, model: str | ModelInfo) -> float:
        """Record one call (or a pre-summed usage); return its dollars."""
        info = get_model(model, self.registry) if isinstance(model, str) else model
        dollars = estimate_cost(usage, info)
        previous = self._by_model.get(info.name)
        if previous is not None:
            usage, dollars_total = previous.usage + usage, previous.dollars + dollars
        else:
            dollars_total = dollars
        self._by_model[info.name] = ModelCost(info.name, usage, dollars_total)
        return dollars

    @property
    def total(self) -> float:
        """Dollars over every model."""
        return sum(c.dollars for c in self._by_model.values())

    @property
    def usage(self) -> Usage:
        """Tokens over every model (``calls`` counts the calls)."""
        total = Usage(calls=0)
        for cost in self._by_model.values():
            total = total + cost.usage
        return total

    @property
    def by_model(self) -> dict[str, ModelCost]:
        """Per-model breakdown, in the order models were first used."""
        return dict(self._by_model)

    def __len__(self) -> int:
        return sum(c.usage.calls for c in self._by_model.values())
