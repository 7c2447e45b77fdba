"""The agent run's task, cut to its share of the budget once the window moves.

A coding agent's run starts with one long user message (the issue, then the harness's
rules: 1,100-3,700 tokens in the shared swebench runs) and then makes hundreds of tool
calls. The window never starts after the newest user message, so while the task is the
newest it stays; but one later user message (a harness's "provide exactly one action",
a short follow-up) and the window could start after it: the task left the context in
31% of the coding agent's builds at 8,000 tokens. The window step now keeps the task
(:func:`~ctxwarden.steps.window.agent_task`: the first user message, when the model
answered it with a tool call) in the window, protected; this module's :func:`cut_task`
cuts it to ``window.task_share`` of the budget (head and tail, with the whole message's
handle) at the first build whose window must move, and in every build after (the fit's
memo), so the cut is one rewrite that a compaction makes anyway, and the prefix stays
byte-identical between compactions. Pure: the cut is a function of the message and the
budget.
"""

from __future__ import annotations

from ctxwarden.core.handles import handle_for
from ctxwarden.core.messages import Message
from ctxwarden.cutters.text import truncate_text
from ctxwarden.steps.base import Action, Draft, StepContext

__all__ = ["TASK_STEP", "cut_task", "task_share"]

TASK_STEP = "task"
"""The strategy the cut's action names (the audit, the prefix break's cause)."""


def task_share(ctx: StepContext) -> int:
    """The tokens the task is cut to: ``window.task_share`` of the budget."""
    return int(ctx.budget * ctx.policy.window.task_share)


def cut_task(draft: Draft, ctx: StepContext, *, moved: bool) -> tuple[Draft, Action, int] | None:
    """``draft`` with the task cut to :func:`task_share` in its window, the action that
    says so, and the task's position in the window; ``None`` when there is nothing to
    cut (the window has not ``moved``, no task in the window, a task within its share,
    or content that is not plain text)."""
    at = draft.task
    if not moved or at is None or at < draft.floor:
        return None
    task = draft.history[at]
    i = next((k for k, m in enumerate(draft.window) if m.id == task.id), None)
    if i is None or draft.window[i] is not task or not isinstance(task.content, str):
        return None
    share = task_share(ctx)
    before = ctx.count(task)
    if before <= share:
        return None
    mark = f"\n[the whole task: {handle_for(task.id)}]"
    count_text = ctx.counter.count_text
    text = truncate_text(task.content, target_tokens=max(share - count_text(mark), 1),
                         count=count_text)  # fmt: skip
    if text == task.content:
        return None
    cut: Message = task.with_content(text + mark, truncated_from=before)
    after = ctx.count(cut)
    window = (*draft.window[:i], cut, *draft.window[i + 1 :])
    reason = (
        f"the agent's task, cut to its share of the budget (window.task_share: {share:,} "
        f"tokens) as the window moved; the whole message: {handle_for(task.id)}"
    )
    return (
        draft.but(window=window),
        Action(task.id, "truncated", reason, before, after, TASK_STEP),
        i,
    )
