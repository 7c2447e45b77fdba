"""The cascade as data: the steps a policy runs, in order (seed 000: cheapest first).

    layers → window → truncate → mask → (your steps) → recall → fit (+ entity ledger)
    → priority → layout

With per-tool rules (``[tools.NAME]``, :mod:`~ctxwarden.steps.tool_rules`), a step that
pins the results a rule pins runs first, and one that warns of a rule the budget broke
runs last.

``Policy(steps=[...])`` adds your own steps after the built-in editing steps and before
the window is fitted, so what they drop frees budget for the rest. A step is an object
with a ``name`` and ``__call__(draft, ctx) -> StepResult`` (:class:`~ctxwarden.Step`); an
object whose ``__call__`` takes the window's messages instead (``(messages, ctx) ->
StrategyResult``, :class:`~ctxwarden.Strategy`) is run on the window by
:class:`~ctxwarden.steps.edit.EditStep`. In TOML::

    [[steps]]
    use = "mypackage.steps:DropTagged"   # module:attribute, called with the other keys
    tag = "debug"
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ctxwarden.core.errors import ConfigError
from ctxwarden.steps.base import Step
from ctxwarden.steps.edit import EditStep
from ctxwarden.steps.evict import EvictStep
from ctxwarden.steps.fit import FitStep
from ctxwarden.steps.layers import LayersStep
from ctxwarden.steps.layout import LayoutStep
from ctxwarden.steps.tool_rules import CheckToolRules, PinResults
from ctxwarden.steps.window import WindowStep

if TYPE_CHECKING:
    from ctxwarden.pipeline.policy import Policy

__all__ = ["as_step", "load_step", "steps_for"]


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


# The built-in steps hold no state (frozen, a name each): one of each serves every build.
_HEAD: tuple[Step, ...] = (LayersStep(), WindowStep())
_TAIL: tuple[Step, ...] = (FitStep(), EvictStep(), LayoutStep())
_PINS, _CHECK_RULES = PinResults(), CheckToolRules()


def steps_for(policy: Policy) -> tuple[Step, ...]:
    """The policy's pipeline, in order."""
    steps: list[Step] = list(_HEAD)
    if policy.tools.pins:  # results pinned by their tool's rule, before the window sees them
        steps.insert(0, _PINS)
    if policy.truncate is not None:
        steps.append(EditStep(policy.truncate))
    if policy.mask is not None:
        steps.append(EditStep(policy.mask))
    steps.extend(as_step(s) for s in policy.steps)
    if policy.recall is not None:
        steps.append(policy.recall)
    steps.extend(_TAIL)
    if policy.tools:  # the warnings that name a tool rule the budget broke
        steps.append(_CHECK_RULES)
    return tuple(steps)
