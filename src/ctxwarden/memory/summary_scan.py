"""Whether a summary is due, carried from build to build: O(new messages), not O(history).

Every build reports the summary its trigger would make now (``audit.summary_due``): what
:func:`~ctxwarden.memory.summaries.plan_summary` would fold. The triggers test sums over
the whole conversation — how many messages are unsummarised ("live": not system, not
pinned, not covered), their tokens, the tokens folding cannot reduce — and an agent's
history only grows, so :class:`SummaryScan` keeps those sums for the history a build was
given, in its :class:`~ctxwarden.steps.state.BuildState`, and the next build adds the
messages appended since (:func:`summary_due_of`). Where the plan cuts depends only on
the newest messages (the kept tail), found walking back from the end. The result is the
plan's, reason for reason and message for message (tests/test_summary_scan.py); a scan
for another history, summary or counter is not used.

The triggers' tests and the cut are here, shared by both: :func:`trigger_reasons` and
:func:`cut_for`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

from ctxwarden.core.messages import Message
from ctxwarden.core.pairing import group_blocks

if TYPE_CHECKING:
    from ctxwarden.memory.summaries import SummaryState, SummaryTrigger

__all__ = [
    "SummaryScan",
    "block_start_at",
    "cut_for",
    "scan_key",
    "shown_tokens",
    "summary_due_of",
    "trigger_reasons",
]

Due = tuple[tuple[str, ...], str, str, int]
"""A due summary: the reasons, the first and last folded ids, how many are folded."""


@dataclass(frozen=True)
class SummaryScan:
    """The trigger sums of ``history[:upto]`` (whose last message is ``last_id``) for the
    summary and counter ``key`` names: ``live`` unsummarised messages, the first at
    ``first_live`` (-1: none), holding ``tokens``; ``held`` tokens of the messages
    neither live nor covered (system prompt, pinned); the newest user message at
    ``last_user`` (-1: none)."""

    upto: int = 0
    last_id: str = ""
    key: str = ""
    live: int = 0
    first_live: int = -1
    tokens: int = 0
    held: int = 0
    last_user: int = -1

    def to_dict(self) -> dict[str, Any]:
        return {
            "upto": self.upto,
            "last_id": self.last_id,
            "key": self.key,
            "live": self.live,
            "first_live": self.first_live,
            "tokens": self.tokens,
            "held": self.held,
            "last_user": self.last_user,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SummaryScan:
        return cls(
            upto=int(data["upto"]),
            last_id=str(data["last_id"]),
            key=str(data["key"]),
            live=int(data["live"]),
            first_live=int(data["first_live"]),
            tokens=int(data["tokens"]),
            held=int(data["held"]),
            last_user=int(data["last_user"]),
        )

    def extended(
        self,
        messages: Sequence[Message],
        covered: frozenset[str],
        count: Callable[[Message], int],
    ) -> SummaryScan:
        """The sums of all of ``messages`` (which extend ``messages[:upto]``)."""
        live, first, tokens, held, user = (
            self.live,
            self.first_live,
            self.tokens,
            self.held,
            self.last_user,
        )
        for i in range(self.upto, len(messages)):
            m = messages[i]
            role = m.role
            if role == "user":
                user = i
            if role != "system" and not m.pinned and m.id not in covered:
                live += 1
                tokens += count(m)
                if first < 0:
                    first = i
            elif m.id not in covered:
                held += count(m)
        last_id = messages[-1].id if messages else ""
        return SummaryScan(len(messages), last_id, self.key, live, first, tokens, held, user)

    def fits(self, messages: Sequence[Message], key: str) -> bool:
        """Whether ``messages`` extend the history this scan summed, for ``key``."""
        if self.key != key or self.upto > len(messages):
            return False
        return self.upto == 0 or messages[self.upto - 1].id == self.last_id


def scan_key(counter_key: str, summary: SummaryState) -> str:
    """What a scan's sums depend on besides the messages: the counter (its count key)
    and which messages the summary covers."""
    return f"{counter_key}|{summary.covered_key}"


def _live_back(
    messages: Sequence[Message], covered: frozenset[str], stop: int = 0
) -> Iterator[int]:
    """Positions of the live messages, newest first, down to ``stop``."""
    for i in range(len(messages) - 1, stop - 1, -1):
        m = messages[i]
        if m.role != "system" and not m.pinned and m.id not in covered:
            yield i


def summary_due_of(
    messages: Sequence[Message],
    trigger: SummaryTrigger,
    count: Callable[[Message], int],
    window: int,
    previous: SummaryState,
    *,
    fills: bool,
    scan: SummaryScan,
) -> tuple[Due | None, SummaryScan]:
    """What :func:`~ctxwarden.memory.summaries.plan_summary` would fold (``None``:
    nothing), and the scan of ``messages`` for the next build; ``scan`` is a previous
    build's (it must :meth:`~SummaryScan.fits` them) or an empty one with the key.
    Not for the user-turns trigger (its count restarts at the last summary's newest
    message: the plan itself serves it)."""
    covered = previous.covered_ids
    now = scan.extended(messages, covered, count)
    if not now.live:
        return None, now
    held = now.held + shown_tokens(trigger, count, window, previous, fills)
    reasons = trigger_reasons(
        trigger, now.live, lambda: now.tokens, lambda: held, window, lambda: 0
    )
    if not reasons:
        return None, now

    def back() -> Iterator[int]:
        return _live_back(messages, covered)

    cut = cut_for(
        trigger,
        messages,
        reasons,
        now.live,
        now.first_live,
        back,
        count,
        window,
        lambda: held,
        now.last_user,
        now.tokens,
    )
    if now.first_live >= cut:
        return None, now
    kept = 0  # live messages at or after the cut; the first one before it is the last folded
    last = -1
    for i in back():
        if i < cut:
            last = i
            break
        kept += 1
    folded = now.live - kept
    if folded < trigger.min_fold:
        return None, now
    return (tuple(reasons), messages[now.first_live].id, messages[last].id, folded), now


def shown_tokens(
    trigger: SummaryTrigger,
    count: Callable[[Message], int],
    window: int,
    previous: SummaryState,
    fills: bool = False,
) -> int:
    """The summary as the fill ratio counts it: as shown (a focused view takes at most
    its share; a view that ``fills`` what the rest leaves yields to the messages and is
    not counted)."""
    if not previous.text or fills:
        return 0
    shown = count(Message.system(previous.text))
    if trigger.summary_share is not None:
        shown = min(shown, int(window * trigger.summary_share))
    return shown


def trigger_reasons(
    trigger: SummaryTrigger,
    live: int,
    tokens: Callable[[], int],
    fixed: Callable[[], int],
    window: int | None,
    turns: Callable[[], int],
) -> list[str]:
    """Which triggers fire for ``live`` unsummarised messages holding ``tokens()``
    tokens beside ``fixed()`` tokens folding cannot reduce, with ``turns()`` user
    turns since the last summary (each asked only when its trigger is on)."""
    reasons: list[str] = []
    if trigger.max_messages is not None and live > trigger.max_messages:
        reasons.append(f"{live} unsummarised messages > {trigger.max_messages}")
    summed: int | None = None  # the live messages' tokens, summed once for both tests
    if trigger.max_tokens is not None:
        summed = tokens()
        if summed > trigger.max_tokens:
            reasons.append(f"unsummarised messages hold {summed} tokens > {trigger.max_tokens}")
    if trigger.fill_ratio is not None and window:
        held = fixed()
        foldable = summed if summed is not None else tokens()
        used = held + foldable
        # Fire only with at least half the threshold to fold: otherwise a summary and a
        # system prompt that fill the context by themselves would fire it on every call.
        if used >= trigger.fill_ratio * window and foldable >= trigger.fill_ratio * window / 2:
            reasons.append(
                f"context fills {used / window:.0%} of {window} >= {trigger.fill_ratio:.0%}"
            )
    if trigger.every_user_turns is not None:
        n = turns()
        if n >= trigger.every_user_turns:
            reasons.append(f"{n} user turns since the last summary >= {trigger.every_user_turns}")
    return reasons


def cut_for(
    trigger: SummaryTrigger,
    messages: Sequence[Message],
    reasons: Sequence[str],
    live: int,
    first_live: int,
    live_back: Callable[[], Iterable[int]],
    count: Callable[[Message], int],
    window: int | None,
    fixed: Callable[[], int],
    last_user: int,
    tokens: int | None = None,
) -> int:
    """Where a plan cuts (see :class:`~ctxwarden.memory.summaries.SummaryPlan`): ``live``
    messages are unsummarised, the first at ``first_live``, ``live_back()`` their
    positions newest first; ``last_user`` is the newest user message's position (-1:
    none); ``tokens``, when known, the live messages' tokens (a tail cap they do not
    exceed moves nothing). Only the newest messages are read."""
    k = trigger.keep_recent
    if k == 0:
        cut = len(messages)
    elif k <= live:
        cut = next(islice(live_back(), k - 1, None))
    else:
        cut = first_live
    tail_cap = trigger.keep_recent_tokens
    if window and trigger.fill_ratio is not None and any("fills" in r for r in reasons):
        # The fill ratio fired: fold down to half of it, so the tail must grow by half the
        # threshold before it fires again (a summary per batch, not per call).
        half = int(trigger.fill_ratio * window / 2)
        room = max(half - fixed(), 0)
        tail_cap = room if tail_cap is None else min(tail_cap, room)
    if tail_cap is not None and (tokens is None or tokens > tail_cap):  # cap the tail by tokens
        tail = 0
        for i in live_back():
            tail += count(messages[i])
            if tail > tail_cap:
                cut = max(cut, i + 1)
                break
    if last_user >= 0:
        cut = min(cut, last_user)  # the newest user message is never folded
    return block_start_at(messages, cut)


def block_start_at(messages: Sequence[Message], cut: int) -> int:
    """The last block start at or before ``cut`` (``0`` if none): what grouping the
    whole list gives, from the nearest message before ``cut`` that is not a tool result
    (such a message always starts a block, so the blocks from there on are the same)."""
    first = min(cut, len(messages) - 1)
    while first > 0 and messages[first].role == "tool":
        first -= 1
    if first < 0:
        return 0
    starts = [b.start for b in group_blocks(messages[first : cut + 1], first) if b.start <= cut]
    return max(starts, default=0)
