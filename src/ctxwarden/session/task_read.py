"""The agent run's task, read from the head of a stored session (speed: once).

A build over a stored session sees a slice of it (the window and what it needs), where the
first user message may be long gone; the engine then cannot tell the agent's task
(:func:`~ctxwarden.steps.window.agent_task`: the first user message, when the model
answered it with a tool call) from the slice, and would take a later user message for
it. :class:`TaskRead` reads the session's first messages, decides as ``agent_task`` does
over the whole history, and remembers the answer once it is final (the first user
message has an answer), so the build gets the task's stored message to add to its slice
and names it to the engine (``run_build(task_id=...)``): both paths keep the same
message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ctxwarden.steps.window import agent_task, first_request, leading_system
from ctxwarden.store.base import SessionStore, StoredMessage

__all__ = ["TaskRead"]

_PAGE = 16


@dataclass
class TaskRead:
    """The session's task, read once per session (keyed by its ``created_at``)."""

    _known: dict[float, StoredMessage | None] = field(default_factory=dict)

    def task(
        self, store: SessionStore, tenant: str, session_id: str, created_at: float, end: int
    ) -> StoredMessage | None:
        """The task's stored message, or ``None`` (no task, or not yet decidable: the
        first user message has no answer yet); ``end`` is the session's next seq."""
        if created_at in self._known:
            return self._known[created_at]
        found, final = _read(store, tenant, session_id, end)
        if final:
            self._known.clear()  # one session's answer at a time
            self._known[created_at] = found
        return found


def _read(
    store: SessionStore, tenant: str, session_id: str, end: int
) -> tuple[StoredMessage | None, bool]:
    """(the task, whether that is final: the first request has an answer), reading
    pages from the first message and deciding as :func:`agent_task` does."""
    head: list[StoredMessage] = []
    seq = 0
    while seq < end:
        head += store.range(tenant, session_id, seq, min(seq + _PAGE, end))
        seq += _PAGE
        messages = [m.message for m in head]
        sys_end = leading_system(messages)
        first = first_request(messages, sys_end)
        if first is not None and first + 1 < len(messages):
            at = agent_task(messages, sys_end)
            return (head[at] if at is not None else None), True
    return None, False
