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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ctxwarden.core.messages import Message
from ctxwarden.core.pairing import Block, group_blocks
from ctxwarden.steps.base import Action, Draft, StepContext, StepResult, system_block
from ctxwarden.steps.ledger import (
    LEDGER_ID,
    LEDGER_MORE_ID,
    LedgerBuilder,
    LedgerSources,
    carried_ledger,
    ledger_cap,
    ledger_from,
)
from ctxwarden.steps.memos import memo_of, register_memo
from ctxwarden.steps.state import PREFIX_DIGITS
from ctxwarden.steps.window import is_pinned

__all__ = [
    "FitMemo",
    "FitStep",
    "capped_count",
    "ledger_sources",
    "pin_ids",
    "shown_blocks",
    "window_positions",
]


def window_positions(draft: Draft) -> dict[str, int]:
    """Message id -> position in the history, for the window's messages."""
    return {m.id: i for i, m in enumerate(draft.history[draft.start :], draft.start)}


def ledger_sources(draft: Draft, window: Sequence[Message]) -> list[Message]:
    """Originals from the window region whose values the context no longer shows:
    masked, dropped, or truncated without listing its cut values in place (a truncation
    that lists them keeps the ledger — near the top — unchanged, so the prefix stays
    cached). Rejected messages are not: they are not history the agent saw."""
    edits, history, rejected = draft.edits, draft.history, draft.rejected
    listed = {k for k, e in edits.items() if e.action == "truncated" and e.listed}
    shown = {m.id for m in window if m.id not in edits or m.id in listed}
    hidden = {history[i].id for i in draft.pinned}.union(shown, rejected)
    return [m for m in history[draft.start :] if m.id not in hidden]


def shown_blocks(draft: Draft) -> list[Message]:
    """The blocks sent with the ledger whose values it need not repeat: the system
    prompt and the facts layer (the pinned messages are added by the ledger's builder).
    Not the summary or recall layers: with a summariser that focuses, their text follows
    the newest user message, and a ledger that left out what they show would change
    with every question (and lose what the next view no longer shows)."""
    return [*draft.system, *(m for name, m in draft.layers if name == "facts")]


@dataclass(frozen=True)
class FitMemo:
    """The fit's memo (``memos["fit"]``): the first message kept after the drops it made
    inside the window (its id; ``""``: none), which the next build's drops repeat
    (:func:`sticky_drops`)."""

    kept_from: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kept_from": self.kept_from}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FitMemo:
        return cls(str(data.get("kept_from", "")))


register_memo("fit", FitMemo)


@dataclass(frozen=True)
class FitStep:
    """Fits the window and renders the ledger (see the module docstring)."""

    name: str = "fit"
    keeps_pairs: ClassVar[bool] = True  # drops whole blocks

    def ledger_cap(self, draft: Draft, ctx: StepContext, grows: bool = True) -> int:
        """The ledger block's cap, which this step renders
        (:func:`~ctxwarden.steps.ledger.ledger_cap`): the other steps read it as
        :meth:`StepContext.ledger_cap <ctxwarden.steps.base.StepContext.ledger_cap>`."""
        return ledger_cap(draft, ctx, grows=grows)

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        original = draft.window
        draft, earlier = sticky_drops(draft, ctx)
        h = draft.history
        # the window's blocks (and positions) are made only once something must go: most
        # builds fit as they are, and then the window is the draft's, message for message
        blocks: list[Block] | None = None
        pos: dict[str, int] = {}
        first = ledger_from(draft, ctx)
        memo = carried_ledger(ctx.previous) if ctx.previous.history_length else None
        builder = LedgerBuilder(
            ctx.counter, ledger_cap(draft, ctx), ctx.earlier, memo, shown_blocks(draft)
        )
        fixed = ctx.fixed + ctx.total([m for _, m in draft.layers])
        limit = ctx.policy.window.max_messages
        actions: list[Action] = list(earlier)
        start, pinned = draft.start, list(draft.pinned)
        ledger: Message | None = None
        base: Message | None = None
        for _ in range(4):
            current = draft.but(start=start, pinned=tuple(pinned))
            window = draft.window if blocks is None else [m for b in blocks for m in b.messages]
            edited = ledger_sources(current, window)
            ledger = builder.render(h, first, start, pinned, edited)
            held = held_ledger(start, ctx)
            if held is not None:
                base, ledger = held
            else:
                base, ledger = stacked_ledger(ledger, builder, ctx, edited, [h[i] for i in pinned])
            room = (
                ctx.budget
                - fixed
                - ctx.total([h[i] for i in pinned])
                - ctx.total([m for m in (base, ledger) if m is not None])
            )
            used = ctx.total(window)  # the blocks' messages, in order
            over_count = limit is not None and capped_count(window, draft) > limit
            low = int(room * ctx.policy.window.refill_ratio)
            if used <= room and not over_count and not (ctx.compacting and used > low):
                break
            # the window must move, or a compaction rewrites it anyway: down to the
            # low-water mark, so the next turns append without moving it again
            target = low if used > room or ctx.compacting else room
            if blocks is None:
                blocks, pos = group_blocks(draft.window), window_positions(draft)
            blocks, dropped = _drop_oldest(blocks, target, draft, limit, ctx)
            actions.extend(dropped)
            start, pinned = _new_start(blocks, pos, start, pinned, draft)
            blocks = [b for b in blocks if pos[b.head.id] >= start]  # the rest is pinned now
        window = draft.window if blocks is None else tuple(m for b in blocks for m in b.messages)
        new = draft.but(
            start=start,
            pinned=tuple(pinned),
            window=window,
            ledger=ledger,
            ledger_base=base,
        )
        new = new.with_memo("ledger", LedgerSources(first, builder.memo))
        new = new.with_memo("fit", FitMemo(_kept_from(original, window, actions)))
        return StepResult(new, tuple(actions))


