"""The window's fit (R6, R10): drop the oldest blocks until the context fits.

The budget left for the window is what the system prompt, the layers, the pinned
messages and the entity ledger leave; the ledger grows as the window drops messages, so
the two are settled together in a few rounds. When the window must move it moves far
enough to fill only ``window.refill_ratio`` of its room, so the next turns append without
moving it again and consecutive requests share a byte-identical prefix; a cache-aware
compaction (:mod:`ctxwarden.pipeline.compaction`) takes it down to that low-water mark even
when it still fits, since the context is rewritten anyway.

A block is dropped whole; protected blocks (the newest user message, the newest tool-call
block, pinned and critical messages) are never dropped here. Pinned blocks the new window
start passes join the pinned layer. What still does not fit is the eviction step's.

``window.max_messages`` caps the window's own messages: pinned, critical and ``pin_first``
blocks live outside it (issue 35: counting them let five pins fill a cap of five and
pushed out every unpinned turn with the budget 91% free). Each drop names its cause: the
cap (``left the window (window.max_messages=N)``) when the cap alone excludes the block,
else the budget.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ctxwarden.core.messages import Message
from ctxwarden.core.pairing import Block, group_blocks
from ctxwarden.steps.base import Action, Draft, LedgerBlocks, StepContext, StepResult
from ctxwarden.steps.memos import memo_of, register_memo
from ctxwarden.steps.state import PREFIX_DIGITS
from ctxwarden.steps.task import cut_action, cut_in_window, sent_cut_in
from ctxwarden.steps.window import is_pinned, long_turn

__all__ = [
    "FitMemo",
    "FitStep",
    "capped_count",
    "pin_ids",
    "window_positions",
]


def window_positions(draft: Draft) -> dict[str, int]:
    """Message id -> position in the history, for the window's messages."""
    return {m.id: i for i, m in enumerate(draft.history[draft.start :], draft.start)}


