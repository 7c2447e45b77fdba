"""Per-tool rules (``[tools.NAME]`` in the policy): one tool's results treated unlike the rest.

A coding agent's ``read_file`` of the file it is editing is not a stale ``ls``; a support
agent's ``get_reservation_details`` is the record every later turn reasons about. The
policy says so per tool (``"*"`` is the default for every tool; a named tool's keys win
over it)::

    [tools.read_todo]
    mask = false             # never masked (Anthropic's exclude_tools)
    [tools.search]
    keep_last = 1            # this tool's own masking depth: its last result stays
    clear_inputs = true      # a masked result's call loses its arguments too
    [tools.get_logs]
    truncate = "log"         # cut as this kind (false: never cut by the truncation step)
    [tools.get_user_details]
    pin = true               # its results are pinned (kept wherever they are)

:class:`ToolRules` is frozen data on the :class:`~ctxwarden.pipeline.policy.Policy`; the steps
that touch tool results read it (masking and truncation through
:class:`~ctxwarden.steps.base.StrategyContext`, the pins through :class:`PinResults`), so
no step reads another step's configuration. No ``[tools]`` table: no rule, and every step
behaves exactly as without this module.

**Budget still wins.** A pinned result is evicted, a result that must not be cut is cut,
when the budget cannot hold it otherwise (:mod:`~ctxwarden.steps.evict`);
:class:`~ctxwarden.steps.broken_rules.CheckToolRules` then warns, naming the rule that
was broken.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from ctxwarden.core.errors import ConfigError
from ctxwarden.core.handles import handle_for
from ctxwarden.core.kinds import RESULT_KINDS, ResultKind
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.steps.base import Action, Draft, StepContext, StepResult, same_action

__all__ = [
    "DEFAULT_TOOL",
    "PinResults",
    "ToolRule",
    "ToolRules",
    "as_kind",
    "clear_call_inputs",
    "maskable_results",
    "result_tool",
    "truncate_rule",
]

#: The key of the rule every tool gets (its own keys win over it).
DEFAULT_TOOL = "*"

_RULE_KEYS = ("mask", "keep_last", "truncate", "pin", "clear_inputs")


@dataclass(frozen=True)
class ToolRule:
    """The rule for one tool; ``None`` for a key it does not set (the step's default, or
    the ``"*"`` rule's value)."""

    mask: bool | None = None
    keep_last: int | None = None
    truncate: bool | str | None = None
    pin: bool | None = None
    clear_inputs: bool | None = None

    def check(self, where: str) -> None:
        """A :class:`ConfigError` naming ``where`` (``tools.NAME``) and the key for a bad
        value."""
        for key in ("mask", "pin", "clear_inputs"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"[{where}] {key} must be true or false, got {value!r}")
        k = self.keep_last
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ConfigError(f"[{where}] keep_last must be an integer >= 0, got {k!r}")
        t = self.truncate
        if t is not None and not isinstance(t, bool) and not _kind_name(t):
            raise ConfigError(
                f"[{where}] truncate must be true, false or a result kind "
                f"({', '.join(RESULT_KINDS)}, or one the policy's cutters add), got {t!r}"
            )

    def over(self, base: ToolRule) -> ToolRule:
        """This rule's keys, ``base``'s where it sets none."""
        return ToolRule(
            mask=base.mask if self.mask is None else self.mask,
            keep_last=base.keep_last if self.keep_last is None else self.keep_last,
            truncate=base.truncate if self.truncate is None else self.truncate,
            pin=base.pin if self.pin is None else self.pin,
            clear_inputs=base.clear_inputs if self.clear_inputs is None else self.clear_inputs,
        )

    def items(self) -> Iterator[tuple[str, Any]]:
        """The keys it sets, in TOML order."""
        return ((k, getattr(self, k)) for k in _RULE_KEYS if getattr(self, k) is not None)

    def describe(self) -> str:
        """``mask = false, keep_last = 2``: the keys as the policy file writes them."""
        return ", ".join(f"{k} = {_toml(v)}" for k, v in self.items()) or "(nothing)"


def _kind_name(value: Any) -> bool:
    return isinstance(value, str) and value.isidentifier()


def _toml(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)


_NO_RULE = ToolRule()


@dataclass(frozen=True)
class ToolRules:
    """Every tool's rule: ``rules`` is ``(tool name, rule)`` pairs (``"*"``: the default),
    sorted; a mapping of names to rules or to dicts of keys is accepted and checked."""

    rules: tuple[tuple[str, ToolRule], ...] = ()
    _resolved: dict[str, ToolRule] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        given: Any = self.rules
        items = given.items() if isinstance(given, Mapping) else given
        checked: dict[str, ToolRule] = {}
        for name, rule in items:
            checked[name] = _rule(name, rule)
        object.__setattr__(self, "rules", tuple(sorted(checked.items())))

    @classmethod
    def from_dict(cls, data: Any, source: str = "policy") -> ToolRules:
        """The ``[tools]`` table of a policy file; an unknown key or a bad value is a
        :class:`ConfigError` naming ``[tools.NAME]`` and the key."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: [tools] must be a table of [tools.NAME] tables")
        try:
            return cls(tuple(data.items()))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    def __bool__(self) -> bool:
        return bool(self.rules)

    def for_tool(self, name: str | None) -> ToolRule:
        """The rule of tool ``name``: its own keys over the ``"*"`` rule's."""
        key = name or ""
        found = self._resolved.get(key)
        if found is None:
            own = dict(self.rules)
            default = own.get(DEFAULT_TOOL, _NO_RULE)
            mine = own.get(key) if key != DEFAULT_TOOL else None
            found = mine.over(default) if mine is not None else default
            if len(self._resolved) < 4096:  # (bounded: tool names are few)
                self._resolved[key] = found
        return found

    def named(self, name: str | None, key: str) -> str:
        """Which table sets ``key`` for tool ``name``: ``tools.NAME`` or ``tools."*"``."""
        own = dict(self.rules)
        if name is not None and name in own and getattr(own[name], key) is not None:
            return f"tools.{name}"
        return f'tools."{DEFAULT_TOOL}"'

    def check_kinds(self, kinds: Collection[str]) -> None:
        """A :class:`ConfigError` naming ``[tools.NAME]`` for a ``truncate = "kind"`` that
        names no kind in ``kinds`` (the truncation step's cutters)."""
        for name, rule in self.rules:
            t = rule.truncate
            if isinstance(t, str) and t not in kinds:
                raise ConfigError(
                    f"[tools.{name}] truncate must be true, false or a kind with a cutter "
                    f"({', '.join(kinds)}), got {t!r}"
                )

    @property
    def pins(self) -> bool:
        """Whether any rule pins results."""
        return any(rule.pin for _, rule in self.rules)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The rules as the ``[tools]`` table of a policy file."""
        return {name: dict(rule.items()) for name, rule in self.rules}


def _rule(name: Any, rule: Any) -> ToolRule:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"[tools] keys are tool names, got {name!r}")
    where = f"tools.{name}"
    if isinstance(rule, Mapping):
        unknown = set(rule) - set(_RULE_KEYS)
        if unknown:
            raise ConfigError(
                f"unknown key(s) in [{where}]: {', '.join(sorted(map(str, unknown)))} "
                f"(known: {', '.join(_RULE_KEYS)})"
            )
        checked = ToolRule(**rule)
    elif isinstance(rule, ToolRule):
        checked = rule
    else:
        raise ConfigError(f"[{where}] must be a table, got {rule!r}")
    checked.check(where)
    return checked


# -- what the steps ask ------------------------------------------------------------------------


def result_tool(messages: Sequence[Message], index: int) -> str | None:
    """The tool that produced the result at ``index``: its ``name``, else its call's, found
    in the assistant message its block starts with; ``None`` when not a tool result or
    its call is not in ``messages``."""
    message = messages[index]
    if message.role != "tool":
        return None
    if message.name:
        return message.name
    i = index - 1
    while i >= 0 and messages[i].role == "tool":
        i -= 1
    if i >= 0:
        for call in messages[i].tool_calls:
            if call.id == message.tool_call_id:
                return call.name
    return None


def maskable_results(
    messages: Sequence[Message], results: Sequence[int], keep_last: int, rules: ToolRules
) -> list[int]:
    """The positions among ``results`` (the tool results, oldest first) masking may take:
    past the last ``keep_last`` results, or past its tool's own ``keep_last``; never a
    result of a tool whose rule says ``mask = false``."""
    names = [result_tool(messages, i) for i in results]
    rule_of = [rules.for_tool(n) for n in names]
    left: dict[str | None, int] = {}  # how many results of each tool are newer
    after = [0] * len(results)
    for j in range(len(results) - 1, -1, -1):
        after[j] = left.get(names[j], 0)
        left[names[j]] = after[j] + 1
    out: list[int] = []
    cut = len(results) - keep_last
    for j, i in enumerate(results):
        rule = rule_of[j]
        if rule.mask is False:
            continue
        if (after[j] >= rule.keep_last) if rule.keep_last is not None else (j < cut):
            out.append(i)
    return out


def truncate_rule(messages: Sequence[Message], index: int, rules: ToolRules) -> bool | str | None:
    """The ``truncate`` key of the rule of the result at ``index`` (``None``: not set)."""
    return rules.for_tool(result_tool(messages, index)).truncate


_KIND_ATTR = "_cw_rule_kind"


def as_kind(message: Message, rule: bool | str | None) -> Message:
    """``message`` as the kind a rule forces (``truncate = "log"``), the same copy every
    build; ``message`` itself when the rule names no kind, the kind it has, or a kind a
    message cannot have (one a policy's cutters add: the truncation step passes it on
    beside the message)."""
    if not isinstance(rule, str) or rule == message.kind or rule not in RESULT_KINDS:
        return message
    kept = message._memo.get(_KIND_ATTR)
    if kept is None or kept.kind != rule:
        kept = message._memo[_KIND_ATTR] = replace(message, kind=cast(ResultKind, rule))
    return cast(Message, kept)


CLEARED = '{{"ctxwarden": "arguments cleared to save context; {handle}"}}'
"""What a cleared call's arguments become: a JSON object (every provider takes one),
naming the handle the recall tool gives the original call back by."""

_CLEARED_ATTR = "_cw_cleared_inputs"


def clear_call_inputs(
    messages: list[Message], masked: set[str], rules: ToolRules, ctx: Any, strategy: str
) -> list[Action]:
    """Clear, in place in ``messages``, the arguments of each call whose result was masked
    (ids in ``masked``) where its tool's rule says ``clear_inputs = true``; the call itself
    (id, name) stays, so the pair stays whole. Returns the actions saying so."""
    actions: list[Action] = []
    if not masked:
        return actions
    clear: dict[str, str] = {}  # call id -> tool
    for i, m in enumerate(messages):
        if m.role == "tool" and m.id in masked and m.tool_call_id:
            name = result_tool(messages, i)
            if rules.for_tool(name).clear_inputs:
                clear[m.tool_call_id] = name or ""
    if not clear:
        return actions
    for i, m in enumerate(messages):
        ids = tuple(c.id for c in m.tool_calls if c.id in clear)
        if not ids:
            continue
        new = _cleared(m, ids)
        if new is m:
            continue
        before, after = ctx.count(m), ctx.count(new)
        if after >= before:
            continue
        messages[i] = new
        tools = ", ".join(sorted({clear[c] for c in ids}))
        reason = f"arguments of the call(s) to {tools} cleared with their results (clear_inputs)"
        actions.append(same_action(m.id, "masked", reason, before, after, strategy))
    return actions


def _cleared(message: Message, ids: tuple[str, ...]) -> Message:
    """``message`` with the arguments of the calls ``ids`` cleared; the same object for
    the same ids build after build (kept on the message), so its count stays cached."""
    kept = message._memo.get(_CLEARED_ATTR)
    if kept is not None and kept[0] == ids:
        return cast(Message, kept[1])
    text = CLEARED.format(handle=handle_for(message.id))
    calls = tuple(
        ToolCall(c.id, c.name, text) if c.id in ids and len(c.arguments) > len(text) else c
        for c in message.tool_calls
    )
    new = message if calls == message.tool_calls else replace(message, tool_calls=calls)
    message._memo[_CLEARED_ATTR] = (ids, new)
    return new


# -- the steps ---------------------------------------------------------------------------------

_PINNED_ATTR = "_cw_rule_pinned"


@dataclass(frozen=True)
class PinResults:
    """Pins the results of the tools whose rule says ``pin = true``: they are pinned
    messages from here on (kept before the window with their call, never masked or cut,
    evicted only when the budget cannot hold them; see :mod:`~ctxwarden.steps.window`).
    Runs first, only when a rule pins."""

    name: str = "tool_pins"

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        rules = ctx.policy.tools
        h = draft.history
        pinned: list[Message] | None = None
        for i in range(draft.sys_end, len(h)):
            m = h[i]
            if m.role != "tool" or m.pinned or not rules.for_tool(result_tool(h, i)).pin:
                continue
            if pinned is None:
                pinned = list(h)
            copy = m._memo.get(_PINNED_ATTR)
            if copy is None:  # the same copy every build: its counts stay cached
                copy = m._memo[_PINNED_ATTR] = replace(m, pinned=True)
            pinned[i] = copy
        if pinned is None:
            return StepResult(draft)
        return StepResult(draft.but(history=pinned))