EARLIER = "window (earlier build)"
"""The strategy of the drops :func:`sticky_drops` repeats: not a move of this build."""


def sticky_drops(draft: Draft, ctx: StepContext) -> tuple[Draft, tuple[Action, ...]]:
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
    window that is the next compaction's to make."""
    memo = memo_of(ctx.previous, "fit", FitMemo) if ctx.previous.history_length else None
    keep_from = memo.kept_from if memo is not None else ""
    if not keep_from:
        return draft, ()
    cut = next((i for i, m in enumerate(draft.window) if m.id == keep_from), 0)
    if cut == 0:
        return draft, ()
    sent = _sent_digests(ctx)
    kept: list[Message] = []
    actions: list[Action] = []
    for block in group_blocks(draft.window[:cut]):
        if any(m.id in draft.protected for m in block.messages) or (
            sent and all(m.fingerprint[:PREFIX_DIGITS] in sent for m in block.messages)
        ):
            kept.extend(block.messages)
            continue
        actions.extend(
            Action(m.id, "dropped", "left the window in an earlier build", ctx.count(m), 0, EARLIER)
            for m in block.messages
        )
    if not actions:
        return draft, ()
    return draft.but(window=(*kept, *draft.window[cut:])), tuple(actions)


def _sent_digests(ctx: StepContext) -> frozenset[str]:
    """The digests of the previous context's messages, when the build is held (else
    empty: a compaction or a build without append-only repeats every earlier drop)."""
    if not ctx.hold:
        return frozenset()
    return frozenset(d[:PREFIX_DIGITS] for d in ctx.previous.prefix)


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


def held_ledger(start: int, ctx: StepContext) -> tuple[Message | None, Message] | None:
    """Between compactions (``ctx.hold``, :mod:`ctxwarden.pipeline.compaction`) the ledger
    blocks are the ones the previous context sent (kept in its state, so a replica holds
    the same), while the window has not moved: a new result cut on arrival adds its values
    at the next compaction, not by rewriting the ledger (and everything after it) now.
    ``None``: send the one just rendered."""
    previous = ctx.previous
    if not ctx.hold or previous.window_start != start or not previous.ledger_sent:
        return None
    if previous.ledger_base_sent:
        base = system_block(previous.ledger_base_sent, LEDGER_ID)
        return base, system_block(previous.ledger_sent, LEDGER_MORE_ID)
    return None, system_block(previous.ledger_sent, LEDGER_ID)


def stacked_ledger(
    rendered: Message | None,
    builder: LedgerBuilder,
    ctx: StepContext,
    edited: Sequence[Message],
    pinned: Sequence[Message],
) -> tuple[Message | None, Message | None]:
    """The ledger a compaction sends: the block sent before kept in place, and after it
    a block of the values it does not show (``(kept, more)``); else ``(None, rendered)``.

    Values only accumulate in the ledger as the window moves, so the block a compaction
    sent still holds (the values of messages that are still out of the context); sent
    again as it was, the prompt cache still serves it, and a compaction rewrites only
    the new values after it, not the whole ledger. The kept block is the first of the
    previous context's ledger blocks, so there are never more than two. It is rendered
    anew as one block (what every build without a previous one sends) when both would
    not fit the ledger's cap together (a full rendering ranks every value against the
    cap), or when the new values take more tokens than the kept block: each rendering
    anew then at least doubles the kept block, and the values written again at
    compactions stay within about the size of the ledger.
    """
    previous = ctx.previous
    if (
        rendered is None
        or not ctx.policy.cache.append_only
        or not previous.history_length
        or not previous.ledger_sent
    ):
        return None, rendered
    kept = previous.ledger_base_sent or previous.ledger_sent
    if rendered.text == kept:
        return None, rendered
    base = system_block(kept, LEDGER_ID)
    text = builder.beyond(base, edited, pinned)
    if text is None:  # it shows every value still to show
        return None, base
    more = system_block(text, LEDGER_MORE_ID)
    size, extra = ctx.count(base), ctx.count(more)
    if size + extra > builder.cap or extra > size:
        return None, rendered
    return base, more


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
    for b in blocks:
        first = pos[b.head.id]
        before_newest = draft.newest is None or first + len(b.messages) <= draft.newest
        if before_newest and any(is_pinned(m) for m in b.messages):
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