@dataclass(frozen=True)
class FitMemo:
    """The fit's memo (``memos["fit"]``): the first message kept after the drops it made
    inside the window (its id; ``""``: none), which the next build's drops repeat
    (:func:`sticky_drops`)."""

    kept_from: str = ""
    task_cut: bool = False  # the task, in the window, was sent cut (steps.task)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kept_from": self.kept_from}
        if self.task_cut:  # (absent from states stored before it was)
            out["task_cut"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FitMemo:
        return cls(str(data.get("kept_from", "")), bool(data.get("task_cut", False)))


register_memo("fit", FitMemo)


@dataclass(frozen=True)
class FitStep:
    """Fits the window and, with it, the entity ledger (see the module docstring).

    ``ledger_blocks`` is the ledger the fit settles with the window
    (:class:`~ctxwarden.steps.base.LedgerBlocks`; the cascade gives
    :class:`~ctxwarden.steps.ledger.EntityLedgerBlocks`; ``None``: no ledger). The two
    are settled together because the room the window has is what the ledger leaves, and
    the ledger holds what the window drops; the fit knows of the ledger only that typed
    value, and the other steps read the same one (``ctx.ledger``)."""

    name: str = "fit"
    ledger_blocks: LedgerBlocks | None = None
    keeps_pairs: ClassVar[bool] = True  # drops whole blocks

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        original = draft.window
        memo = memo_of(ctx.previous, "fit", FitMemo) if ctx.previous.history_length else None
        draft, earlier = sticky_drops(draft, ctx, memo)
        cut = cut_in_window(draft) if memo is not None and memo.task_cut else None
        draft = cut or draft  # (the task, cut at an earlier move: steps.task)
        # the window's blocks (and positions) are made only once something must go: most
        # builds fit as they are, and then the window is the draft's, message for message
        blocks: list[Block] | None = None
        pos: dict[str, int] = {}
        ledgers = self.ledger_blocks
        settling = ledgers.settle(draft, ctx) if ledgers is not None else None
        fixed = ctx.fixed + ctx.total([m for _, m in draft.layers])
        limit = ctx.max_messages
        actions: list[Action] = list(earlier)
        start, pinned = draft.start, list(draft.pinned)
        ledger: Message | None = None
        base: Message | None = None
        for _ in range(5):
            current = draft.but(start=start, pinned=tuple(pinned))
            window = draft.window if blocks is None else [m for b in blocks for m in b.messages]
            free = ctx.budget - fixed - ctx.total(draft.pinned_at(pinned))
            used = ctx.total(window)  # the blocks' messages, in order
            # a request the window passed counts with it, as while the window started at
            # it: the low-water mark is what it was then (steps.window.reopened)
            asked = ctx.total(draft.pinned_at([draft.newest])) if draft.newest in pinned else 0
            span = (
                ledgers.compaction_span(draft, ctx)
                if blocks is None and ledgers is not None and ctx.compacting and not ctx.forecast
                else None
            )
            low, planned = _planned_move(span, draft, free, used, asked, limit, ctx)
            if low is None or used <= low:  # (else the window moves whatever the blocks)
                if settling is not None:  # the ledger for this window, as it will be sent
                    base, ledger = settling.blocks(current, window)
                shown = ctx.total([m for m in (base, ledger) if m is not None])
                room = free - shown
                over_count = limit is not None and capped_count(window, draft) > limit
                regrowth = 0
                if ctx.compacting and ledgers is not None:  # room the ledger grows back into
                    regrowth = ledgers.regrowth(draft, ctx, shown)
                low = _low_water(room - regrowth, asked, ctx)
                if used <= room and not over_count and not (ctx.compacting and used > low):
                    break
                target = low if ctx.compacting or used > room else room
            else:  # a compaction's move, known before the blocks (no room settled for it)
                target = low
            # the window must move, or a compaction rewrites it anyway: down to the
            # low-water mark, so the next turns append without moving it again
            if blocks is None and cut is None and (cut := cut_in_window(draft)) is not None:
                draft = cut  # first the task is cut to its share (steps.task)
                continue
            grouped = blocks is not None
            if blocks is None:
                blocks, pos = planned or group_blocks(draft.window), window_positions(draft)
            blocks, dropped = _drop_oldest(blocks, target, draft, limit, ctx)
            actions.extend(dropped)
            moved = _new_start(blocks, pos, start, pinned, draft)
            if grouped and not dropped and moved == (start, pinned):
                break  # nothing left to drop: every further try is this one again
            start, pinned = moved
            blocks = [b for b in blocks if pos[b.head.id] >= start]  # the rest is pinned now
            if ctx.hold and dropped:
                # a held build whose window moves is not sent: the engine compacts
                # (compaction.held_cause), and a ledger settled with the moved window
                # (rendered anew: it is not the one sent) would be built for nothing
                break
        window = draft.window if blocks is None else tuple(m for b in blocks for m in b.messages)
        new = draft.but(
            start=start,
            pinned=tuple(pinned),
            window=window,
            ledger=ledger,
            ledger_base=base,
        )
        if settling is not None:
            new = settling.carried(new)
        task_cut = cut_action(new, ctx)  # the task sent cut, pinned or in the window
        if task_cut is not None:
            actions.append(task_cut)
        in_window = sent_cut_in(draft, window)  # (the task itself while it is the newest request)
        kept = _kept_from(original, window, actions) or _past_request(draft, start)
        new = new.with_memo("fit", FitMemo(kept, in_window))
        return StepResult(new, tuple(actions))


def _planned_move(
    span: tuple[int, int] | None,
    draft: Draft,
    free: int,
    used: int,
    asked: int,
    limit: int | None,
    ctx: StepContext,
) -> tuple[int | None, list[Block] | None]:
    """The window's low-water mark in a compaction, when it is known before the ledger's
    blocks are settled (``span``: the least and the most they and their regrowth take,
    :meth:`~ctxwarden.steps.base.LedgerBlocks.compaction_span`), and the window's blocks
    when they were grouped to know it; ``(None, None)``: the blocks must be settled first.

    One number (a ledger with a low-water mark): the mark is that of the room it leaves.
    A span: the mark lies between those of its ends, and it is known when the window is
    above the higher one (it moves wherever the blocks fall) and a move down to either
    end keeps the same blocks (no block's edge lies between them): the ledger is then
    settled only for the window it moves to, not first for the one it leaves (two thirds
    of the compactions of a coding agent's loop at 4,000 tokens, where the ledger has no
    low-water mark: a rendering each)."""
    if span is None:
        return None, None
    least, most = span
    low = _low_water(free - most, asked, ctx)
    if least == most:
        return low, None
    high = _low_water(free - least, asked, ctx)
    if used <= high:
        return None, None
    blocks = group_blocks(draft.window)
    kept_low, dropped = _drop_oldest(blocks, low, draft, limit, ctx)
    kept_high, _ = _drop_oldest(blocks, high, draft, limit, ctx)
    if not dropped or len(kept_low) != len(kept_high):
        return None, None
    return low, blocks


def _low_water(room: int, asked: int, ctx: StepContext) -> int:
    """The window's low-water mark in ``room`` (what the ledger leaves it, less the room
    the ledger grows back into), a request the window passed (``asked`` tokens) counted
    with it."""
    return int((room + asked) * ctx.refill_ratio) - asked


EARLIER = "window (earlier build)"
"""The strategy of the drops :func:`sticky_drops` repeats: not a move of this build."""


def sticky_drops(
    draft: Draft, ctx: StepContext, memo: FitMemo | None
) -> tuple[Draft, tuple[Action, ...]]:
    """Blocks an earlier build dropped from inside the window stay dropped.

    The window never starts after the newest user message, so in a long turn (a coding
    agent's one task, then hundreds of tool calls) the fit drops blocks *inside* the
    window and its start stays put. Without memory the next build would take them back and
    drop them again, moving the prefix at every call; the previous state's ``kept_from``
    (the first message kept after such drops, by id) keeps every unprotected block before
    it out, so the context stays append-only until the next compaction.

    Only earlier drops are repeated: between compactions (``ctx.hold``) a block the
    previous context sent stays. A block kept then because it was protected (the newest
    user message, among blocks dropped after it) is not protected once a newer user
    message comes, and dropping it here would rewrite everything after it: a move of the
    window that is the next compaction's to make. ``memo``: the previous build's."""
    keep_from = memo.kept_from if memo is not None else ""
    if not keep_from:
        return draft, ()
    cut = next((i for i, m in enumerate(draft.window) if m.id == keep_from), 0)
    if cut == 0:
        return draft, ()
    blocks = group_blocks(draft.window[:cut])
    keeps = _still_sent(blocks, draft, cut, _sent_digests(ctx), ctx.previous.history_length)
    kept: list[Message] = []
    actions: list[Action] = []
    for block, keep in zip(blocks, keeps, strict=True):
        if keep:
            kept.extend(block.messages)
            continue
        actions.extend(
            Action(m.id, "dropped", "left the window in an earlier build", ctx.count(m), 0, EARLIER)
            for m in block.messages
        )
    if not actions:
        return draft, ()
    return draft.but(window=(*kept, *draft.window[cut:])), tuple(actions)


def _still_sent(
    blocks: Sequence[Block], draft: Draft, cut: int, sent: Counter[str], new_from: int
) -> list[bool]:
    """Which of the ``blocks`` before the window's ``cut`` stay: the protected ones, and
    between compactions those the previous context sent (``sent``: its digests). Each
    sent copy vouches for one message: first for the messages kept anyway (from ``cut``
    on, the protected blocks), then for the other blocks newest first (:func:`_claim`).
    A message new to this build (``draft.history[new_from:]``) was not sent, so it takes
    no copy: the harness's "provide exactly one action", repeated as the new request,
    had taken the copy of the older one the previous context sent, which then left the
    window between compactions (a rewrite of everything after it)."""
    keeps = [any(m.id in draft.protected for m in b.messages) for b in blocks]
    if not sent:
        return keeps
    new = {m.id for m in draft.history[new_from:]}
    sent.subtract(m.fingerprint[:PREFIX_DIGITS] for m in draft.window[cut:] if m.id not in new)
    for block, keep in zip(blocks, keeps, strict=True):
        if keep:
            sent.subtract(m.fingerprint[:PREFIX_DIGITS] for m in block.messages)
    for i in range(len(blocks) - 1, -1, -1):
        keeps[i] = keeps[i] or _claim(sent, blocks[i].messages)
    return keeps


def _claim(sent: Counter[str], block: Sequence[Message]) -> bool:
    """Whether every message of ``block`` was sent: a copy of its digest is left in
    ``sent`` for each, which it then takes. A digest is a message's content, not its id,
    and an agent's harness repeats messages word for word ("provide exactly one
    action"): an older copy the last compaction dropped must not come back on the
    strength of the newer one that was sent."""
    digests = Counter(m.fingerprint[:PREFIX_DIGITS] for m in block)
    if not sent or any(sent[d] < n for d, n in digests.items()):
        return False
    sent.subtract(digests)
    return True


def _sent_digests(ctx: StepContext) -> Counter[str]:
    """The digests of the previous context's messages, when the build is held (else
    empty: a compaction or a build without append-only repeats every earlier drop)."""
    if not ctx.hold:
        return Counter()
    return Counter(d[:PREFIX_DIGITS] for d in ctx.previous.prefix)


def _kept_from(
    original: Sequence[Message], window: Sequence[Message], actions: Sequence[Action]
) -> str:
    """The id of the first message kept after the last window message dropped (from
    ``original``, the window before the fit); ``""`` when none was dropped, or none kept
    after."""
    dropped = {a.message_id for a in actions if a.action == "dropped"}
    if not dropped:
        return ""
    kept = {m.id for m in window}
    last = max((i for i, m in enumerate(original) if m.id in dropped), default=-1)
    return next((m.id for m in original[last + 1 :] if m.id in kept), "")


def _past_request(draft: Draft, start: int) -> str:
    """The window's first message when its start is past the newest user message (which
    is then pinned): the next build that reopens the window at that request, once a newer
    one came (:func:`~ctxwarden.steps.window.WindowStep`), drops what lay between them
    again (:func:`sticky_drops`), as a window that had started at the request would."""
    at, h = draft.newest, draft.history
    return h[start].id if at is not None and at < start < len(h) else ""


def _new_start(
    blocks: Sequence[Block],
    pos: Mapping[str, int],
    start: int,
    pinned: list[int],
    draft: Draft,
) -> tuple[int, list[int]]:
    """The window start after a drop: the first kept block that is not pinned; pinned
    blocks before it join the pinned layer."""
    new_start = start
    moved: list[int] = []
    task = draft.history[draft.task].id if draft.task is not None else None
    for b in blocks:
        first = pos[b.head.id]
        before_newest = draft.newest is None or first + len(b.messages) <= draft.newest
        request = first == draft.newest and long_turn(draft)  # a pin once passed
        if request or (before_newest and any(is_pinned(m) or m.id == task for m in b.messages)):
            moved.extend(range(first, first + len(b.messages)))
            continue
        new_start = max(first, start)
        break
    else:
        new_start = max(start, max((pos[b.messages[-1].id] + 1 for b in blocks), default=start))
    keep_moved = [i for i in moved if i < new_start]
    return new_start, sorted({*pinned, *keep_moved})


def pin_ids(draft: Draft) -> frozenset[str]:
    """Ids of the window's pins: pinned, critical and ``pin_first`` messages (protected
    but not anchors, or pinned anchors). They do not count against ``max_messages``."""
    pins = draft.protected - draft.anchors
    pinned_anchors = {m.id for m in draft.window if m.id in draft.anchors and is_pinned(m)}
    return pins | pinned_anchors if pinned_anchors else pins


def capped_count(messages: Sequence[Message], draft: Draft) -> int:
    """How many of ``messages`` count against ``window.max_messages``: all but the
    messages of blocks that hold a pin (a pinned call brings its results)."""
    pins = pin_ids(draft)
    if not any(m.id in pins for m in messages):
        return len(messages)
    return sum(
        len(b.messages) for b in group_blocks(messages) if not any(m.id in pins for m in b.messages)
    )


def _drop_oldest(
    blocks: Sequence[Block],
    target: int,
    draft: Draft,
    max_messages: int | None,
    ctx: StepContext,
) -> tuple[list[Block], list[Action]]:
    """Keep the protected blocks and the newest contiguous blocks that fit ``target``
    and, pins apart, ``max_messages``; each dropped message says why: the cap when the
    cap alone excludes it (whatever the budget), else the budget."""
    protected, pins = draft.protected, pin_ids(draft)
    is_protected = [any(m.id in protected for m in b.messages) for b in blocks]
    counted = [not any(m.id in pins for m in b.messages) for b in blocks]
    pairs = list(zip(blocks, is_protected, strict=True))
    used = sum(ctx.total(b.messages) for b, p in pairs if p)
    base = sum(len(b.messages) for (b, p), c in zip(pairs, counted, strict=True) if p and c)
    count, capped_from = base, -1  # blocks at or before capped_from: the cap excludes them
    for i in range(len(blocks) - 1, -1, -1):
        if not is_protected[i]:
            count += len(blocks[i].messages)
            if max_messages is not None and count > max_messages:
                capped_from = i
                break
    keep = list(is_protected)
    for i in range(len(blocks) - 1, capped_from, -1):
        if is_protected[i]:
            continue
        tokens = ctx.total(blocks[i].messages)
        if used + tokens > target:
            break
        keep[i] = True
        used += tokens
    by_cap = f"left the window (window.max_messages={max_messages})"
    actions = [
        Action(m.id, "dropped", by_cap if i <= capped_from else "left the window (budget)",
               ctx.count(m), 0, "window")
        for i, (b, kept) in enumerate(zip(blocks, keep, strict=True))
        if not kept
        for m in b.messages
    ]  # fmt: skip
    return [b for b, k in zip(blocks, keep, strict=True) if k], actions
