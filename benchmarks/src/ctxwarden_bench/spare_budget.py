"""The promise of a build with budget to spare (issue 35), as a check the property tests
and the random sweep share.

What the policy asks for *by count or age* — ``window.max_messages``, masking older than
``mask.keep_last``, cutting results the model has already answered over the threshold —
does not depend on the budget. So a build whose budget holds, with room to spare (10%),
the context those rules alone give (the same history built with a budget nothing binds)
must be exactly that context: no message dropped, evicted, masked or cut beyond it, and
no warning it does not have (the entity ledger's cap counted as reserved when the
reference has a ledger: it is a layer the policy reserves). A build whose budget is
binding may do more, but each drop must name its real cause: a message the cap alone
excludes says ``window.max_messages``, one the cap would keep says ``budget``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxwarden.core.messages import Message
from ctxwarden.pipeline.engine import BuiltContext, build_context

__all__ = [
    "SPARE",
    "UNBOUND",
    "ledger_reserve",
    "reference_build",
    "spare_budget",
    "spare_budget_problems",
]

UNBOUND = 10_000_000
"""A budget no test history comes near: only the policy's count and age rules apply."""


def reference_build(history: Sequence[Message], policy: Any) -> BuiltContext:
    """``history`` built with a budget nothing binds."""
    return build_context(list(history), "gpt-4o", UNBOUND, policy=policy)


def ledger_reserve(reference: BuiltContext, budget: int, policy: Any = None) -> int:
    """The room a build at ``budget`` keeps for the entity ledger when the reference has
    one (what left the window by the cap, or lies before it): the ledger's cap, a layer
    the policy reserves (:func:`~ctxwarden.steps.ledger.ledger_cap`)."""
    if "ctxwarden:ledger" not in reference.layers:
        return 0
    from ctxwarden.pipeline.policy import LedgerConfig

    cfg = getattr(policy, "ledger", None) or LedgerConfig()
    layers = reference.audit.layers
    free = budget - sum(layers.get(k, 0) for k in ("system", "tools", "framing", "facts"))
    free -= layers.get("summary", 0)
    return max(min(max(cfg.max_tokens, int(free * cfg.free_share)), int(free * cfg.max_share)), 0)


SPARE = 1.1
"""A budget is *to spare* from 10% over what the rules need: before the fit, the build
knows an answered result's cut by its bound (``target_tokens + cut_values_tokens``), not
its size, so at the exact boundary it may count a few tokens more than it will send."""


def spare_budget(reference: BuiltContext, budget: int, policy: Any = None) -> int:
    """The least budget with room to spare for ``reference`` 's context: what it needs,
    10% more, and the ledger's reserve (:func:`ledger_reserve`)."""
    return int(reference.input_tokens * SPARE) + ledger_reserve(reference, budget, policy)


def _sent(built: BuiltContext) -> dict[str, str]:
    """History message id -> the text sent for it (layers left out)."""
    return {m.id: m.text for m in built.messages if built.layers.get(m.id) != "ledger"}


def _dropped(built: BuiltContext) -> dict[str, str]:
    return {a.message_id: a.reason for a in built.audit.actions if a.action == "dropped"}


def spare_budget_problems(
    history: Sequence[Message],
    built: BuiltContext,
    budget: int,
    reference: BuiltContext,
    policy: Any = None,
) -> list[str]:
    """What ``built`` (``history`` at ``budget``) does that its budget did not call for,
    given the ``reference`` build (:func:`reference_build`); empty when it holds."""
    problems: list[str] = []
    if spare_budget(reference, budget, policy) <= budget:
        want, got = _sent(reference), _sent(built)
        lost = [i for i in want if i not in got]
        if lost:
            problems.append(f"budget to spare, yet dropped or evicted: {lost[:4]}")
        changed = [i for i in want if i in got and got[i] != want[i]]
        if changed:
            problems.append(f"budget to spare, yet masked or cut: {changed[:4]}")
        extra = [w for w in built.audit.warnings if w not in reference.audit.warnings]
        if extra:
            problems.append(f"budget to spare, yet warned: {extra[0][:120]}")
        return problems
    by_count = _dropped(reference)
    for message_id, reason in _dropped(built).items():
        if ".." in message_id or "before the window" in reason:
            continue  # a cold build's span before its window: one action for many
        if reason.endswith("(budget)") and message_id in by_count:
            problems.append(f"{message_id} dropped for the budget, but the cap excludes it")
        if "max_messages" in reason and message_id not in by_count:
            problems.append(f"{message_id} dropped for max_messages, but the cap keeps it")
    return problems
