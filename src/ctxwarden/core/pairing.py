"""Tool-call pairing: which tool results answer which call, by position and id.

Real APIs reject a tool result whose call is not in the assistant message right
before it, and an assistant tool call whose results are missing. Recorded traces also
reuse call ids (the tau-bench airline file reuses 71 ids across 144 calls), so pairing
by id alone is ambiguous: a result belongs to the nearest preceding assistant message
whose calls are still unanswered and carry that id, within the run of tool messages
that directly follows it.

Everything that drops or keeps messages works on :class:`Block` s: an assistant tool
call together with its results is one block, kept or dropped as one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from operator import is_
from typing import Literal, NamedTuple

from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import Message, check_message_list

__all__ = [
    "Block",
    "PairingProblem",
    "all_sendable",
    "group_blocks",
    "pairing_problems",
    "validate_appended",
    "validate_pairing",
]


class Block(NamedTuple):
    """Messages that must travel together: one message, or a tool call and its results.

    A named tuple: every build makes one per message of its window.
    """

    start: int
    messages: tuple[Message, ...]
    unanswered: tuple[str, ...] = ()
    orphan: bool = False

    @property
    def end(self) -> int:
        """Index one past the block's last message."""
        return self.start + len(self.messages)

    @property
    def sendable(self) -> bool:
        """False for an orphan result or a call missing results: providers reject both."""
        return not self.orphan and not self.unanswered

    @property
    def head(self) -> Message:
        return self.messages[0]


@dataclass(frozen=True)
class PairingProblem:
    index: int
    problem: Literal["orphan_result", "unanswered_call"]
    call_id: str

    def describe(self) -> str:
        if self.problem == "orphan_result":
            return (
                f"tool result for call {self.call_id!r} has no matching tool call right before it"
            )
        return f"tool call {self.call_id!r} has no tool result after it"


def group_blocks(messages: Sequence[Message], offset: int = 0) -> list[Block]:
    """Split a conversation into blocks, pairing tool results with calls by position;
    block starts count from ``offset`` (the position of ``messages[0]`` in a history)."""
    check_message_list(messages)
    blocks: list[Block] = []
    i, n = 0, len(messages)
    while i < n:
        msg = messages[i]
        if msg.is_tool_call:
            pending: dict[str, int] = {}  # call id -> results still owed (ids can repeat)
            for c in msg.tool_calls:
                pending[c.id] = pending.get(c.id, 0) + 1
            j = i + 1
            while j < n and messages[j].role == "tool":
                call_id = messages[j].tool_call_id or ""
                if not pending.get(call_id):
                    break
                pending[call_id] -= 1
                j += 1
            missing = tuple(cid for cid, left in pending.items() for _ in range(left))
            blocks.append(Block(offset + i, tuple(messages[i:j]), unanswered=missing))
            i = j
        else:
            blocks.append(Block(offset + i, (msg,), orphan=msg.role == "tool"))
            i += 1
    return blocks


def all_sendable(messages: Sequence[Message]) -> bool:
    """``all(b.sendable for b in group_blocks(messages))`` without making the blocks: every
    build asks it of its window twice, and the answer is nearly always yes.

    A long window mostly starts with one already found sendable (this build's window
    before its edits, the last build's after them), whose blocks are all whole: then
    the answer is the one for the messages after it, which alone are scanned."""
    if len(messages) < _SENDABLE_MIN:
        return _scan(messages, 0)
    known = _SENDABLE.known(messages)
    if known == len(messages):
        return True
    if not _scan(messages, known):
        return False
    _SENDABLE.add(messages)
    return True


def _scan(messages: Sequence[Message], i: int) -> bool:
    """Whether ``messages[i:]`` (starting on a block) are whole blocks only."""
    n = len(messages)
    while i < n:
        msg = messages[i]
        if msg.role == "tool":
            return False  # a result no call right before it claimed
        if msg.tool_calls and msg.role == "assistant":
            pending: dict[str, int] = {}
            for c in msg.tool_calls:
                pending[c.id] = pending.get(c.id, 0) + 1
            owed = len(msg.tool_calls)
            i += 1
            while i < n and messages[i].role == "tool":
                call_id = messages[i].tool_call_id or ""
                if not pending.get(call_id):
                    break
                pending[call_id] -= 1
                owed -= 1
                i += 1
            if owed:
                return False  # a call missing results
        else:
            i += 1
    return True


