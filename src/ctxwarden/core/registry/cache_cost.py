"""Cost at cache prices (R21): what a session's input costs when the provider caches the
prompt prefix. The one place the library (the build's rewrite decision, the audit,
``ctxwarden explain``) and the bench (every retention row) price a prefix.

A provider's prompt cache serves the part of a call's input that repeats the previous
call's from the start (a *prefix*) at the read price, ~0.1x the input price, and bills the
rest at the write price (Anthropic 1.25x for a 5-minute cache; OpenAI, Gemini, DeepSeek
1x: they have no write charge). A prefix shorter than the model's ``cache_min_tokens`` is
not cached at all. So one call costs, in input-token equivalents::

    units = read * shared + write * (input - shared)      (shared >= min_tokens, else 0)

and dollars are ``units * price.input / 1e6``. A context manager that sends fewer tokens
but moves the prefix at every call pays the write price on all of them: it can cost more
than sending everything with caching, which is what this figure shows. The *idealised*
cache (the bench's) has no minimum and never expires.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from ctxwarden.core.registry.catalog import ModelInfo

__all__ = [
    "ANTHROPIC",
    "OPENAI",
    "CacheCost",
    "CachePrices",
    "CallPrefix",
    "cautious_prices",
    "rewrite_pays",
    "session_cache_cost",
    "tail_edit_pays",
]


@dataclass(frozen=True)
class CachePrices:
    """A prompt cache's prices as multiples of the input price, and the shortest prefix
    it stores (``min_tokens``; 0: any)."""

    read: float
    write: float
    min_tokens: int = 0
    label: str = ""

    def __post_init__(self) -> None:
        if not (0 <= self.read <= self.write) or self.min_tokens < 0:
            raise ValueError(
                f"cache prices need 0 <= read <= write and min_tokens >= 0, got {self!r}"
            )

    @classmethod
    def for_model(cls, info: ModelInfo) -> CachePrices:
        """The registry's prices for ``info``: ``cached_input`` and ``cache_write`` over
        ``input`` (a price the provider does not have is the input price: no discount, no
        surcharge), and its ``cache_min_tokens``."""
        price = info.price
        base = price.input or 1.0
        read = (price.cached_input if price.cached_input is not None else price.input) / base
        write = (price.cache_write if price.cache_write is not None else price.input) / base
        if not price.input:
            read = write = 1.0
        return cls(read, max(write, read), info.cache_min_tokens, f"{info.name} cache prices")

    def call(self, input_tokens: int, shared_tokens: int) -> float:
        """One call's input cost in input-token equivalents (see the module docstring)."""
        shared = min(shared_tokens, input_tokens)
        if shared < self.min_tokens:
            shared = 0
        return self.read * shared + self.write * (input_tokens - shared)


ANTHROPIC = CachePrices(0.1, 1.25, label="Anthropic 0.1x read / 1.25x write")
"""Anthropic's 5-minute cache, idealised (no minimum): the bench's headline prices."""

OPENAI = CachePrices(0.1, 1.0, label="OpenAI-style 0.1x read / 1x write")
"""A cache without a write charge (OpenAI's newer models, Gemini, DeepSeek), idealised."""


@dataclass(frozen=True)
class CallPrefix:
    """One call as a cache sees it: its input tokens, the tokens of its start that repeat
    the previous call's context, and whether the previous context is a whole prefix of
    this one (nothing sent before was changed: an append-only call)."""

    input_tokens: int
    shared_tokens: int
    whole_prefix: bool


@dataclass(frozen=True)
class CacheCost:
    """A session's calls priced at one cache's prices."""

    calls: int
    input_tokens: int
    shared_tokens: int
    units: float  # input-token equivalents: dollars = units * price.input / 1e6
    whole_prefix_calls: int  # calls after a session's first whose previous context is a prefix
    later_calls: int  # calls after a session's first

    @property
    def whole_prefix_share(self) -> float:
        """The share of calls (after the first) whose previous context is a whole prefix."""
        return self.whole_prefix_calls / self.later_calls if self.later_calls else 1.0

    def __add__(self, other: CacheCost) -> CacheCost:
        return CacheCost(
            self.calls + other.calls,
            self.input_tokens + other.input_tokens,
            self.shared_tokens + other.shared_tokens,
            self.units + other.units,
            self.whole_prefix_calls + other.whole_prefix_calls,
            self.later_calls + other.later_calls,
        )


