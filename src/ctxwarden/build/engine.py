"""``build_context``: the cascade, the layout and the audit in one pass (R4–R11).

The build is O(window + new messages), never O(history): the window start is sticky
(it only moves forward, remembered in :class:`~ctxwarden.build.audit.BuildState`), the
strategies run on the window alone, token counts and entity extraction are cached per
message. A cold build (no previous state) finds the start by walking back from the
newest message.

Layout (R10), stable parts first so provider caches reuse the prefix::

    [system prompt][facts][ledger][summary][pinned][window ... newest message]
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ctxwarden.build.audit import LAYERS, Audit, BuildState
from ctxwarden.build.pairing import Block, group_blocks
from ctxwarden.memory.entity_ledger import EntityLedger
from ctxwarden.errors import BudgetError
from ctxwarden.memory.facts import FactSchema
from ctxwarden.formats.anthropic import MAX_CACHE_BREAKPOINTS, messages_to_anthropic
from ctxwarden.formats.openai import messages_from_openai, messages_to_openai
from ctxwarden.steps.ledger import LedgerBuilder
from ctxwarden.messages import Message
from ctxwarden.build.policy import Policy
from ctxwarden.registry.catalog import ModelInfo, Registry
from ctxwarden.steps.base import Action, ActionKind, StrategyContext
from ctxwarden.steps.priority import eviction_order
from ctxwarden.memory.summaries import Summarizer
from ctxwarden.steps.layers import LayerState, update_layers
from ctxwarden.tokens.counter import REPLY_PRIMING, TokenCounter

__all__ = ["BuiltContext", "build_context"]

_STABLE_LAYERS = frozenset({"system", "facts", "ledger", "summary", "pinned"})
# Anthropic cache breakpoints go at the end of each of these groups of stable layers.
_BREAKPOINT_GROUP = {"system": 0, "facts": 1, "ledger": 1, "summary": 1, "pinned": 2}


@dataclass(frozen=True)
class BuiltContext:
    """The context to send, what was done to build it, and what the next build needs."""

    messages: tuple[Message, ...]
    audit: Audit
    state: BuildState
    model: str
    layers: Mapping[str, str]  # message id -> layer name

    @property
    def input_tokens(self) -> int:
        return self.audit.input_tokens

    def to_openai(self) -> list[dict[str, Any]]:
        """OpenAI chat messages, ready to send."""
        return messages_to_openai(self.messages)

    def to_anthropic(self) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]]]:
        """``(system, messages)`` for the Anthropic API, ``cache_control`` placed."""
        return messages_to_anthropic(self.messages, cache_breakpoints=self.audit.cache_breakpoints)


def _as_messages(messages: Iterable[Message | Mapping[str, Any]], known: int = 0) -> list[Message]:
    """Messages as a list; ``known`` leading items were Messages in the previous build,
    so only the new ones are checked (an agent loop stays O(new messages))."""
    items = messages if type(messages) is list else list(messages)
    if (
        0 < known <= len(items)
        and isinstance(items[known - 1], Message)
        and all(isinstance(m, Message) for m in items[known:])
    ):
        return items  # type: ignore[return-value]
    if all(isinstance(m, Message) for m in items):
        return items  # type: ignore[return-value]
    return messages_from_openai(items)


def _resume(previous: BuiltContext | BuildState | None, history: Sequence[Message]) -> BuildState:
    """The previous state if ``history`` extends the history it was built from."""
    state = previous.state if isinstance(previous, BuiltContext) else previous
    if state is None or state.history_length == 0 or state.history_length > len(history):
        return BuildState()
    if history[state.history_length - 1].id != state.last_id:
        return BuildState()
    return state


def _leading_system(history: Sequence[Message]) -> int:
    i = 0
    while i < len(history) and history[i].role == "system":
        i += 1
    return i


def _newest_user(history: Sequence[Message], start: int) -> int | None:
    for i in range(len(history) - 1, start - 1, -1):
        if history[i].role == "user":
            return i
    return None


def _pinned(history: Sequence[Message], sys_end: int, pin_first: int, limit: int) -> list[int]:
    """Indices before ``limit`` that are pinned: the first N (block-aligned), flags, critical."""
    out: list[int] = []
    i, taken = sys_end, 0
    while i < limit and taken < pin_first:
        out.append(i)
        taken += 1
        i += 1
        while i < limit and history[i].role == "tool":  # keep a call with its results
            out.append(i)
            i += 1
    out.extend(j for j in _flagged(history, sys_end, limit) if j >= i)
    return _pair_safe(history, out, limit)


# Flagged (pinned / critical) positions per conversation, extended as the window moves:
# history is append-only and the window start only grows, so each build scans only the
# messages that left the window since the last one, not the whole history.
_FLAGGED: dict[str, tuple[int, str, tuple[int, ...]]] = {}


def _flagged(history: Sequence[Message], sys_end: int, limit: int) -> tuple[int, ...]:
    if limit <= sys_end:
        return ()
    anchor = history[sys_end].fingerprint
    scanned, last, found = _FLAGGED.get(anchor, (sys_end, "", ()))
    if not (sys_end < scanned <= limit and history[scanned - 1].fingerprint == last):
        scanned, found = sys_end, ()
    extra = tuple(
        j
        for j in range(scanned, limit)
        if (history[j].pinned or history[j].priority == "critical") and history[j].role != "system"
    )
    found = found + extra
    if len(_FLAGGED) > 256:
        _FLAGGED.clear()
    _FLAGGED[anchor] = (limit, history[limit - 1].fingerprint, found)
    return tuple(j for j in found if j < limit)


def _pair_safe(history: Sequence[Message], indices: list[int], limit: int) -> list[int]:
    """Extend pinned indices to whole blocks (a pinned call brings its results and back)."""
    chosen = set(indices)
    for i in list(indices):
        start = i
        while start > 0 and history[start].role == "tool":
            start -= 1
        end = start + 1
        while end < limit and history[end].role == "tool":
            end += 1
        chosen.update(range(start, end))
    return sorted(chosen)


def _align(history: Sequence[Message], start: int) -> int:
    while start < len(history) and history[start].role == "tool":
        start += 1
    return start


def _cold_start(history: Sequence[Message], sys_end: int, room: int, counter: TokenCounter) -> int:
    """Walk back from the newest message until well past what the room can hold."""
    acc, i = 0, len(history)
    while i > sys_end and acc <= 3 * room:
        i -= 1
        acc += min(counter.count_message(history[i]), room)
    return i


def build_context(
    messages: Iterable[Message | Mapping[str, Any]],
    model: str = "gpt-4o",
    max_input_tokens: int | None = None,
    *,
    policy: Policy | None = None,
    previous: BuiltContext | BuildState | None = None,
    summary: str | None = None,
    facts: str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    summarizer: str | Summarizer | None = None,
    facts_schema: FactSchema = None,
    earlier_entities: EntityLedger | None = None,
    registry: Registry | None = None,
) -> BuiltContext:
    """Build the context to send: within budget, pair-safe, stable prefix first, audited.

    ``messages`` are OpenAI dicts or :class:`Message` s (pass Messages in an agent loop:
    parsing dicts costs O(history)). ``previous`` is the last build (or its ``state``)
    so decisions stay sticky. ``summary`` and ``facts`` are layer texts you manage
    yourself; or pass ``summarizer`` (``"offline"``, a provider spec such as
    ``"openai:gpt-4o-mini"``, or a summariser object) and ctxwarden keeps a rolling
    summary and the facts (``facts_schema``: a pydantic model or JSON schema) when the
    policy's ``summary`` trigger fires, carrying them in the build's state.
    ``earlier_entities`` is the ledger of messages older than ``messages`` (a session
    passes the values of the history it did not read, so its ledger reaches back).
    ``registry`` is where ``model`` is looked up (default: the built-in registry plus
    ``CTXWARDEN_MODELS``): a user's model builds with its own window, counts and prices.
    """
    policy = policy or Policy()
    prior = previous.state if isinstance(previous, BuiltContext) else previous
    history = _as_messages(messages, prior.history_length if prior is not None else 0)
    counter = TokenCounter.for_model(model, registry)
    info = _model_info(model, registry)
    budget = policy.budget_for(info.context_window if info else None, max_input_tokens)
    state = _resume(previous, history)
    build = _Build(
        history, model, budget, policy, counter, state, summary, facts, tools, earlier_entities
    )
    if summarizer is not None:
        build.add_layers(summarizer, facts_schema)
    return build.run(info)


@lru_cache(maxsize=256)
def _prompt_cache_key(system: tuple[str, ...], model: str) -> str:
    """The ``prompt_cache_key`` for a system prompt and model (stable across builds)."""
    return "cw-" + hashlib.sha1(("".join(system) + model).encode()).hexdigest()[:16]


def _model_info(model: str, registry: Registry | None = None) -> ModelInfo | None:
    """The registry's entry for ``model``; ``None`` for a model counted by its name's
    family alone (no window, no prices: the budget must be given)."""
    from ctxwarden.errors import UnknownModelError
    from ctxwarden.registry.catalog import get_model

    try:
        return get_model(model, registry)
    except UnknownModelError:
        return None


class _Build:
    """One build's working state; ``run`` does the cascade in order."""

    def __init__(
        self,
        history: list[Message],
        model: str,
        budget: int,
        policy: Policy,
        counter: TokenCounter,
        state: BuildState,
        summary: str | None,
        facts: str | None,
        tools: Sequence[Mapping[str, Any]] | None,
        earlier: EntityLedger | None = None,
    ):
        self.history, self.model, self.budget, self.policy = history, model, budget, policy
        self.counter, self.state, self.tools = counter, state, tools
        self.count = counter.count_message
        self.actions: list[Action] = []
        self.warnings: list[str] = []
        self.sys_end = _leading_system(history)
        self.system = history[: self.sys_end]
        self.layer_msgs: list[tuple[str, Message]] = []
        self.floor = 0
        self.layer_state: LayerState | None = None
        self.earlier = earlier  # the ledger of messages older than ``history``
        self.ledger_from = 0
        self.rejected: set[str] = set()
        if facts:
            self.layer_msgs.append(("facts", Message.system(facts, id="ctxwarden:facts")))
        if summary:
            self.layer_msgs.append(("summary", Message.system(summary, id="ctxwarden:summary")))

    def add_layers(self, summarizer: str | Summarizer, schema: FactSchema) -> None:
        """Run the summary/facts update and add their layers (before the cascade); the
        summary shown is its view for the newest user message (see summary_layer)."""
        update = update_layers(
            self.history,
            self.state.layers if isinstance(self.state.layers, LayerState) else None,
            spec=summarizer,
            trigger=self.policy.summary,
            schema=schema,
            count=self._as_sent,
            window=self.budget,
        )
        self.layer_state = update.state
        self.actions.extend(update.actions)
        self.warnings.extend(update.warnings)
        self.floor = update.state.cut
        for name, text in (("facts", update.facts_text), ("summary", update.summary_text)):
            if text:
                self.layer_msgs.append((name, Message.system(text, id=f"ctxwarden:{name}")))

    def _as_sent(self, message: Message) -> int:
        """A message's tokens as the cascade will send it, for the summary triggers: a tool
        result over the truncation threshold counts as its cut (one long search page must
        not read as a full context and fire a summary that the cut makes needless)."""
        tokens = self.count(message)
        cut = self.policy.truncate
        return tokens if cut is None else cut.sent_tokens(message, tokens)

    def _total(self, messages: Sequence[Message]) -> int:
        return sum(self.count(m) for m in messages)

    def run(self, info: Any) -> BuiltContext:
        h, policy = self.history, self.policy
        newest = _newest_user(h, self.sys_end)
        tools_tokens = self.counter.count_tools(self.tools)
        fixed = REPLY_PRIMING + tools_tokens + self._total(self.system)
        fixed += self._total([m for _, m in self.layer_msgs])
        protected = {h[newest].id} if newest is not None else set()
        minimum = fixed + (self.count(h[newest]) if newest is not None else 0)
        if minimum > self.budget:
            raise BudgetError(
                f"budget of {self.budget:,} tokens cannot hold the system prompt, layers and "
                f"the newest user message: budget must be at least {minimum:,} tokens",
                minimum=minimum,
            )
        ledger_cap = (
            min(policy.ledger.max_tokens, int((self.budget - fixed) * policy.ledger.max_share))
            if policy.ledger.enabled
            else 0
        )

        # Window start: sticky, or found by walking back (cold).
        start = max(self.state.window_start, self.sys_end)
        if self.state.history_length == 0:
            start = _cold_start(h, self.sys_end, self.budget - fixed, self.counter)
        start = max(start, self.floor)  # what the summary covers leaves the window
        start = _align(h, start)
        if newest is not None and start > newest:
            start = newest
        pinned_idx = _pinned(h, self.sys_end, policy.window.pin_first, start)
        self.ledger_from = self._ledger_from(start)
        if self.state.history_length == 0:
            self._report_cold_prefix(start, set(pinned_idx))
        pinned = [h[i] for i in pinned_idx]
        sticky = dict(self.state.sticky)
        ctx = StrategyContext(
            count=self.count,
            budget=self.budget,
            total=lambda ms: self.counter.count_messages(ms).tokens,
            protected=frozenset(protected),
            sticky=sticky,
            count_text=self.counter.count_text,
        )
        window = h[start:]
        for strategy in (policy.truncate, policy.mask):
            if strategy is not None:
                result = strategy(window, ctx)
                window = result.messages
                self.actions.extend(result.actions)
        originals = {m.id: m for m in h[start:]}
        blocks = self._sendable(group_blocks(window, start))
        pinned_tokens = self._total(pinned)
        ledger = LedgerBuilder(self.counter, ledger_cap, self.earlier)

        # Fit: drop oldest blocks (never the newest user message), refilling to a watermark.
        ledger_msg: Message | None = None
        room = 0
        for _ in range(4):
            edited = self._ledger_sources(blocks, originals, start)
            ledger_msg = ledger.render(h, self.ledger_from, start, pinned_idx, edited)
            room = (
                self.budget - fixed - pinned_tokens - (self.count(ledger_msg) if ledger_msg else 0)
            )
            used = sum(self._total(b.messages) for b in blocks)
            limit = policy.window.max_messages
            over_count = limit is not None and sum(len(b.messages) for b in blocks) > limit
            if used <= room and not over_count:
                break
            target = int(room * policy.window.refill_ratio) if used > room else room
            blocks, start = self._drop_oldest(blocks, target, protected, start, limit)
        else:  # four rounds of dropping: count what is left
            used = sum(self._total(b.messages) for b in blocks)
        if used > room:
            pinned, pinned_tokens, ledger_msg = self._evict(pinned, ledger_msg, ledger, used - room)

        # Layout and audit.
        layer_of: dict[str, str] = {m.id: "system" for m in self.system}
        ordered: list[Message] = list(self.system)
        facts_layers = [(name, m) for name, m in self.layer_msgs if name == "facts"]
        other_layers = [(name, m) for name, m in self.layer_msgs if name != "facts"]
        for name, m in [
            *facts_layers,
            *([("ledger", ledger_msg)] if ledger_msg else []),
            *other_layers,
        ]:
            ordered.append(m)
            layer_of[m.id] = name
        for m in pinned:
            ordered.append(m)
            layer_of[m.id] = "pinned"
        for b in blocks:
            for m in b.messages:
                ordered.append(m)
                layer_of[m.id] = (
                    "current" if newest is not None and b.start + 0 >= newest else "window"
                )
        return self._finish(ordered, layer_of, info, start, sticky, window)

    # -- steps ------------------------------------------------------------------------------

    def _ledger_from(self, start: int) -> int:
        """Where the ledger's sources begin: kept from the previous build, or on a cold
        build at most ``policy.ledger.lookback`` messages before the window."""
        lookback = self.policy.ledger.lookback
        if self.state.history_length:
            return max(self.sys_end, min(self.state.ledger_from, start))
        if lookback is None:
            return self.sys_end
        return max(self.sys_end, start - lookback)

    def _ledger_sources(
        self, blocks: list[Block], originals: Mapping[str, Message], start: int
    ) -> list[Message]:
        """Originals from the window whose values the context no longer shows: masked,
        dropped, or truncated without listing its cut values in place (a truncation that
        lists them keeps the ledger — near the top — unchanged, so the prefix stays cached).
        Rejected messages (a call still waiting for its results, an orphan result) are
        not: they are not history the agent saw, and a pending call is back next turn."""
        shown = {
            m.id
            for b in blocks
            for m in b.messages
            if m is originals[m.id] or ("values_listed" in m.meta and "masked_from" not in m.meta)
        }
        return [m for m in self.history[start:] if m.id not in shown and m.id not in self.rejected]

    def _report_cold_prefix(self, start: int, pinned: set[int]) -> None:
        """One action for everything before a cold build's window (counted when small);
        what the summary folded (before ``self.floor``) is reported as summarised instead."""
        gone = [i for i in range(max(self.sys_end, self.floor), start) if i not in pinned]
        if not gone:
            return
        h = self.history
        tokens = self._total([h[i] for i in gone]) if len(gone) <= 2000 else 0
        span = h[gone[0]].id if len(gone) == 1 else f"{h[gone[0]].id}..{h[gone[-1]].id}"
        reason = f"{len(gone)} older message(s) before the window"
        self.actions.append(Action(span, "dropped", reason, tokens, 0, "window"))

    def _sendable(self, blocks: list[Block]) -> list[Block]:
        """Blocks a provider accepts; the rest rejected."""
        out: list[Block] = []
        for b in blocks:
            if b.sendable:
                out.append(b)
                continue
            reason = (
                "tool result with no matching tool call before it"
                if b.orphan
                else f"tool call(s) {', '.join(b.unanswered)} without results"
            )
            for m in b.messages:
                self.rejected.add(m.id)
                self.actions.append(Action(m.id, "rejected", reason, self.count(m), 0, "pairing"))
        return out

    def _drop_oldest(
        self,
        blocks: list[Block],
        target: int,
        protected: set[str],
        start: int,
        max_messages: int | None,
    ) -> tuple[list[Block], int]:
        """Keep the protected block and the newest contiguous blocks that fit ``target``."""
        is_protected = [any(m.id in protected for m in b.messages) for b in blocks]
        used = sum(self._total(b.messages) for b, p in zip(blocks, is_protected, strict=True) if p)
        count = sum(len(b.messages) for b, p in zip(blocks, is_protected, strict=True) if p)
        keep: list[bool] = list(is_protected)
        for i in range(len(blocks) - 1, -1, -1):
            if is_protected[i]:
                continue
            tokens, size = self._total(blocks[i].messages), len(blocks[i].messages)
            if used + tokens > target or (max_messages is not None and count + size > max_messages):
                break
            keep[i] = True
            used += tokens
            count += size
        for b, kept in zip(blocks, keep, strict=True):
            if not kept:
                for m in b.messages:
                    reason = "left the window (budget)"
                    self.actions.append(Action(m.id, "dropped", reason, self.count(m), 0, "window"))
        kept_blocks = [b for b, k in zip(blocks, keep, strict=True) if k]
        return kept_blocks, max(kept_blocks[0].start if kept_blocks else start, start)

    def _evict(
        self, pinned: list[Message], ledger_msg: Message | None, ledger: LedgerBuilder, over: int
    ) -> tuple[list[Message], int, Message | None]:
        """Last resort (R9): shrink the ledger, then evict pinned messages by importance."""
        if ledger_msg is not None:
            before = self.count(ledger_msg)
            ledger_msg = ledger.shrink(ledger_msg, max(before - over, 0))
            after = self.count(ledger_msg) if ledger_msg else 0
            over -= before - after
            self.warnings.append(
                f"entity ledger cut from {before:,} to {after:,} tokens to fit the budget"
            )
        if over > 0 and pinned:
            for m in eviction_order(pinned):
                if over <= 0:
                    break
                tokens = self.count(m)
                pinned = [p for p in pinned if p.id != m.id]
                over -= tokens
                reason = "pinned, but the budget cannot hold it"
                self.actions.append(Action(m.id, "evicted", reason, tokens, 0, "priority"))
                self.warnings.append(f"pinned message {m.id} evicted to fit the budget")
        return pinned, self._total(pinned), ledger_msg

    def _finish(
        self,
        ordered: list[Message],
        layer_of: dict[str, str],
        info: Any,
        start: int,
        sticky: dict[str, ActionKind],
        window: list[Message],
    ) -> BuiltContext:
        h = self.history
        tools_tokens = self.counter.count_tools(self.tools)
        layers = dict.fromkeys(LAYERS, 0)
        layers["tools"] = tools_tokens
        layers["framing"] = REPLY_PRIMING
        fingerprints = tuple(m.fingerprint for m in ordered)
        prefix = self.state.prefix
        shared = cacheable = 0
        sharing = True
        exact = self.counter.exact and not self.tools
        measure = self.counter.measure
        for i, m in enumerate(ordered):  # one pass: tokens per layer, shared and stable prefix
            tokens, known = measure(m)
            exact = exact and known
            layer = layer_of[m.id]
            layers[layer] += tokens
            if layer in _STABLE_LAYERS:
                cacheable += tokens
            if sharing and i < len(prefix) and prefix[i] == fingerprints[i]:
                shared += tokens
            else:
                sharing = False
        total = REPLY_PRIMING + tools_tokens + sum(layers[name] for name in LAYERS)
        breakpoints = self._breakpoints(ordered, layer_of)
        new_sticky: dict[str, ActionKind] = {
            a.message_id: a.action for a in self.actions if a.action in ("masked", "truncated")
        }
        kept_ids = {m.id for m in window}
        new_sticky.update({k: v for k, v in sticky.items() if k in kept_ids})
        cost = effective = None
        if info is not None:
            from ctxwarden.registry.cost import estimate_cost
            from ctxwarden.registry.usage import Usage

            cost = estimate_cost(Usage(input_tokens=total), info)
            cached = min(shared, total)
            effective = estimate_cost(Usage(input_tokens=total, cached_input_tokens=cached), info)
        cache_key = _prompt_cache_key(tuple(m.fingerprint for m in self.system), self.model)
        audit = Audit(
            model=self.model,
            budget=self.budget,
            input_tokens=total,
            exact=exact,
            layers=layers,
            actions=tuple(self.actions),
            warnings=tuple(self.warnings),
            context_window=info.context_window if info is not None else None,
            history_messages=len(h),
            kept_messages=len(ordered),
            prefix_shared_tokens=shared,
            cacheable_prefix_tokens=cacheable,
            estimated_cost_usd=cost,
            effective_cost_usd=effective,
            prompt_cache_key=cache_key,
            cache_breakpoints=breakpoints,
        )
        state = BuildState(
            history_length=len(h),
            last_id=h[-1].id if h else "",
            window_start=start,
            sticky=new_sticky,
            prefix=fingerprints,
            layers=self.layer_state,
            ledger_from=self.ledger_from,
        )
        return BuiltContext(tuple(ordered), audit, state, self.model, layer_of)

    def _breakpoints(self, ordered: list[Message], layer_of: Mapping[str, str]) -> tuple[str, ...]:
        """Anthropic cache breakpoints: the end of each stable part, and the newest message."""
        if not self.policy.cache_breakpoints or not ordered:
            return ()
        last: dict[int, str] = {}
        for m in ordered:  # the stable parts come first: stop at the window
            group = _BREAKPOINT_GROUP.get(layer_of[m.id])
            if group is None:
                break
            last[group] = m.id
        marks = [last[g] for g in sorted(last)]
        marks.append(ordered[-1].id)
        unique = list(dict.fromkeys(marks))
        return tuple(unique[-MAX_CACHE_BREAKPOINTS:])