class _Sendable:
    """Windows found sendable, a few per first message, the newest kept. A window is
    known by its messages' identity: it holds them, so no other object takes their ids
    while it is kept."""

    def __init__(self, keys: int = 512, per_key: int = 4) -> None:
        self._windows: OrderedDict[int, list[tuple[Message, ...]]] = OrderedDict()
        self._keys, self._per_key = keys, per_key
        self._lock = threading.Lock()

    def known(self, messages: Sequence[Message]) -> int:
        """The length of the longest kept window ``messages`` starts with (0: none)."""
        n, best = len(messages), 0
        with self._lock:
            kept = list(self._windows.get(id(messages[0]), ()))
        for window in kept:
            k = len(window)
            if (
                best < k <= n
                and messages[k - 1] is window[-1]
                and all(map(is_, islice(messages, k), window))
            ):
                best = k
        return best

    def add(self, messages: Sequence[Message]) -> None:
        window, key = tuple(messages), id(messages[0])
        with self._lock:
            kept = [w for w in self._windows.pop(key, ()) if w is not window]
            self._windows[key] = [*kept[-(self._per_key - 1) :], window]
            while len(self._windows) > self._keys:
                self._windows.popitem(last=False)


_SENDABLE_MIN = 32
"""Windows shorter than this are scanned whole (the memo would cost more than it saves)."""
_SENDABLE = _Sendable()


def pairing_problems(messages: Sequence[Message]) -> list[PairingProblem]:
    """Every orphan tool result and unanswered tool call, in order."""
    problems: list[PairingProblem] = []
    for block in group_blocks(messages):
        if block.orphan:
            problems.append(
                PairingProblem(block.start, "orphan_result", block.head.tool_call_id or "")
            )
        for call_id in block.unanswered:
            problems.append(PairingProblem(block.start, "unanswered_call", call_id))
    return problems


def validate_pairing(messages: Sequence[Message], *, allow_pending_tail: bool = True) -> None:
    """Raise :class:`InvalidMessageError` for the first orphan result or unanswered call.

    ``allow_pending_tail`` accepts a final assistant tool call still waiting for its
    results (an agent mid-turn).
    """
    check_message_list(messages)
    last_block_start = group_blocks(messages)[-1].start if messages else -1
    for p in pairing_problems(messages):
        if p.problem == "unanswered_call" and allow_pending_tail and p.index == last_block_start:
            continue
        raise InvalidMessageError(p.describe(), index=p.index, field="tool_call_id")


def validate_appended(tail: Sequence[Message], new: Sequence[Message]) -> None:
    """Raise :class:`InvalidMessageError` if appending ``new`` after ``tail`` (the stored
    history's last block: a tool call still waiting for results, or any last message)
    would store what a build must reject: a tool result with no call right before it,
    or a call the conversation moved on from without its results. ``index`` counts
    within ``new``; a call at the very end may still wait for its results."""
    joined = [*tail, *new]
    if not new:
        return
    last_block_start = group_blocks(joined)[-1].start
    problems = pairing_problems(joined)
    problems.sort(key=lambda p: p.index < len(tail))  # this call's own problems first
    for p in problems:
        if p.index < len(tail) and p.problem == "orphan_result":
            continue  # already stored: not this call's doing
        if p.problem == "unanswered_call" and p.index == last_block_start:
            continue
        if p.problem == "unanswered_call" and p.index < len(tail):
            where = len(tail) - p.index
            raise InvalidMessageError(
                f"{p.describe()} (the stored message {where} from the end); add its results "
                "before anything else",
                index=0,
                field="tool_call_id",
            )
        raise InvalidMessageError(p.describe(), index=p.index - len(tail), field="tool_call_id")