def session_cache_cost(calls: Iterable[CallPrefix], prices: CachePrices) -> CacheCost:
    """The calls of one session (in order; the first has nothing cached) at ``prices``."""
    n = tokens = shared = whole = 0
    units = 0.0
    for i, c in enumerate(calls):
        n += 1
        tokens += c.input_tokens
        shared += c.shared_tokens
        units += prices.call(c.input_tokens, c.shared_tokens)
        whole += bool(i and c.whole_prefix)
    return CacheCost(n, tokens, shared, units, whole, max(n - 1, 0))


def rewrite_pays(
    kept_tokens: int,
    rewritten_tokens: int,
    freed_tokens: int,
    calls_until_next: float,
    prices: CachePrices,
) -> bool:
    """Whether a rewrite that frees ``freed_tokens`` is cheaper than keeping them.

    Breaking the prefix after ``kept_tokens`` (still served from the cache) writes
    ``rewritten_tokens`` once at the write price instead of reading them (plus the freed
    tokens) at the read price; keeping reads ``freed_tokens`` more on each of the
    ``calls_until_next`` calls the rewrite would have covered. So a rewrite pays when::

        (write - read) * rewritten  <  read * freed * calls_until_next

    ``kept_tokens`` counts only for the cache's minimum: a kept prefix below it is not
    cached, so the rewrite costs nothing extra there.
    """
    if kept_tokens + rewritten_tokens < prices.min_tokens:
        return True
    extra = (prices.write - prices.read) * rewritten_tokens
    return extra < prices.read * freed_tokens * calls_until_next


def tail_edit_pays(
    rewritten_tokens: int,
    freed_tokens: int,
    calls_until_next: float,
    calls_so_far: int,
    low_water: float,
    prices: CachePrices,
) -> bool:
    """Whether an edit near the end of a held context (a cut of a result sent whole)
    is worth rewriting the ``rewritten_tokens`` that follow it, between compactions.

    The tokens it frees are saved twice: read on each call until the next compaction,
    and room the context no longer fills, so that compaction comes later. A compaction
    takes the context down to its low-water mark (``low_water``, a share of the room:
    ``window.refill_ratio``) and rewrites it, so each token of room saves about
    ``low_water / (1 - low_water)`` tokens written at compactions over a long loop
    (0.5: one). Both savings need the loop to go on, and how long it will is unknown;
    with nothing but the ``calls_so_far`` (``k``) to go by, the chance that it lasts
    ``n`` more calls is taken as ``k / (k + n)`` (a loop that has run ``k`` calls is as
    likely to stop before ``k`` more as after), so the reads are expected over
    ``k * ln(1 + n / k)`` calls and the room pays with chance ``k / (k + n)``, ``n`` the
    ``calls_until_next`` compaction. It pays when::

        (write - read) * rewritten  <  read * freed * k * ln(1 + n / k)
                                       + (write - read) * freed * q / (1 - q) * k / (k + n)

    with ``q`` the low-water share (at most 0.9).
    """
    if freed_tokens <= 0:
        return False
    premium = prices.write - prices.read
    k = max(calls_so_far, 1)
    n = max(calls_until_next, 0.0)
    q = min(max(low_water, 0.0), 0.9)
    reads = prices.read * freed_tokens * k * math.log1p(n / k)
    room = premium * freed_tokens * q / (1 - q) * k / (k + n)
    return premium * rewritten_tokens < reads + room


def cautious_prices(own: CachePrices) -> CachePrices:
    """The prices a rewrite is weighed at when the caller did not name them: the model's
    own, or Anthropic's when those put a higher premium on writing over reading (a
    rewrite is paid for certain, its saving is a forecast; and the price a call pays
    depends on the provider that serves the model, which a model name does not tell: a
    gateway, a newer cache tier). The model's cache minimum is kept."""

    def premium(p: CachePrices) -> float:
        return (p.write - p.read) / p.read if p.read > 0 else math.inf

    if premium(own) >= premium(ANTHROPIC):
        return own
    return replace(ANTHROPIC, min_tokens=own.min_tokens, label=f"{ANTHROPIC.label} (cautious)")
