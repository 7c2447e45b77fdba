"""Observation masking (R5, seed 003): old tool results become a one-line placeholder.

An agent rarely needs the raw output of a tool it called ten steps ago: what mattered
was said in its own reply, and the identifiers go to the entity ledger. So every tool
result older than the last ``keep_last`` results is replaced by a short placeholder;
the assistant's call stays, so the conversation remains well formed and the model can
see what it did (and call again if it must).

**Batching keeps the prompt cache warm.** Masking one more result on every turn would
change the prefix of every request and defeat prompt caching. Instead the masking
boundary moves in steps: walking the maskable results oldest first, a result is masked
only once the cumulative tokens of maskable results up to and including it fit below
the largest multiple of ``batch_tokens`` reached so far. The boundary therefore stays
put until another ``batch_tokens`` of maskable output has piled up beyond the
``keep_last`` window, then jumps past all of it at once, so consecutive builds share a
byte-identical prefix. This depends only on the messages (no state), and because
messages are only appended, a result once masked stays masked; an earlier build's
decisions (``ctx.sticky``) are honoured as well. A cache-aware compaction
(``ctx.compacting``, :mod:`ctxwarden.pipeline.compaction`) masks every maskable result at
once: the context is rewritten anyway, and what is masked in the same move need not
break the prefix again later.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from ctxwarden.core.caching import BoundedCache
from ctxwarden.core.errors import ConfigError
from ctxwarden.core.handles import handle_for
from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import counting_key
from ctxwarden.steps.base import Action, StrategyContext, StrategyResult, same_action
from ctxwarden.steps.tool_rules import clear_call_inputs, maskable_results

__all__ = ["DEFAULT_PLACEHOLDER", "MaskObservations"]

#: Fields: ``name`` (the tool), ``tokens`` (of the original result), ``id``, ``call_id``,
#: ``handle`` (``cw:msg:<id>``: the recall tool gives the original back by it).
DEFAULT_PLACEHOLDER = "[tool result masked to save context: {name}, {tokens} tokens; {handle}]"


_KEPT_ATTR = "_cw_mask_outcome"
"""A masked result's outcome in the last build, kept on the (frozen, never-changing)
message: ``(inputs, the masked copy or None, action)``. The outcome is a pure function of
the message, its tool's name, whether an earlier build masked it, the placeholder, the
strategy's name and ``keep_last`` (the reason says it) and the counter (``inputs``), so a
session's build reads back the ~100 results it masks every call instead of making the
placeholder's key, counting both texts and looking up the action again."""

# Placeholders already made, so every build sends the same object (its fingerprint and
# token count cached on it) instead of a new copy.
_MASKED: BoundedCache[tuple[str, str, str, str], tuple[Message, int]] = BoundedCache(
    "mask.placeholders", 8192, recency=False
)


def _masked(
    message: Message, placeholder: str, name: str, count: Callable[[Message], int]
) -> tuple[Message, int]:
    """The masked copy of ``message`` and its original tokens, made once per message."""
    key = (message.id, message.fingerprint, placeholder, name)
    found = _MASKED.get(key)
    if found is None:
        before = count(message)
        call_id = message.tool_call_id or ""
        text = placeholder.format(
            name=name,
            tokens=f"{before:,}",
            id=message.id,
            call_id=call_id,
            handle=handle_for(message.id),
        )
        found = _MASKED.put(key, (message.with_content(text, masked_from=before), before))
    return found


def is_masked(message: Message) -> bool:
    """Whether ``message`` is a masking placeholder (here or in a build it came back from)."""
    return "masked_from" in message.meta


