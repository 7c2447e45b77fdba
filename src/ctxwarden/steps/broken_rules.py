"""The warnings that name a tool rule the budget broke (``[tools.NAME]``, see
:mod:`~ctxwarden.steps.tool_rules`): the last step of the cascade, when there are rules.

It reads what masking and truncation did through their own modules' helpers
(:func:`~ctxwarden.steps.mask.is_masked`, :func:`~ctxwarden.steps.truncate.truncated_from`),
not their meta keys; it lives apart from the rules, which those steps import.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxwarden.steps.base import Draft, StepContext, StepResult
from ctxwarden.steps.mask import is_masked
from ctxwarden.steps.tool_rules import result_tool
from ctxwarden.steps.truncate import truncated_from

__all__ = ["CheckToolRules"]


@dataclass(frozen=True)
class CheckToolRules:
    """Warns, naming the rule, where the budget broke a tool rule: a pinned result
    evicted, a result the rule keeps whole cut or masked, a result the rule says not to
    mask masked. Runs last; changes nothing."""

    name: str = "tool_rules"

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        rules = ctx.policy.tools
        h, ordered = draft.history, draft.ordered
        warnings: list[str] = []
        if rules.pins:  # a pinned result anywhere in the history that is not sent
            sent = {m.id for m in ordered}
            for i in range(draft.sys_end, len(h)):
                m = h[i]
                if m.role != "tool" or not m.pinned or m.id in sent:
                    continue
                name = result_tool(h, i)
                if rules.for_tool(name).pin:
                    warnings.append(
                        f"[{rules.named(name, 'pin')}] pin = true broken: result {m.id} "
                        "evicted to fit the budget"
                    )
        for j, out in enumerate(ordered):
            if out.role != "tool":
                continue
            masked, cut_from = is_masked(out), truncated_from(out)
            if not (masked or cut_from is not None):
                continue
            name = result_tool(ordered, j)
            rule = rules.for_tool(name)
            if rule.mask is False and masked:
                warnings.append(
                    f"[{rules.named(name, 'mask')}] mask = false broken: result {out.id} "
                    "masked to fit the budget"
                )
            if rule.truncate is False and cut_from is not None:
                warnings.append(
                    f"[{rules.named(name, 'truncate')}] truncate = false broken: result "
                    f"{out.id} cut from {cut_from:,} tokens to fit the budget"
                )
        return StepResult(draft, (), tuple(warnings))
