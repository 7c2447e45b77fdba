"""The newest turn arrives whole: the tool results the model has not answered yet (issue 35).

A tool result's size threshold (:class:`~ctxwarden.steps.truncate.TruncateToolResults`) is
the seeds' cost rule for results the model has *already seen*: it read them, answered, and
what it took from them is in its reply. The results it has not answered yet are what this
call is for — the file a coding agent just opened, the record the user asked about — and
cutting them to 300 tokens while the budget has room hides the answer. So they are kept
verbatim while they fit :func:`newest_room`: the budget less what the context holds
whatever the window does (system prompt, tool definitions, the summary and facts layers,
the share recall takes, the entity ledger's cap when something has left or will leave
the window, the pinned messages, and the rest of the protected newest turn). What the
recall block and the ledger take is what their steps declare, read from the
:class:`~ctxwarden.steps.base.StepContext` (:meth:`~ctxwarden.steps.base.StepContext.reserved`,
:meth:`~ctxwarden.steps.base.StepContext.ledger_cap`), not from their configuration. Older
window turns are dropped by the fit first: they are already answered, and the ledger
keeps their values.
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxwarden.core.messages import Message
from ctxwarden.steps.base import Draft, StepContext

__all__ = ["newest_room", "newest_user_text", "unanswered_results"]


def unanswered_results(messages: Sequence[Message]) -> list[int]:
    """Positions of the tool results after the last assistant message: the model has not
    answered them yet (a user turn may follow them, as Anthropic's tool_result turns do)."""
    out: list[int] = []
    for i in range(len(messages) - 1, -1, -1):
        role = messages[i].role
        if role == "assistant":
            break
        if role == "tool":
            out.append(i)
    out.reverse()
    return out


def newest_user_text(messages: Sequence[Message]) -> str:
    """The text of the last user message among ``messages`` ("" if none)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return messages[i].text
    return ""


def newest_room(draft: Draft, ctx: StepContext) -> int:
    """Tokens the unanswered results may take whole (see the module docstring)."""
    window = draft.window
    waiting = {window[i].id for i in unanswered_results(window)}
    layers = ctx.total([m for _, m in draft.layers])
    pinned = ctx.total(draft.pinned_messages)
    kept = ctx.total([m for m in window if m.id in draft.protected and m.id not in waiting])
    room = ctx.budget - ctx.fixed - layers - ctx.reserved(draft) - pinned - kept
    # The ledger holds the values of what left the window. When nothing before the window
    # can feed it (all pinned, no earlier entities) and the whole window fits, nothing
    # leaves and it takes no room; else it may take up to its cap.
    pins = set(draft.pinned)
    fed = (
        any(i not in pins for i in range(draft.sys_end, draft.start))
        or bool(ctx.earlier)
        or room < _rest_as_sent(window, draft.protected - waiting, ctx)
    )
    return room - (ctx.ledger_cap(draft) if fed else 0)


def _rest_as_sent(window: Sequence[Message], kept: frozenset[str], ctx: StepContext) -> int:
    """The window's messages but ``kept``, the answered results counted as their cut will
    be (the truncation runs after this is measured) and the unanswered whole."""
    waiting = set(unanswered_results(window))
    total = 0
    for i, m in enumerate(window):
        if m.id in kept:
            continue
        tokens = ctx.count(m)
        if m.role == "tool" and i not in waiting:
            tokens = ctx.sent_tokens(m, tokens)
        total += tokens
    return total
