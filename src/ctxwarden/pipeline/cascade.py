"""The cascade as data: the steps a policy runs, in order (seed 000: cheapest first).

The order is ``Policy.cascade``, a list of step names; the default is
:data:`DEFAULT_CASCADE`::

    tool_pins → layers → window → truncate → mask → steps → recall → fit (+ entity ledger)
    → priority → layout → tool_rules

``steps`` stands for your own steps (``Policy(steps=[...])`` or ``[[steps]]``), in their
order: after the built-in editing steps and before the window is fitted, so what they drop
frees budget for the rest. ``tool_pins`` (:class:`~ctxwarden.steps.tool_rules.PinResults`)
runs only when a ``[tools.NAME]`` rule pins, ``tool_rules``
(:class:`~ctxwarden.steps.broken_rules.CheckToolRules`, the warnings naming a rule the budget
broke) only when there are rules; ``truncate``, ``mask`` and ``recall`` only when their
table is not ``false``.

A policy may reorder the list, or place one of its own steps by its ``name`` (the steps
not named stay where ``steps`` is)::

    cascade = ["tool_pins", "layers", "window", "drop_tagged", "truncate", "mask",
               "recall", "fit", "priority", "layout", "tool_rules"]

    [[steps]]
    use = "ctxwarden.steps.drop_tagged:DropTagged"   # module:attribute, called with
    tag = "debug"                                      # the other keys

Every built-in name must be there once (:data:`REQUIRED`; a step is turned off by its own
table, ``truncate = false``, not by leaving it out), and ``steps`` too while some of your
steps are not named; an unknown or repeated name is a :class:`ConfigError` naming it
(:func:`check_cascade`). The default order is the one the bench measures. What a step
sees is what the steps before it made: the window is empty before ``window`` chose it, so
a step that edits the window runs after it; ``layout`` orders the context to send, so the
steps after it (``tool_rules``) only read it.

A step is an object with a ``name`` and ``__call__(draft, ctx) -> StepResult``
(:class:`~ctxwarden.Step`); an object whose ``__call__`` takes the window's messages
instead (``(messages, ctx) -> StrategyResult``, :class:`~ctxwarden.Strategy`) is run on the
window by :class:`~ctxwarden.steps.edit.EditStep`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxwarden.core.errors import ConfigError
from ctxwarden.steps.base import Draft, LedgerBlocks, Step, StepContext
from ctxwarden.steps.broken_rules import CheckToolRules
from ctxwarden.steps.edit import EditStep
from ctxwarden.steps.evict import EvictStep
from ctxwarden.steps.fit import FitStep
from ctxwarden.steps.layers import LayersStep
from ctxwarden.steps.layout import LayoutStep
from ctxwarden.steps.ledger import EntityLedgerBlocks
from ctxwarden.steps.tool_rules import PinResults
from ctxwarden.steps.window import WindowStep

if TYPE_CHECKING:
    from ctxwarden.core.messages import Message
    from ctxwarden.pipeline.policy import Policy

__all__ = [
    "DEFAULT_CASCADE",
    "REQUIRED",
    "USER_STEPS",
    "Foreseen",
    "as_step",
    "check_cascade",
    "foreseen",
    "load_step",
    "sent_tokens_for",
    "steps_for",
]

#: Where the policy's own steps not named in the cascade run.
USER_STEPS = "steps"

#: The default order (seed 000: cheapest first); the one place it is written.
DEFAULT_CASCADE: tuple[str, ...] = (
    "tool_pins",
    "layers",
    "window",
    "truncate",
    "mask",
    USER_STEPS,
    "recall",
    "fit",
    "priority",
    "layout",
    "tool_rules",
)

#: The built-in steps: each must be in a policy's cascade, once.
REQUIRED: tuple[str, ...] = tuple(n for n in DEFAULT_CASCADE if n != USER_STEPS)


def as_step(obj: Any) -> Step:
    """``obj`` as a pipeline step: a step as it is, a message strategy wrapped."""
    call = getattr(obj, "__call__", None)  # noqa: B004 - a class instance's own __call__
    if not callable(obj) or call is None or not isinstance(getattr(obj, "name", None), str):
        raise ConfigError(
            f"{obj!r} is not a step: it needs a string `name` and "
            "__call__(draft, ctx) -> StepResult (or (messages, ctx) -> StrategyResult)"
        )
    try:
        params = list(inspect.signature(call).parameters)
    except (TypeError, ValueError):
        params = []
    if params and params[0] == "draft":
        return obj  # type: ignore[no-any-return]
    return EditStep(obj)


def load_step(spec: Mapping[str, Any], source: str = "policy") -> Any:
    """The object a TOML ``[[steps]]`` table names: ``use = "module:attribute"`` called
    with the table's other keys."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("use"), str):
        raise ConfigError(f'{source}: each [[steps]] table needs use = "module:attribute"')
    target = spec["use"]
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(f'{source}: steps use = {target!r} must look like "module:attribute"')
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{source}: cannot import step {target!r}: {exc}") from None
    kwargs = {k: v for k, v in spec.items() if k != "use"}
    try:
        return factory(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{source}: step {target!r}: {exc}") from None


def check_cascade(cascade: Any, steps: tuple[Any, ...]) -> tuple[str, ...]:
    """``cascade`` as a tuple of names, checked against the built-in steps and the
    policy's own ``steps``: a :class:`ConfigError` names an entry that is not a string, an
    unknown or repeated name, a built-in step left out, a name two of the policy's steps
    share, and ``steps`` left out while some of them are not named."""
    if isinstance(cascade, str) or not isinstance(cascade, list | tuple):
        raise ConfigError(f"cascade must be a list of step names, got {cascade!r}")
    names = tuple(cascade)
    own = [as_step(s).name for s in steps]
    builtin = set(DEFAULT_CASCADE)
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise ConfigError(f"cascade: a step name must be a string, got {name!r}")
        if name in seen:
            raise ConfigError(f"cascade: step {name!r} is named twice")
        seen.add(name)
        if name in builtin:
            continue
        if name not in own:
            known = ", ".join([*DEFAULT_CASCADE, *dict.fromkeys(own)])
            raise ConfigError(f"cascade: unknown step {name!r} (known: {known})")
        if own.count(name) > 1:
            raise ConfigError(
                f"cascade: {own.count(name)} of the policy's steps are named {name!r}; "
                "give them distinct names to place them"
            )
    missing = [n for n in REQUIRED if n not in seen]
    if missing:
        raise ConfigError(
            f"cascade: the built-in step(s) {', '.join(map(repr, missing))} are missing "
            "(turn a step off by its own table, e.g. truncate = false)"
        )
    unplaced = [n for n in own if n not in seen or n in builtin]
    if unplaced and USER_STEPS not in seen:
        raise ConfigError(
            f"cascade: the policy's step(s) {', '.join(map(repr, unplaced))} are not "
            f'placed: name them in the cascade, or add "{USER_STEPS}" where they run'
        )
    return names


# The built-in steps hold no state (frozen, a name each): one of each serves every build.
_LAYERS, _WINDOW = LayersStep(), WindowStep()
_FIT = FitStep(ledger_blocks=EntityLedgerBlocks())  # the fit settles the ledger with the window
_EVICT, _LAYOUT = EvictStep(), LayoutStep()
_PINS, _CHECK_RULES = PinResults(), CheckToolRules()

#: Each built-in name -> the steps it is for a policy (none: off for this policy).
_BUILT_IN: Mapping[str, Callable[[Policy], tuple[Step, ...]]] = {
    "tool_pins": lambda p: (_PINS,) if p.tools.pins else (),  # results a tool's rule pins
    "layers": lambda p: (_LAYERS,),
    "window": lambda p: (_WINDOW,),
    "truncate": lambda p: (EditStep(p.truncate),) if p.truncate is not None else (),
    "mask": lambda p: (EditStep(p.mask),) if p.mask is not None else (),
    "recall": lambda p: (p.recall,) if p.recall is not None else (),
    "fit": lambda p: (_FIT,),
    "priority": lambda p: (_EVICT,),
    "layout": lambda p: (_LAYOUT,),
    "tool_rules": lambda p: (_CHECK_RULES,) if p.tools else (),  # a broken rule's warnings
}


def steps_for(policy: Policy) -> tuple[Step, ...]:
    """The policy's pipeline, in the order of its cascade (a step whose table is off, or
    a tool-rule step without rules, left out)."""
    own = [as_step(s) for s in policy.steps]
    named = {s.name: s for s in own if s.name in policy.cascade and s.name not in _BUILT_IN}
    out: list[Step] = []
    for name in policy.cascade:
        if name == USER_STEPS:
            out.extend(s for s in own if s.name not in named)
        elif name in _BUILT_IN:
            out.extend(_BUILT_IN[name](policy))
        else:
            out.append(named[name])
    return tuple(out)


def sent_tokens_for(policy: Policy) -> Callable[[Message, int], int] | None:
    """How many tokens a message (of a given count) is sent at once the policy's steps
    ran, as the steps that foresee it say (a step's ``sent_tokens(message, tokens)``:
    the truncation's), in cascade order; ``None`` when no step says. The engine hands it
    to the steps (:meth:`~ctxwarden.steps.base.StepContext.sent_tokens`) and the summary
    triggers, so none of them reads the truncation's configuration."""
    return foreseen(steps_for(policy)).sent


@dataclass(frozen=True)
class Foreseen:
    """What the steps of a pipeline let the others foresee of them, as the engine puts it
    on the :class:`~ctxwarden.steps.base.StepContext`: ``sent`` (a message's tokens once
    cut: the steps' ``sent_tokens``, chained in order), ``reserve`` (the room their own
    later layers take: the steps' ``reserve(draft, ctx)``, summed) and ``ledger``
    (the entity ledger: the ``ledger_blocks`` of the step that renders it). ``None``:
    no step says (a count as it is, no room, no ledger)."""

    sent: Callable[[Message, int], int] | None = None
    reserve: Callable[[Draft, StepContext], int] | None = None
    ledger: LedgerBlocks | None = None


def foreseen(steps: Sequence[Step]) -> Foreseen:
    """What ``steps`` (a policy's pipeline, :func:`steps_for`) declare of themselves for
    the others (:class:`Foreseen`)."""
    sents: list[Callable[[Message, int], int]] = []
    reserves: list[Callable[[Draft, StepContext], int]] = []
    ledger: LedgerBlocks | None = None
    for step in steps:
        sent = getattr(step, "sent_tokens", None)
        if callable(sent):
            sents.append(sent)
        reserve = getattr(step, "reserve", None)
        if callable(reserve):
            reserves.append(reserve)
        if ledger is None:
            ledger = getattr(step, "ledger_blocks", None)
    return Foreseen(_chained(sents), _summed(reserves), ledger)


def _chained(
    found: Sequence[Callable[[Message, int], int]],
) -> Callable[[Message, int], int] | None:
    if len(found) < 2:
        return found[0] if found else None

    def sent_tokens(message: Message, tokens: int) -> int:
        for sent in found:
            tokens = sent(message, tokens)
        return tokens

    return sent_tokens


def _summed(
    found: Sequence[Callable[[Draft, StepContext], int]],
) -> Callable[[Draft, StepContext], int] | None:
    if len(found) < 2:
        return found[0] if found else None

    def reserve(draft: Draft, ctx: StepContext) -> int:
        return sum(r(draft, ctx) for r in found)

    return reserve