@dataclass(frozen=True)
class MaskObservations:
    """Replace tool results older than the last ``keep_last`` by a placeholder, in batches.

    Defaults and why: ``keep_last=3`` keeps the results an agent is still reasoning
    about (a lookup, the follow-up, the action); ``batch_tokens=1000`` moves the cache
    boundary at most about once every two or three results of typical size; results
    under ``min_tokens=30`` (an "OK", an empty ``think``, a short error) are never
    masked — the placeholder would cost about as much and the text is worth keeping.
    With ``flush_over_budget`` (default on) all maskable results are masked at once when
    the conversation is over ``ctx.budget``, since the window would otherwise drop
    whole turns; with ``only_over_budget`` nothing new is masked while under budget.
    Pinned, ``critical`` and protected messages are never masked.
    """

    keep_last: int = 3
    batch_tokens: int = 1000
    min_tokens: int = 30
    placeholder: str = DEFAULT_PLACEHOLDER
    flush_over_budget: bool = True
    only_over_budget: bool = False
    name: str = field(default="mask")
    keeps_pairs: ClassVar[bool] = True  # masks results in place

    def __post_init__(self) -> None:
        if self.keep_last < 0:
            raise ConfigError(f"keep_last must be >= 0, got {self.keep_last}")
        if self.batch_tokens < 0:
            raise ConfigError(f"batch_tokens must be >= 0, got {self.batch_tokens}")
        try:
            self.placeholder.format(name="t", tokens=1, id="m", call_id="c", handle="h")
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"placeholder {self.placeholder!r} is not a valid template: {exc!r}; "
                "use the fields {name}, {tokens}, {id}, {call_id}, {handle}"
            ) from exc

    def _eligible(self, message: Message, ctx: StrategyContext) -> bool:
        return not (message.pinned or message.priority == "critical" or message.id in ctx.protected)

    def __call__(self, messages: Sequence[Message], ctx: StrategyContext) -> StrategyResult:
        results = [i for i, m in enumerate(messages) if m.role == "tool"]
        rules = ctx.tool_rules
        if rules:  # per-tool depths and exclusions (steps.tool_rules)
            older = maskable_results(messages, results, self.keep_last, rules)
        else:
            older = results[: max(len(results) - self.keep_last, 0)]
        to_mask: set[int] = set()
        maskable: list[int] = []
        for i in older:
            message = messages[i]
            if not self._eligible(message, ctx):
                continue
            if ctx.sticky.get(message.id) == "masked":
                to_mask.add(i)
                maskable.append(i)  # counted, so the batch grid is the same as without state
            elif ctx.count(message) >= self.min_tokens:
                maskable.append(i)

        over_budget = None if not self.only_over_budget else ctx.total(messages) > ctx.budget
        applied: tuple[list[Message], list[Action]] | None = None
        if maskable and ctx.compacting:  # the prefix is rewritten anyway: mask them all now
            to_mask.update(maskable)
        elif maskable and over_budget is not False:
            sizes = [ctx.count(messages[i]) for i in maskable]
            step = self.batch_tokens
            reached = sum(sizes) // step * step if step else sum(sizes)
            running = 0
            for i, size in zip(maskable, sizes, strict=True):
                running += size
                if running > reached:
                    break
                to_mask.add(i)
            rest = [i for i in maskable if i not in to_mask]
            if rest and self.flush_over_budget:
                if over_budget is None:  # the batch applied: kept unless it must flush
                    applied = self._apply(messages, to_mask, ctx)
                    over_budget = ctx.total(applied[0]) > ctx.budget
                if over_budget:
                    to_mask.update(rest)
                    applied = None

        out, actions = applied if applied is not None else self._apply(messages, to_mask, ctx)
        if rules:  # a masked result's call loses its arguments where the rule says so
            masked = {a.message_id for a in actions}
            actions.extend(clear_call_inputs(out, masked, rules, ctx, self.name))
        return StrategyResult(out, actions)

    def _apply(
        self,
        messages: Sequence[Message],
        to_mask: set[int],
        ctx: StrategyContext,
        record: bool = True,
    ) -> tuple[list[Message], list[Action]]:
        """``messages`` with ``to_mask`` masked, and (with ``record``) the actions saying
        so."""
        out = list(messages)
        actions: list[Action] = []
        if not to_mask:
            return out, actions
        names: dict[str, str] = {}
        last = max(to_mask)
        counter = counting_key(ctx.count)
        for i, message in enumerate(messages):
            if i > last:
                break
            for call in message.tool_calls:
                names[call.id] = call.name
            if i not in to_mask:
                continue
            name = message.name or names.get(message.tool_call_id or "", "tool")
            sticky = ctx.sticky.get(message.id) == "masked"
            depth: int | str = self.keep_last
            own = ctx.tool_rules.for_tool(name).keep_last if ctx.tool_rules else None
            if own is not None:  # the tool's own depth (steps.tool_rules)
                depth = f"{own} results of {name}"
            inputs = (name, sticky, self.placeholder, self.name, depth, counter)
            kept = message._memo.get(_KEPT_ATTR)
            if kept is not None and kept[0] == inputs:
                new, action = kept[1], kept[2]
            else:
                new, action = self._outcome(message, name, sticky, ctx, depth)
                if counter is not None:  # (None: a counter not known to be pure)
                    message._memo[_KEPT_ATTR] = (inputs, new, action)
            if new is None:
                continue
            out[i] = new
            if record:
                actions.append(action)
        return out, actions

    def _outcome(
        self,
        message: Message,
        name: str,
        sticky: bool,
        ctx: StrategyContext,
        depth: int | str | None = None,
    ) -> tuple[Message | None, Action]:
        """The masked copy of ``message`` (``None``: the placeholder is no shorter) and the
        action that says so."""
        new, before = _masked(message, self.placeholder, name, ctx.count)
        after = ctx.count(new)
        reason = (
            "masked in an earlier build (kept masked for a stable prefix)"
            if sticky
            else f"tool result older than the last {self.keep_last if depth is None else depth}"
        )
        action = same_action(message.id, "masked", reason, before, after, self.name)
        return (new if after < before else None), action
