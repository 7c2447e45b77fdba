"""Where the window starts, and what is pinned (R6).

The window start is sticky: it only moves forward, kept in the previous build's state, so
consecutive builds share their prefix; a cold build (no state) finds it by walking back
from the newest message until well past what the budget can hold. It never starts inside
a tool-call block, never before what the summary covers, and not after the newest user
message, unless that request opened a long turn (:func:`long_turn`: a coding agent's
task, then hundreds of steps): then the request stays as a pin, laid where it stood
(:mod:`~ctxwarden.steps.layout`), and the window's region is what fits, not the whole run.
When a new request comes, the window opens again at the one it passed (:func:`reopened`)
until the next compaction, as a window that had started there would.

Pinned messages — flagged ``pinned``, ``priority="critical"``, or among the first
``window.pin_first`` conversation messages — are kept wherever they are: before the
window they form the pinned layer (their tool-call blocks whole), inside it they are
protected from the window's fit. Only priority eviction, when the budget cannot hold
them, removes one, with a warning (see :mod:`ctxwarden.steps.evict`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden.core.messages import Message
from ctxwarden.steps.base import Action, CountedAction, Draft, StepContext, StepResult
from ctxwarden.steps.memos import memo_of, register_memo
from ctxwarden.steps.state import BuildState
from ctxwarden.steps.task import task_form

__all__ = [
    "LONG_TURN",
    "WindowMemo",
    "WindowStep",
    "agent_task",
    "first_request",
    "is_pinned",
    "leading_system",
    "long_turn",
    "newest_call_block",
    "newest_user",
    "newest_user_after",
    "reopened",
]


def leading_system(history: Sequence[Message]) -> int:
    """How many system messages open the history (the system prompt)."""
    i = 0
    while i < len(history) and history[i].role == "system":
        i += 1
    return i


def newest_user(history: Sequence[Message], start: int, end: int | None = None) -> int | None:
    """Position of the last user message in ``history[start:end]`` (``None``: none)."""
    for i in range(len(history) - 1 if end is None else end - 1, start - 1, -1):
        if history[i].role == "user":
            return i
    return None


def newest_user_after(history: Sequence[Message], sys_end: int, previous: BuildState) -> int | None:
    """:func:`newest_user` from ``sys_end``, looking only at the messages after the
    previous build's history when its window memo says where its newest user message was
    (the history only grows: a coding agent's one request, then thousands of steps, was
    walked back to at every build)."""
    memo = memo_of(previous, "window", WindowMemo) if previous.history_length else None
    if memo is None or memo.newest is None:
        return newest_user(history, sys_end)
    seen = memo.seen  # (not the state's length: a session's memo may be of an older build)
    if not sys_end <= memo.newest < seen <= len(history):
        return newest_user(history, sys_end)
    found = newest_user(history, seen)
    return memo.newest if found is None else found


LONG_TURN = 64
"""Messages after the newest user message from which the window may start after it."""


def long_turn(draft: Draft) -> bool:
    """Whether the newest user message opened a long turn (more than :data:`LONG_TURN`
    messages since: a coding agent's task, then its steps). Then the window may start
    after it, and it stays as a pin, so the window's region is not the whole turn. A
    short turn keeps the window at or before its request: moving past it and back at the
    next request would cost more than the short region does."""
    return draft.newest is not None and len(draft.history) - draft.newest > LONG_TURN


def reopened(history: Sequence[Message], start: int, seen: int, newest: int, lowest: int) -> int:
    """The window's start when a new user message (at ``newest``) came since the previous
    build (which saw ``seen`` messages): at the request that build sent pinned, if the
    window had moved past it (:func:`~ctxwarden.steps.fit._new_start`), so the context
    keeps it until the next compaction moves the window, as it did while the window
    started at it. No earlier than ``lowest`` (the summary's floor, the system prompt)."""
    if not seen or newest < seen or seen > len(history):
        return start
    before = newest_user(history, lowest, seen)
    return before if before is not None and before < start else start


def newest_call_block(history: Sequence[Message], after: int) -> range:
    """Positions of the newest assistant tool call after ``after`` and its results (an
    agent's step in progress: dropping it makes the model call again); empty if none."""
    for i in range(len(history) - 1, after, -1):
        if history[i].is_tool_call:
            end = i + 1
            while end < len(history) and history[end].role == "tool":
                end += 1
            return range(i, end)
        if history[i].role != "tool":
            return range(0)
    return range(0)


def first_request(history: Sequence[Message], sys_end: int) -> int | None:
    """Position of the first user message after the system prompt; ``None``: none."""
    return next((i for i in range(sys_end, len(history)) if history[i].role == "user"), None)


def agent_task(history: Sequence[Message], sys_end: int) -> int | None:
    """Position of the agent run's task: the first user message, when the model answered
    it with a tool call (it started tool work); ``None`` otherwise (a chat, a run whose
    first answer was text, or a first request not answered yet)."""
    i = first_request(history, sys_end)
    if i is None or i + 1 == len(history):
        return None
    reply = history[i + 1]
    return i if reply.role == "assistant" and reply.tool_calls else None


def _sent_task(
    history: Sequence[Message], task: int | None, newest: int | None, ctx: StepContext
) -> Message | None:
    """The agent's task as the context sends it: whole while it is the newest user
    message (as every request is), else its form (:func:`~ctxwarden.steps.task.task_form`:
    cut to its share once a later request's window must move)."""
    if task is None:
        return None
    return history[task] if task == newest else task_form(history[task], ctx)


def is_pinned(message: Message) -> bool:
    return (message.pinned or message.priority == "critical") and message.role != "system"


def _align(history: Sequence[Message], start: int) -> int:
    while start < len(history) and history[start].role == "tool":
        start += 1
    return start


def _cold_start(history: Sequence[Message], sys_end: int, room: int, ctx: StepContext) -> int:
    """Walk back from the newest message until well past what the room can hold, a result
    the model has answered counted at most as its cut (``ctx.sent_tokens``): walking
    raw sizes stopped early on a history of long results that truncation shrinks, and the
    build dropped turns its budget had room for (issue 35). Masking shrinks more, but
    counting placeholders made the walk, and a cold build, about twice as long; what it
    leaves before the window goes to the entity ledger."""
    acc, i, answered = 0, len(history), False
    while i > sys_end and acc <= 3 * room:
        i -= 1
        m = history[i]
        tokens = ctx.count(m)
        if m.role == "assistant":
            answered = True
        elif m.role == "tool" and answered:
            tokens = ctx.sent_tokens(m, tokens)
        acc += min(tokens, room)
    return i


def _whole_blocks(history: Sequence[Message], indices: Sequence[int], limit: int) -> list[int]:
    """Pinned indices extended to whole blocks (a pinned call brings its results and a
    pinned result its call), all before ``limit``."""
    chosen = set(indices)
    for i in indices:
        start = i
        while start > 0 and history[start].role == "tool":
            start -= 1
        end = start + 1
        while end < limit and history[end].role == "tool":
            end += 1
        chosen.update(range(start, end))
    return sorted(j for j in chosen if j < limit)


def _first_messages(history: Sequence[Message], sys_end: int, n: int) -> list[int]:
    """Positions of the first ``n`` conversation messages (``window.pin_first``), each
    tool call with its results."""
    out: list[int] = []
    i, taken = sys_end, 0
    while i < len(history) and taken < n:
        out.append(i)
        taken += 1
        i += 1
        while i < len(history) and history[i].role == "tool":  # a call with its results
            out.append(i)
            i += 1
    return out


def _capped_start(
    history: Sequence[Message], start: int, newest: int | None, cap: int, first: set[int]
) -> int:
    """The latest start at or after ``start`` whose window holds no more than ``cap``
    messages that count against ``window.max_messages`` (pins — pinned, critical,
    ``pin_first`` — do not), on a message that is not a tool result, never after the
    newest user message. The fit keeps whole blocks within the cap from there."""
    counted, i = 0, len(history)
    while i > start:
        j = i - 1
        if not (j in first or is_pinned(history[j])):
            if counted == cap:
                break
            counted += 1
        i = j
    i = _align(history, i)
    if newest is not None and i > newest:
        i = newest
    return max(i, start)


def _left_by_cap(
    history: Sequence[Message],
    old: int,
    new: int,
    pinned: set[int],
    cap: int | None,
    ctx: StepContext,
) -> tuple[Action, ...]:
    """Dropped actions for the messages the cap moved the (sticky) start past; the pins
    among them went to the pinned layer."""
    if new <= old:
        return ()
    reason = f"left the window (window.max_messages={cap})"
    return tuple(
        Action(history[i].id, "dropped", reason, ctx.count(history[i]), 0, "window")
        for i in range(old, new)
        if i not in pinned
    )


@dataclass(frozen=True)
class WindowMemo:
    """The window's memo (``memos["window"]``): the pinned and critical positions before
    ``upto`` (the next build scans only the messages that left the window since), and
    the position of the newest user message among the first ``seen`` messages (``None``:
    none; see :func:`newest_user_after`)."""

    flagged: tuple[int, ...] = ()
    upto: int = 0
    newest: int | None = None
    seen: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "flagged": list(self.flagged),
            "upto": self.upto,
            "newest": self.newest,
            "seen": self.seen,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WindowMemo:
        newest = data.get("newest")
        return cls(
            tuple(int(i) for i in data.get("flagged", ())),
            int(data.get("upto", 0)),
            None if newest is None else int(newest),
            int(data.get("seen", 0)),
        )


register_memo("window", WindowMemo)


@dataclass(frozen=True)
class WindowStep:
    """Places the window start and collects the pinned messages before it."""

    name: str = "window"

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        h, sys_end, prev = draft.history, draft.sys_end, ctx.previous
        layers = ctx.total([m for _, m in draft.layers])
        if prev.history_length == 0:
            room = max(ctx.budget - ctx.fixed - layers, 1)
            start = _cold_start(h, sys_end, room, ctx)
        else:
            start = max(prev.window_start, sys_end)
        start = _align(h, max(start, draft.floor, sys_end))
        passed = start
        if draft.newest is not None and start > draft.newest:
            if not prev.history_length and not long_turn(draft):
                start = draft.newest  # (a short turn's window starts at its request)
        elif draft.newest is not None:
            seen, lowest = prev.history_length, max(draft.floor, sys_end)
            start = reopened(h, start, seen, draft.newest, lowest)
        task = draft.task  # (run_build finds it: agent_task)
        if task is not None and task < draft.floor:
            task = None  # the summary covers it
        first = _first_messages(h, sys_end, ctx.policy.window.pin_first)
        # the task: a pin (steps.task), unless it is the newest user message (protected)
        pins = first if task is None or task == draft.newest else [*first, task]
        # Issue 35: the message cap places the start too, so truncation and masking see
        # the window the cap leaves (a 100-message window over the budget made masking
        # flush every result although the cap keeps five); pins are outside the cap.
        cap = ctx.policy.window.max_messages
        uncapped = start
        if cap is not None:
            start = _capped_start(h, start, draft.newest, cap, set(pins))
        flagged, upto = self._flagged(h, sys_end, start, prev)
        request = [draft.newest] if draft.newest is not None and draft.newest < start else []
        pinned = _whole_blocks(h, [*(j for j in pins if j < start), *flagged, *request], start)
        window = tuple(h[start:])
        protected = set(draft.protected)
        protected.update(  # is_pinned, inline: it asks every message of the window
            [m.id for m in window if (m.pinned or m.priority == "critical") and m.role != "system"]
        )
        protected.update(h[j].id for j in pins if j >= start)  # pin_first inside the window
        if not prev.history_length:
            capped = f" (window.max_messages={cap})" if start > uncapped else ""
            actions = self._cold_prefix(draft, ctx, start, set(pinned), capped)
        else:
            actions = _left_by_cap(h, uncapped, start, set(pinned), cap, ctx)
        new = draft.but(
            start=start,
            reopened=passed if start < passed else None,
            window=window,
            pinned=tuple(pinned),
            protected=frozenset(protected),
            task=task,
            task_form=_sent_task(h, task, draft.newest, ctx),
        ).with_memo("window", WindowMemo(flagged, upto, draft.newest, len(h)))
        return StepResult(new, actions)

    @staticmethod
    def _cold_prefix(
        draft: Draft, ctx: StepContext, start: int, pinned: set[int], cause: str = ""
    ) -> tuple[Action, ...]:
        """One action for everything before a cold build's window (its tokens counted when
        small, and only when read: :class:`~ctxwarden.steps.base.CountedAction`);
        what the summary folded (before the floor) is reported by the summary cycle."""
        h = draft.history
        lo = max(draft.sys_end, draft.floor)
        while lo < start and lo in pinned:
            lo += 1
        hi = start - 1
        while hi >= lo and hi in pinned:
            hi -= 1
        if hi < lo:
            return ()
        count = hi - lo + 1 - sum(1 for i in pinned if lo < i < hi)
        span = h[lo].id if count == 1 else f"{h[lo].id}..{h[hi].id}"
        reason = f"{count} older message(s) before the window{cause}"
        if count > 2000:
            return (Action(span, "dropped", reason, 0, 0, "window"),)
        old = [h[i] for i in range(lo, hi + 1) if i not in pinned]
        count_message = ctx.counter.count_message  # (not ctx: it holds the previous state)
        tokens = lambda: sum(map(count_message, old))  # noqa: E731
        return (CountedAction(span, "dropped", reason, tokens, 0, "window"),)

    @staticmethod
    def _flagged(
        history: Sequence[Message], sys_end: int, limit: int, prev: BuildState
    ) -> tuple[tuple[int, ...], int]:
        """Pinned / critical positions before ``limit``: the previous build's, extended by
        the messages that left the window since (history only grows)."""
        memo = memo_of(prev, "window", WindowMemo) or WindowMemo()
        found, scanned = memo.flagged, memo.upto
        if not sys_end <= scanned <= limit:
            found, scanned = (), sys_end
        extra = tuple(j for j in range(scanned, limit) if is_pinned(history[j]))
        return tuple(j for j in found + extra if j < limit), max(limit, scanned)
