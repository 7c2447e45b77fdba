"""Cache-aware compaction (R21): between compactions the context is append-only.

Providers cache the prompt prefix: a call pays ~0.1x for what repeats the previous call
from the start and 1-1.25x for the rest. A context that changes anything already sent (the
window slid one message, a mask landed on an older result, the ledger or a layer changed)
rewrites everything after the change at the write price, and an agent loop that does so on
most calls pays more than sending the whole history with caching. So a build with a
previous state first runs *held* (:attr:`~ctxwarden.steps.base.StepContext.hold`): every
message the previous context sent is sent again as it was, new messages are appended (cut
or masked as the policy says, since they were never sent), nothing is dropped. When that
fits the budget and keeps the previous context whole at the front, it is sent. When it
does not — over budget, the window would have to move, a layer or the ledger changed, or
an editing step found a change worth its rewrite at the build's cache prices
(:func:`~ctxwarden.core.registry.cache_cost.rewrite_pays`; the policy's ``[cache] prices``,
cautious by default) — the build runs again unheld: a
*compaction*, one move that applies every pending mask and cut, slides the window down to
its low-water mark (``window.refill_ratio`` of its room, so the next calls append for a
while) and renders the ledger once (the ledger block it sent before stays in place, the
new values go in a block after it: :func:`~ctxwarden.steps.ledger.stacked_ledger`). The
audit records the break, its cause and its cost (:class:`PrefixBreak`).

One change is made between compactions: a *tail edit*
(:func:`~ctxwarden.steps.edit.tail_edit`). A long result sent whole while the model had
not answered it is cut once it has been answered (twice) when that pays: the cut sits near
the end of the context, so only what follows it is written again, not the whole window,
and the room it frees puts the next compaction off. The build stays held (the window and
the ledger as they were); the audit records the break with its cause.

What the decision needs from the last builds lives in
:class:`~ctxwarden.steps.state.BuildState` (the previous context's digests, its tokens,
the tokens right after the last compaction and the calls since), never in a module cache.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden.core.errors import ConfigError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.cache_cost import (
    ANTHROPIC,
    OPENAI,
    CacheCost,
    CachePrices,
    CallPrefix,
    cautious_prices,
    session_cache_cost,
)
from ctxwarden.core.registry.catalog import ModelInfo
from ctxwarden.steps.base import Action, Draft
from ctxwarden.steps.fit import EARLIER
from ctxwarden.steps.layers import HELD_VIEW_SHARE, held_layers, layers_key, layers_sent
from ctxwarden.steps.state import BuildState

__all__ = [
    "HELD_VIEW_SHARE",
    "RECALL_MOVED",
    "CacheConfig",
    "LoopReplay",
    "PrefixBreak",
    "first_difference",
    "growth_per_call",
    "held_cause",
    "held_layers",
    "layers_key",
    "layers_sent",
    "loop_turns",
    "prefix_break",
    "recall_moved",
    "replay_loop",
    "window_per_turn",
]

_NAMED = {"anthropic": ANTHROPIC, "openai": OPENAI}


@dataclass(frozen=True)
class CacheConfig:
    """The ``[cache]`` section of a policy.

    ``append_only`` (default on): between compactions nothing already sent changes (see
    the module docstring); off, every build applies its masks, cuts and window moves at
    once, as before. ``prices`` are the cache prices the rewrite decision weighs:
    ``"cautious"`` (the default: the model's, or Anthropic's when those put a higher
    premium on writing over reading, :func:`~ctxwarden.core.registry.cache_cost.cautious_prices`),
    ``"model"`` (the registry's ``cached_input`` / ``cache_write`` for the model; a model
    the registry does not price is taken as Anthropic's), ``"anthropic"`` (0.1x / 1.25x)
    or ``"openai"`` (0.1x / 1x). The audit prices a break at the model's own prices
    unless a provider is named. ``hold_layers`` (default on) holds the facts and summary
    blocks as they were sent, between compactions and through them
    (:func:`held_layers`), until a build's view of them shows mostly other lines: a summary
    view focused on each new user message would otherwise rewrite everything after it at
    every call of a chat, and at every compaction, where only the window had to move. The
    request's own detail comes from the recall block at the tail. LoCoMo dev at 4,000
    tokens, fed session by session, answer recall / the chat loop's cost against the full
    history with caching: 0.6601 / 87% on; 0.687 / 271% off (the view renewed at every
    call). ``hold_layers = false`` renews them at every build, as before.

    ``early_compaction`` (default on): a held build that fits, but whose masks or cuts
    were held back (:func:`~ctxwarden.steps.edit.hold_sent`), also runs the compaction,
    and sends it instead when applying them now pays for the rewrite
    (:func:`~ctxwarden.core.registry.cache_cost.rewrite_pays`). Weighing it foresees the
    compaction first without the ledger's work (the blocks as sent: a tenth of a
    compacting build) and builds it only when that forecast is near paying
    (:data:`~ctxwarden.pipeline.engine.FORECAST_MARGIN`): on the swebench-mini dev runs
    at 8,000 tokens 824 of 1,669 calls weigh one, 386 build it, 30 send it (the same
    contexts as building every one; the loop's build CPU 3.2 -> 2.5 ms a call); at 4,000
    342, 69 and 2. Before the forecast (session 38's figures, on / off): at 8,000 tokens
    857 of 1,669 builds ran that second build and 27 sent it, 56% of the builds' CPU (at
    4,000: 324 and 3, 19%); the loop cost
    68.96% / 69.22% of the full history with caching at Anthropic's prices and 43.0% /
    43.5% at gpt-4o's own ($20.71 / $21.02), retention .9846 / .9855; at 4,000 56.74% /
    56.62%, retention .959 both; tau-bench @4,000 99.54% / 99.46%, @2,000 the same
    contexts. Off suits a proxy that counts its CPU more than ~1% of a coding loop's
    input cost.

    Why cautious (issue 37; the dev traces replayed with gpt-4o, whose cache reads cost
    0.5x, measured at Anthropic's 0.1x / 1.25x against the full history with caching):
    weighed at gpt-4o's own prices, a held-back mask or cut looks worth a rewrite of the
    whole window ~350 times on the coding runs at 8,000 tokens (89.0% of the full
    history's cost; tau-bench @4,000 100.2%); weighed cautiously, 77.7% and 99.96%
    (76.4% and 99.5% with the tail edits of :func:`~ctxwarden.steps.edit.tail_edit`), at
    the same or higher retention. At gpt-4o's own prices the cautious default costs a
    little more (coding @8,000 45% of the full history instead of 42%), at OpenAI-style
    0.1x / 1x less (71% instead of 81%).
    """

    append_only: bool = True
    prices: str = "cautious"
    hold_layers: bool = True
    early_compaction: bool = True

    def __post_init__(self) -> None:
        if self.prices not in ("cautious", "model") and self.prices not in _NAMED:
            raise ConfigError(
                "cache.prices must be 'cautious', 'model', 'anthropic' or 'openai', "
                f"got {self.prices!r}"
            )

    def prices_for(self, info: ModelInfo | None) -> CachePrices:
        """The prices a break is priced at in the audit: the named provider's, else the
        model's (Anthropic's for a model the registry does not know)."""
        if self.prices in _NAMED:
            return _NAMED[self.prices]
        return CachePrices.for_model(info) if info is not None else ANTHROPIC

    def decision_prices(self, info: ModelInfo | None) -> CachePrices:
        """The prices a rewrite is weighed at (see the class docstring)."""
        own = self.prices_for(info)
        return cautious_prices(own) if self.prices == "cautious" else own


@dataclass(frozen=True)
class PrefixBreak:
    """A build that did not keep the previous context whole at its front.

    ``at`` is the position (in the new context) of the first message that differs,
    ``shared_tokens`` what the cache still serves before it, ``rewritten_tokens`` what
    the call writes again that the previous context had already sent (new messages are
    written anyway), ``cause`` why, and ``cost_units`` what rewriting costs over reading
    them, in input tokens at the input price (``(write - read) * rewritten_tokens`` at
    the build's cache prices; ``cost_usd`` the same in dollars when the model is priced).
    """

    at: int
    shared_tokens: int
    rewritten_tokens: int
    cause: str
    cost_units: float
    cost_usd: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "shared_tokens": self.shared_tokens,
            "rewritten_tokens": self.rewritten_tokens,
            "cause": self.cause,
            "cost_units": round(self.cost_units, 1),
            "cost_usd": self.cost_usd,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrefixBreak:
        cost = data.get("cost_usd")
        return cls(
            int(data["at"]),
            int(data["shared_tokens"]),
            int(data["rewritten_tokens"]),
            str(data["cause"]),
            float(data["cost_units"]),
            None if cost is None else float(cost),
        )


def held_cause(
    draft: Draft,
    actions: Sequence[Action],
    total: int,
    budget: int,
    previous: Sequence[str],
    digests: Sequence[str],
) -> str | None:
    """Why a held build cannot be sent (``None``: it can): the reason to compact. (What an
    editing step held back, ``draft.compact``, is weighed apart: :func:`rewrite_pays`.)"""
    if total > budget:
        return f"over budget ({total:,} of {budget:,} tokens)"
    moved = sum(1 for a in actions if a.action in ("dropped", "evicted") and a.strategy != EARLIER)
    if moved:
        return f"the window must move ({moved} message(s) leave it)"
    n = len(previous)
    if draft.edited_from:  # a tail edit: the context may differ from that message on
        at = next((i for i, m in enumerate(draft.ordered) if m.id == draft.edited_from), n)
        n = min(n, at)
        previous = previous[:n]
    if tuple(digests[:n]) != tuple(previous):
        at = first_difference(previous, digests)
        if recall_moved(draft, previous, digests, at):
            return None
        layer = draft.layer_of.get(draft.ordered[at].id, "?") if at < len(draft.ordered) else "?"
        return f"the {layer} changed"
    return None


def first_difference(previous: Sequence[str], digests: Sequence[str]) -> int:
    """The position of the first digest that differs from the previous context's
    (``len(previous)`` when none of those both hold does)."""
    return next(
        (i for i, (a, b) in enumerate(zip(previous, digests, strict=False)) if a != b),
        len(previous),
    )


RECALL_MOVED = "the recall block follows the new request (only what came after it is written again)"
"""The cause a held build's break is audited with when :func:`recall_moved`."""


def recall_moved(
    draft: Draft, previous: Sequence[str], digests: Sequence[str], at: int | None = None
) -> bool:
    """Whether the one difference from the previous context is the recall block it sent
    right before its newest user message: the block follows the request
    (:mod:`~ctxwarden.steps.recall_relevant`), so a held build places the new one before
    the new request and the old one is gone. Everything before it is as sent and
    everything after it follows on, so the cache still serves the prefix up to it and
    only the short tail after it is written again; compacting for it would rewrite the
    whole window on every call of a chat (LoCoMo dev at 4,000 tokens: 69% of the calls).
    Read from the digests alone (every path has them, not every path the recall memo):
    the previous context, less the message at the first difference, must be a prefix of
    this one, and that message must have sat before a user message."""
    n = len(previous)
    if at is None:
        if tuple(digests[:n]) == tuple(previous):
            return False  # the whole previous context is a prefix: nothing moved
        at = first_difference(previous, digests)
    if at >= n or at >= len(draft.ordered) or draft.ordered[at].role != "user":
        return False
    rest = previous[at + 1 :]
    return tuple(digests[at : at + len(rest)]) == tuple(rest)


def loop_turns(history: Sequence[Message], new: Sequence[Message], state: BuildState) -> int:
    """The whole history's assistant turns (the loop's model calls so far): the previous
    build's plus the ``new`` messages' (counted over ``history`` on a cold build)."""
    if state.history_length:
        return state.turns + sum(m.role == "assistant" for m in new)
    return sum(m.role == "assistant" for m in history)


def window_per_turn(window: Sequence[Message], count: Callable[[Message], int]) -> float:
    """Tokens per assistant turn over the window (the history from its start on): what a
    call of this loop adds, on average (:func:`growth_per_call`). Read from the window,
    which every path holds whole (a session reads each message from the window start), not
    from the whole history, which only ``build_context`` holds: the paths would weigh a
    rewrite differently (tau-bench dev run 47, call 26: a session held what
    ``build_context`` compacted), and a cold build would count every message."""
    turns = sum(m.role == "assistant" for m in window)
    return sum(map(count, window)) / turns if turns else 0.0


def growth_per_call(
    prev_tokens: int, compacted_tokens: int, held_calls: int, new: int, per_turn: float
) -> float:
    """Tokens a call adds: on average since the last compaction; with no such history
    yet, the larger of this call's new messages (``new``) and the window's tokens per
    assistant turn (``per_turn``, :func:`window_per_turn`): one short reply must not make
    the next compaction look hundreds of calls away, and so a rewrite look paid for many
    times over."""
    if held_calls > 0 and prev_tokens > compacted_tokens:
        return (prev_tokens - compacted_tokens) / held_calls
    return float(max(new, per_turn))


def prefix_break(
    previous: Sequence[str],
    digests: Sequence[str],
    ordered: Sequence[Message],
    counts: Sequence[int],
    new_ids: frozenset[str],
    cause: str,
    prices: CachePrices,
    info: ModelInfo | None,
) -> PrefixBreak | None:
    """The break between the previous context (its digests) and this one, if any."""
    n = len(previous)
    if not n or tuple(digests[:n]) == tuple(previous):
        return None
    at = first_difference(previous, digests)
    shared = sum(counts[:at])
    rewritten = sum(
        c for m, c in zip(ordered[at:], counts[at:], strict=True) if m.id not in new_ids
    )
    units = (prices.write - prices.read) * rewritten
    usd = units * info.price.input / 1_000_000 if info is not None else None
    return PrefixBreak(at, shared, rewritten, cause, units, usd)


@dataclass(frozen=True)
class LoopReplay:
    """A transcript replayed as an agent loop (:func:`replay_loop`): the last build (its
    ``previous`` the build before), and the loop's cost at the build's cache prices
    beside the full history's with caching."""

    built: Any  # the last BuiltContext
    cost: CacheCost
    full_cost: CacheCost
    prices: CachePrices

    @property
    def cost_vs_full(self) -> float:
        return self.cost.units / self.full_cost.units if self.full_cost.units else 0.0


def replay_loop(
    messages: Sequence[Message],
    *,
    build: Callable[[Sequence[Message], Any], Any],
    count: Callable[[Message], int],
    prices: CachePrices,
) -> LoopReplay:
    """Build ``messages`` as an agent loop sends them: a build before every assistant
    message (``build(history, previous)``, chained), then one of the whole transcript;
    each call priced at ``prices`` from its audit (input tokens, prefix shared with the
    previous build), and the full history of the same calls, which only appends."""
    points = [k for k, m in enumerate(messages) if m.role == "assistant" and k]
    points.append(len(messages))
    calls: list[CallPrefix] = []
    full: list[CallPrefix] = []
    previous: Any = None
    sent = 0
    total = 0
    upto = 0
    for k in points:
        previous = build(messages[:k], previous)
        audit = previous.audit
        whole = audit.prefix_break is None and bool(calls)
        calls.append(CallPrefix(audit.input_tokens, audit.prefix_shared_tokens, whole))
        total += sum(map(count, messages[upto:k]))
        upto = k
        full.append(CallPrefix(total, sent, bool(full)))
        sent = total
    return LoopReplay(
        previous,
        session_cache_cost(calls, prices),
        session_cache_cost(full, prices),
        prices,
    )
