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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from ctxwarden.errors import InvalidMessageError
from ctxwarden.messages import Message

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
    build asks it of its window twice, and the answer is nearly always yes."""
    i, n = 0, len(messages)
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
