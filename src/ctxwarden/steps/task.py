"""The agent run's task, pinned, and cut to its share of the budget once the window passes it.

A coding agent's run starts with one long user message (the issue, then the harness's
rules: 1,100-3,700 tokens in the shared swebench runs) and then makes hundreds of tool
calls. The window never starts after the newest user message, so while the task is the
newest it stays; but one later user message (a harness's "provide exactly one action", a
short follow-up) and the window could start after it: the task left the context in 31%
of the coding agent's builds at 8,000 tokens. The task
(:func:`~ctxwarden.steps.window.agent_task`: the first user message, when the model
answered it with a tool call) is now a pin: while it is the newest user message it is sent
whole, as every request is (in the window, or pinned as the request a long turn's window
passed); once a later request came, the first move of the window cuts it to
``window.task_share`` of the budget (head and tail, with the whole message's handle:
:func:`task_form`) before it drops anything, and once the window's start passes it, it
joins the pinned layer so. The cut is a function of the message and the budget, so it is
the same bytes at every build, and it begins at a move of the window that rewrites the
context anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxwarden.core.handles import handle_for
from ctxwarden.core.messages import Message
from ctxwarden.cutters.text import truncate_text
from ctxwarden.steps.base import Action, Draft, StepContext

__all__ = ["TASK_STEP", "cut_action", "cut_in_window", "sent_cut_in", "task_form", "task_share"]

TASK_STEP = "task"
"""The strategy the cut's action names in the audit."""


def task_share(ctx: StepContext) -> int:
    """The tokens the pinned task is cut to: ``window.task_share`` of the budget."""
    return int(ctx.budget * ctx.policy.window.task_share)


def task_form(task: Message, ctx: StepContext) -> Message:
    """``task`` as the pinned layer sends it: within :func:`task_share` tokens, its head
    and tail and the line naming its handle; ``task`` itself when it fits, or when its
    content is not plain text (parts, images: sent whole)."""
    share = task_share(ctx)
    if not isinstance(task.content, str) or ctx.count(task) <= share:
        return task
    mark = f"\n[the whole task: {handle_for(task.id)}]"
    count_text = ctx.counter.count_text
    target = max(share - count_text(mark), 1)
    text = truncate_text(task.content, target_tokens=target, count=count_text)
    if text == task.content:
        return task
    return task.with_content(text + mark, truncated_from=ctx.count(task))


def _cut(draft: Draft) -> tuple[Message, Message] | None:
    """(the task, its form) when the form is a cut; ``None`` otherwise."""
    at, form = draft.task, draft.task_form
    if at is None or form is None or form is draft.history[at]:
        return None
    return draft.history[at], form


def sent_cut_in(draft: Draft, window: Sequence[Message]) -> bool:
    """Whether ``window`` sends the task cut (its form, not the task itself)."""
    found = _cut(draft)
    return found is not None and any(m is found[1] for m in window)


def cut_in_window(draft: Draft) -> Draft | None:
    """``draft`` with the task in its window sent as :func:`task_form`; ``None`` when the
    window does not hold the task whole or its form is the task itself (so while it is
    the newest user message: :class:`~ctxwarden.steps.window.WindowStep` gives it no other
    form then). The fit cuts it at the first move of the window after a later request,
    and in every build after (its memo), as the pinned layer does once the window passes
    it."""
    found = _cut(draft)
    if found is None:
        return None
    task, form = found
    i = next((k for k, m in enumerate(draft.window) if m is task), None)
    if i is None:
        return None
    return draft.but(window=(*draft.window[:i], form, *draft.window[i + 1 :]))


def cut_action(draft: Draft, ctx: StepContext) -> Action | None:
    """The audit's entry for a task the context sends cut: in the pinned layer, or in
    the window (:func:`cut_in_window`); ``None`` when it sends it whole or not at all."""
    found = _cut(draft)
    if found is None:
        return None
    task, form = found
    if draft.task not in draft.pinned and not any(m is form for m in draft.window):
        return None
    reason = (
        f"the agent's task, cut to its share of the budget (window.task_share: "
        f"{task_share(ctx):,} tokens) once the window moved; the whole message: "
        f"{handle_for(task.id)}"
    )
    return Action(task.id, "truncated", reason, ctx.count(task), ctx.count(form), TASK_STEP)
