"""The entity-ledger block of a build: values from messages the context no longer shows.

Everything before the window start (that is not pinned), and the original text of every
masked or truncated result that does not list its cut values itself, feeds
:class:`~ctxwarden.memory.entity_ledger.EntityLedger`; its rendering becomes one system
block near the top of the context (two after a cache-aware compaction: the block sent
before, kept so the prompt cache still serves it, and the values it does not show,
:func:`~ctxwarden.steps.ledger.stacked_ledger`).

The region before the window only grows (the window start is sticky), so a conversation's
ledger is extended, never rebuilt: the previous build's
:class:`LedgerMemo` (part of its explicit state: ``BuildState.memos["ledger"]``, a
:class:`LedgerSources`) holds the ledger up to its window start and the block it
rendered, so a build costs the messages that left the window since, and re-renders only
when the window moved or a batch was masked.

A cold build (no previous state) of a history this process has built before — a
restarted session in a long-lived worker — finds the ledger of its look-back in
:func:`ledger_of`, a bounded, locked memo of a pure function (the ledger of some
messages, from empty); without it every output is the same.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from ctxwarden.core.caching import BoundedCache
from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.memory.entities import extract_entities
from ctxwarden.memory.entity_ledger import DEFAULT_HEADER, EntityLedger
from ctxwarden.steps.base import Draft, LedgerSettling, StepContext, system_block
from ctxwarden.steps.memos import memo_of, register_memo

__all__ = [
    "LEDGER_ID",
    "LEDGER_MORE_ID",
    "LEDGER_REFILL",
    "CarriedLedger",
    "EntityLedgerBlocks",
    "LedgerBuilder",
    "LedgerMemo",
    "LedgerSources",
    "Shown",
    "carried_ledger",
    "held_ledger",
    "ledger_cap",
    "ledger_low_water",
    "ledger_memo",
    "ledger_of",
    "ledger_sources",
    "seed_tag",
    "sent_ledger",
    "shown_blocks",
    "shown_values",
    "stacked_ledger",
]

LEDGER_ID = "ctxwarden:ledger"
LEDGER_MORE_ID = "ctxwarden:ledger+"  # the values a kept ledger block does not show
_FRAMING = 5  # message framing + role tokens around the ledger text


@dataclass(frozen=True)
class LedgerMemo:
    """The entity ledger of ``history[first:upto]`` less pinned messages (on top of
    the caller's ``earlier`` seed named by ``seed``), and the block last rendered from it
    with what it was rendered for (``key``): the next build extends the ledger by the
    messages that left the window since, and reuses the block when nothing changed."""

    first: int = 0
    upto: int = 0
    seed: str = ""
    ledger: EntityLedger = field(default_factory=EntityLedger)
    key: str = ""
    text: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "first": self.first,
            "upto": self.upto,
            "seed": self.seed,
            "ledger": self.ledger.to_dict(),
            "key": self.key,
            "text": self.text,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LedgerMemo:
        text = data.get("text")
        return cls(
            first=int(data.get("first", 0)),
            upto=int(data["upto"]),
            seed=str(data.get("seed", "")),
            ledger=EntityLedger.from_dict(data["ledger"]),
            key=str(data.get("key", "")),
            text=None if text is None else str(text),
        )


@dataclass(frozen=True)
class LedgerSources:
    """The ledger's memo (``memos["ledger"]``; the fit renders the ledger): where its
    sources begin (``begin``: kept by the next build, which reads no further back) and the
    ledger of them with the block rendered from it (``memo``; ``None``: none to extend)."""

    begin: int = 0
    memo: LedgerMemo | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"begin": self.begin, "memo": None if self.memo is None else self.memo.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LedgerSources:
        memo = data.get("memo")
        return cls(int(data.get("begin", 0)), None if memo is None else LedgerMemo.from_dict(memo))


register_memo("ledger", LedgerSources)


def ledger_memo(holder: Any) -> LedgerSources | None:
    """The ledger's memo in ``holder`` (a build state or a draft), if any."""
    return memo_of(holder, "ledger", LedgerSources)


def carried_ledger(holder: Any) -> LedgerMemo | None:
    """The ledger and block the ledger's memo in ``holder`` (a build state or a draft)
    carries, if any."""
    sources = ledger_memo(holder)
    return sources.memo if sources is not None else None


def ledger_begin(holder: Any) -> int:
    """Where the ledger's sources begin in ``holder`` (a build state or a draft): a
    position of the history it was built from (0: no ledger memo)."""
    memo = ledger_memo(holder)
    return memo.begin if memo is not None else 0


@dataclass(frozen=True)
class CarriedLedger(EntityLedger):
    """The values of a ledger block an earlier build rendered (read back from its
    ``text``, :mod:`ctxwarden.pipeline.carried`): a build that adds nothing to them shows
    ``text`` itself when it fits, not a new rendering of values whose ranks the text no
    longer says, so a built context built again is the same context."""

    text: str = ""


def seed_tag(earlier: EntityLedger | None) -> str:
    """What tells ledgers grown from different ``earlier`` seeds apart."""
    return "" if earlier is None else f"{earlier.seq}:{len(earlier)}"


_MEMO: BoundedCache[str, EntityLedger] = BoundedCache("ledger.of_sources", 32)
# (32 ledgers of up to MAX_ENTRIES entries each)
_MEMO_MIN = 32  # fewer source messages cost less than the digest is worth keeping


def ledger_of(sources: Sequence[Message]) -> EntityLedger:
    """The ledger of ``sources`` (in order) grown from an empty one, in one ``add``.

    Memoised by the ids and fingerprints of the messages (what their entities depend
    on); what is returned is a :meth:`~EntityLedger.branch` of the kept ledger, so no
    two callers (threads) ever grow the same index."""
    if len(sources) < _MEMO_MIN:
        return EntityLedger().add([e for m in sources for e in extract_entities(m)])
    h = hashlib.sha1(usedforsecurity=False)
    for m in sources:
        h.update(f"{m.id}\x00{m.fingerprint}\x00".encode("utf-8", "surrogatepass"))
    key = h.hexdigest()
    found = _MEMO.get_or_make(
        key, lambda: EntityLedger().add([e for m in sources for e in extract_entities(m)])
    )
    return found.branch()


class LedgerBuilder:
    """Renders the ledger block for one build within ``cap`` tokens, extending the
    previous build's :class:`LedgerMemo`; :attr:`memo` is the one to carry forward.

    ``shown``: blocks every build sends besides the window (the system prompt, the
    summary and facts layers); with the pinned messages, the block leaves out the values
    they show. A value the context shows needs no second mention, and those blocks
    change less often than the ledger, so leaving their values out never makes the
    ledger change more often than it does (the cached prefix holds)."""

    def __init__(
        self,
        counter: TokenCounter,
        cap: int,
        earlier: EntityLedger | None = None,
        memo: LedgerMemo | None = None,
        shown: Sequence[Message] = (),
    ):
        self.counter = counter
        self.cap = cap
        self.earlier = earlier
        self.memo = memo
        self.shown = tuple(shown)
        self.turn: TurnDrops | None = None  # (see turn_drops)
        self.request: int | None = None  # a pinned request, not left out of the block

    def _dropped(
        self, history: Sequence[Message], first: int, start: int, pinned: frozenset[int]
    ) -> EntityLedger:
        """The ledger of ``history[first:start]`` less ``pinned``, on top of ``earlier``."""
        seed = seed_tag(self.earlier)
        memo = self.memo
        if memo is not None and memo.seed == seed and memo.first == first and memo.upto <= start:
            if memo.upto == start:
                return memo.ledger
            base, base_start = memo.ledger, memo.upto
        elif self.earlier is None:  # a cold build: the whole range, memoised
            self.memo = None
            return ledger_of([history[i] for i in range(first, start) if i not in pinned])
        else:
            base, base_start = self.earlier, first
            self.memo = None
        found = [
            e
            for i in range(base_start, start)
            if i not in pinned
            for e in extract_entities(history[i])
        ]
        # one add for the whole range: each add copies the ledger (and adding nothing
        # gives the same ledger back, after a copy)
        return base.add(found) if found else base

    def render(
        self,
        history: Sequence[Message],
        first: int,
        start: int,
        pinned: Sequence[int],
        edited: Sequence[Message],
    ) -> Message | None:
        """The ledger message for a window starting at ``start`` whose sources begin at
        ``first`` (None when empty)."""
        if self.cap <= 0:
            return None
        ledger = self._dropped(history, first, start, frozenset(pinned))
        key = _render_key(history, start, pinned, edited, self.cap, self.counter.model, self.shown)
        memo = self.memo
        carried = ledger.text if isinstance(ledger, CarriedLedger) and not edited else ""
        if memo is not None and memo.key == key and memo.ledger is ledger:
            text = memo.text
        elif carried and self.counter.count_text(carried) + _FRAMING <= self.cap:
            text = carried  # nothing added to a carried block: the block as it was
        else:
            above = [*self.shown, *self.pins_shown(history, pinned)]
            text = self._text(ledger, self.cap - _FRAMING, edited, above)
        self.memo = LedgerMemo(first, start, seed_tag(self.earlier), ledger, key, text)
        return system_block(text, LEDGER_ID) if text else None

    def extend(
        self, history: Sequence[Message], first: int, start: int, pinned: Sequence[int]
    ) -> None:
        """The ledger for a window starting at ``start``, as :meth:`render` extends it,
        without a block: a build that sends the blocks held since the last compaction
        (:func:`held_ledger`) sends none it renders (its memo mostly served that render:
        skipping it saves ~0.5% of a coding agent's build). The next :meth:`render`
        renders anew."""
        if self.cap <= 0:
            return
        ledger = self._dropped(history, first, start, frozenset(pinned))
        memo = self.memo
        if memo is None or memo.ledger is not ledger:
            self.memo = LedgerMemo(first, start, seed_tag(self.earlier), ledger)

    def pins_shown(self, history: Sequence[Message], pinned: Sequence[int]) -> list[Message]:
        """The pinned messages whose values the block leaves out: all but a request the
        window passed (:attr:`request`), whose values it did not leave out while the
        window started at it."""
        return [history[i] for i in pinned if i != self.request]

    def beyond(
        self, base: Message, edited: Sequence[Message], pinned: Sequence[Message]
    ) -> str | None:
        """The values of the last :meth:`render` that ``base`` (a block sent before) does
        not show, rendered within the cap (``None``: none)."""
        memo = self.memo
        if memo is None:
            return None
        return self._text(memo.ledger, self.cap - _FRAMING, edited, [*self.shown, *pinned, base])

    def shows_beyond(
        self, base: Message, edited: Sequence[Message], pinned: Sequence[Message]
    ) -> bool:
        """Whether :meth:`beyond` gives a block (not ``None``), without rendering it."""
        memo = self.memo
        if memo is None or self.cap - _FRAMING <= 0:
            return False
        above = [*self.shown, *pinned, base]
        ledger, placed, skip = self._prepared(memo.ledger, edited, above)
        return ledger.shows_any(self.cap - _FRAMING, self.counter.count_lines, placed, skip)

    def shrink(
        self,
        history: Sequence[Message],
        edited: Sequence[Message],
        max_tokens: int,
        pinned: Sequence[Message] = (),
    ) -> Message | None:
        """The same ledger rendered within ``max_tokens`` (priority eviction)."""
        memo = self.memo
        if memo is None:
            return None
        text = self._text(memo.ledger, max_tokens - _FRAMING, edited, [*self.shown, *pinned])
        return system_block(text, LEDGER_ID) if text else None

    def _text(
        self,
        ledger: EntityLedger,
        max_tokens: int,
        edited: Sequence[Message],
        above: Sequence[Message],
    ) -> str | None:
        """The block's text: ``ledger`` with the values of the ``edited`` messages, less
        the values ``above`` shows; values from a message that left the context carry
        its handle where room allows (an edited message shows its own handle)."""
        if max_tokens <= 0:
            return None
        ledger, placed, skip = self._prepared(ledger, edited, above)
        return ledger.render(max_tokens, self.counter.count_lines, placed, skip) or None

    def _prepared(
        self, ledger: EntityLedger, edited: Sequence[Message], above: Sequence[Message]
    ) -> tuple[EntityLedger, frozenset[str], Shown | None]:
        """What :meth:`_text` renders: ``ledger`` with the values of the ``edited``
        messages, the ids of the messages that show their own handle, and what the
        context shows elsewhere."""
        if edited:
            parts = tuple([(m.id, m.fingerprint) for m in edited])
            ledger = ledger.grown(
                parts, lambda done: [e for m in edited[done:] for e in extract_entities(m)]
            )
        placed = frozenset(m.id for m in edited)
        if self.turn is not None:
            placed |= self.turn.ids()
        return ledger, placed, Shown(above) if above else None


def _render_key(
    history: Sequence[Message],
    start: int,
    pinned: Sequence[int],
    edited: Sequence[Message],
    cap: int,
    model: str,
    shown: Sequence[Message] = (),
) -> str:
    """What a rendered block depends on, besides the ledger: a short digest."""
    # (each part joined, then hashed: the same bytes as one message at a time)
    h = hashlib.sha1("".join([f"{m.fingerprint}|" for m in shown]).encode(), usedforsecurity=False)
    h.update(f"{start}|{cap}|{model}|{','.join(map(str, pinned))}|".encode())
    if start > 0:
        h.update(history[start - 1].fingerprint.encode())
    h.update("".join([f"|{m.id}:{m.fingerprint}" for m in edited]).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


_WORD = re.compile(r"\w+")


class Shown:
    """Whether a value shows as a whole token in some messages (content, and the names
    and arguments of their tool calls): a set lookup for a one-word value, a substring
    test for the rest, asked only for the values a render visits. Equal (and hashed) by
    the messages' fingerprints, so a ledger's render memo can key on it."""

    def __init__(self, messages: Sequence[Message]) -> None:
        self.key = tuple(m.fingerprint for m in messages)
        self.text, self.tokens, self._searched = _words(self.key, messages)

    def __call__(self, value: str) -> bool:
        found = self._searched.get(value)  # (the same blocks are asked for the same
        if found is None:  # values at every render: the answer is kept with the text)
            found = self._searched[value] = self._search(value)
        return found

    def _search(self, value: str) -> bool:
        if value in self.tokens:
            return True
        if value.replace("_", "a").isalnum():
            return False
        return shows_whole(value, self.text)

    def __bool__(self) -> bool:
        return bool(self.key)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shown) and other.key == self.key


def shown_values(ledger: EntityLedger, messages: Sequence[Message]) -> frozenset[str]:
    """The ledger's values that ``messages`` show as whole tokens."""
    shown = Shown(messages)
    return frozenset(e.value for e in ledger.entries if shown(e.value))


_Words = tuple[str, frozenset[str], dict[str, bool]]
_WORDS: BoundedCache[tuple[str, ...], _Words] = BoundedCache("ledger.words", 64)


def _words(key: tuple[str, ...], messages: Sequence[Message]) -> _Words:
    """The text of ``messages``, its word tokens and the answers given so far (whether
    a value shows in it), memoised by their fingerprints (the system prompt, the
    facts and a ledger block kept in place recur at every build; bounded, locked)."""
    found = _WORDS.get(key)
    if found is None:
        text = "\n".join(
            [m.text for m in messages]
            + [f"{c.name} {c.arguments}" for m in messages for c in m.tool_calls]
        )
        found = _WORDS.put(key, (text, frozenset(_WORD.findall(text)), {}))
    return found


def shows_whole(value: str, text: str) -> bool:
    """Whether ``value`` occurs in ``text`` with no word character (``\\w``: a letter, a
    digit, ``_``) just before or after it: ``(?<!\\w)value(?!\\w)``, found by ``str.find``
    (a pattern that opens with a look-behind has no literal prefix to search for: the
    regex tried every position of a long system prompt)."""
    end, at = len(value), text.find(value)
    while at >= 0:
        before = text[at - 1] if at else ""
        after = text[at + end : at + end + 1]
        if not _is_word(before) and not _is_word(after):
            return True
        at = text.find(value, at + 1)
    return False


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


#: Characters a budget token stands for in ``ledger.lookback_budgets`` (English text
#: and JSON run about four a token).
LOOKBACK_CHARS_PER_TOKEN = 4
#: Characters a cold look-back always may read (unless ``lookback_budgets`` is 0): their
#: values cost about 3 ms to extract, no more than the rest of a cold build, so a bound
#: below it would lose values to save nothing a caller notices.
MIN_LOOKBACK = 24_000


def ledger_from(draft: Draft, ctx: StepContext) -> int:
    """Where the ledger's sources begin: kept from the previous build, or on a cold
    build at most ``policy.ledger.lookback`` messages before the window, and no
    further back than ``ledger.lookback_budgets`` budgets of their text reach (not on
    a slice given the ledger of the messages before it: the slice is what the caller
    read, and values between its start and a bound would be in neither)."""
    cfg = ctx.policy.ledger
    if ctx.previous.history_length:
        return max(draft.sys_end, min(ledger_begin(ctx.previous), draft.start))
    first = draft.sys_end
    if cfg.lookback is not None:
        first = max(first, draft.start - cfg.lookback)
    if cfg.lookback_budgets is None or ctx.earlier is not None:
        return first  # a session's slice, whose earlier ledger holds what came before
    chars = int(cfg.lookback_budgets * ctx.budget * LOOKBACK_CHARS_PER_TOKEN)
    if cfg.lookback_budgets > 0:
        chars = max(chars, MIN_LOOKBACK)
    return _within_chars(draft.history, first, draft.start, chars)


def _within_chars(history: Sequence[Message], first: int, start: int, chars: int) -> int:
    """The earliest position from which ``history[pos:start]`` holds at most ``chars``
    characters of text and tool-call arguments, read newest first (never before
    ``first``); the message that crosses the bound is read whole."""
    used, pos = 0, start
    while pos > first and used < chars:
        pos -= 1
        m = history[pos]
        used += len(m.text) + sum(len(c.arguments) for c in m.tool_calls)
    return pos


def ledger_cap(draft: Draft, ctx: StepContext, *, grows: bool = True) -> int:
    """The ledger's token cap: ``ledger.max_tokens``, or ``ledger.free_share`` of what the
    system prompt and layers leave when that is more (``grows``), never over
    ``ledger.max_share`` of it. A larger budget holds more of the values that left the
    window (a coding agent's paths and names); a summary that fills the budget (see
    :func:`~ctxwarden.steps.layers.fill_room`, which reserves the cap without growth)
    leaves it ``max_tokens``."""
    cfg = ctx.policy.ledger
    if not cfg.enabled:
        return 0
    layers = ctx.total([m for _, m in draft.layers])
    free = ctx.budget - ctx.fixed - layers
    cap = max(cfg.max_tokens, int(free * cfg.free_share)) if grows else cfg.max_tokens
    return max(min(cap, int(free * cfg.max_share)), 0)


# -- the ledger's side of the window's fit ------------------------------------------------------


@dataclass(frozen=True)
class EntityLedgerBlocks:
    """The entity-ledger block(s) of a build
    (:class:`~ctxwarden.steps.base.LedgerBlocks`): what :class:`~ctxwarden.steps.fit.FitStep`
    settles with the window, and the other steps foresee through ``ctx.ledger``. It
    reads the policy's ``[ledger]`` table; no other step does."""

    def cap(self, draft: Draft, ctx: StepContext, grows: bool = True) -> int:
        """:func:`ledger_cap`."""
        return ledger_cap(draft, ctx, grows=grows)

    def settle(self, draft: Draft, ctx: StepContext) -> LedgerSettling:
        """The build's ledger, extending the previous build's memo, before the fit."""
        memo = carried_ledger(ctx.previous) if ctx.previous.history_length else None
        first = ledger_from(draft, ctx)
        builder = LedgerBuilder(
            ctx.counter, ledger_cap(draft, ctx), ctx.earlier, memo, shown_blocks(draft)
        )
        return _Settling(ctx, first, builder)

    def regrowth(self, draft: Draft, ctx: StepContext, shown: int) -> int:
        """What a ledger refilled to its low-water mark (:func:`ledger_low_water`) grows
        back into: up to its cap (0 for a ledger filled to its cap when rendered anew)."""
        cap = ledger_cap(draft, ctx)
        return max(cap - shown, 0) if ledger_low_water(cap, ctx) is not None else 0

    def compaction_span(self, draft: Draft, ctx: StepContext) -> tuple[int, int] | None:
        """What the blocks a compaction sends and the room they grow back into
        (:meth:`regrowth`) take together, known before they are settled: for a ledger with
        a low-water mark exactly its cap (``(cap, cap)``), else from nothing to the cap
        (``(0, cap)``). Both need the blocks within the cap: counted exactly (a block's
        framing is then 4 tokens, within the ``_FRAMING`` every rendering leaves it), the
        block sent before within the cap (a compaction may send it again as it was). The
        fit settles no blocks for a window that must move wherever in the span they
        fall, and to the same window (it settles them for the window it moves to).
        That needs the ledger carried from the previous build to extend to the window
        it leaves (as settling for that window first would extend it, then again).
        ``None``: the blocks' size is not bounded so, or the ledger does not extend."""
        cap = ledger_cap(draft, ctx)
        if not ctx.counter.exact:
            return None
        previous = ctx.previous
        memo = carried_ledger(previous) if previous.history_length else None
        if (
            memo is None
            or memo.first != ledger_from(draft, ctx)
            or memo.seed != seed_tag(ctx.earlier)
            or memo.upto > draft.start
        ):
            return None
        kept = previous.ledger_base_sent or previous.ledger_sent
        if kept and ctx.count(system_block(kept, LEDGER_ID)) > cap:
            return None
        return (cap, cap) if ledger_low_water(cap, ctx) is not None else (0, cap)

    def within(self, draft: Draft, ctx: StepContext, cap: int, max_tokens: int) -> Message | None:
        """The draft's ledger rendered again within ``max_tokens``, with the values of the
        window's edited messages (a cut newest result among them), leaving out what the
        shown blocks, the pinned messages and the window hold. A block rendered here fits
        this build's newest turn, so it changes with it anyway: leaving out what the
        window shows (the arguments of the newest call) costs no cached prefix, and under
        this pressure every token of the block is worth a value the context does not
        show."""
        memo = carried_ledger(draft)
        builder = LedgerBuilder(ctx.counter, cap, ctx.earlier, memo, shown_blocks(draft))
        builder.turn = turn_drops(draft)
        return builder.shrink(
            draft.history,
            ledger_sources(draft, draft.window),
            max_tokens,
            [*(draft.history[i] for i in draft.pinned), *draft.window],  # (values, as render)
        )


class _Settling:
    """One build's ledger while the fit tries windows
    (:class:`~ctxwarden.steps.base.LedgerSettling`)."""

    def __init__(self, ctx: StepContext, first: int, builder: LedgerBuilder) -> None:
        self.ctx, self.first, self.builder = ctx, first, builder

    def blocks(
        self, draft: Draft, window: Sequence[Message]
    ) -> tuple[Message | None, Message | None]:
        """The blocks sent with ``window``: between compactions the ones sent before
        (:func:`held_ledger`), after a compaction the block sent before and the values
        it does not show (:func:`stacked_ledger`), else the block rendered now."""
        h, start, pinned, ctx = draft.history, draft.start, draft.pinned, self.ctx
        if ctx.forecast:  # a compaction foreseen: the blocks as sent, nothing extended
            return sent_ledger(ctx)
        held = held_ledger(start if draft.reopened is None else draft.reopened, ctx)
        if held is not None:  # no block to render: extend the ledger for the next build
            self.builder.extend(h, self.first, start, pinned)
            return held
        edited = ledger_sources(draft, window)
        self.builder.turn, self.builder.request = turn_drops(draft), draft.newest
        ledger = self.builder.render(h, self.first, start, pinned, edited)
        shown = self.builder.pins_shown(h, pinned)
        return stacked_ledger(ledger, self.builder, ctx, edited, shown)

    def carried(self, draft: Draft) -> Draft:
        return draft.with_memo("ledger", LedgerSources(self.first, self.builder.memo))


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


class TurnDrops:
    """The messages between the newest user message and the window, when the window's
    start passed that request (pinned then: :func:`~ctxwarden.steps.fit._new_start`).
    Their values are listed as those of the window's own dropped messages are (no
    handle after them, no plain numbers): the same block as while the window started at
    the request and they were dropped inside it. Their ids are read only when a block is
    rendered anew (a coding agent's turn is the whole run: thousands of messages)."""

    def __init__(self, history: Sequence[Message], lo: int, hi: int) -> None:
        self.history, self.lo, self.hi = history, lo, hi
        self._ids: frozenset[str] | None = None

    def ids(self) -> frozenset[str]:
        if self._ids is None:
            self._ids = frozenset(map(_ID, self.history[self.lo : self.hi]))
        return self._ids


_ID = attrgetter("id")


def turn_drops(draft: Draft) -> TurnDrops | None:
    """:class:`TurnDrops` of ``draft`` (``None``: its window starts at or before the
    newest user message)."""
    at = draft.newest
    if at is None or at + 1 >= draft.start:
        return None
    return TurnDrops(draft.history, at + 1, draft.start)


def shown_blocks(draft: Draft) -> list[Message]:
    """The blocks sent with the ledger whose values it need not repeat: the system
    prompt and the facts layer (the pinned messages are added by the ledger's builder).
    Not the summary or recall layers: with a summariser that focuses, their text follows
    the newest user message, and a ledger that left out what they show would change
    with every question (and lose what the next view no longer shows)."""
    return [*draft.system, *(m for name, m in draft.layers if name == "facts")]


def held_ledger(start: int, ctx: StepContext) -> tuple[Message | None, Message | None] | None:
    """Between compactions (``ctx.hold``, :mod:`ctxwarden.pipeline.compaction`) the ledger
    blocks are the ones the previous context sent (kept in its state, so a replica holds
    the same), while the window has not moved: a new result cut on arrival adds its values
    at the next compaction, not by rewriting the ledger (and everything after it) now.
    ``None``: send the one just rendered."""
    previous = ctx.previous
    if not ctx.hold or previous.window_start != start or not previous.ledger_sent:
        return None
    return sent_ledger(ctx)


def sent_ledger(ctx: StepContext) -> tuple[Message | None, Message | None]:
    """The ledger blocks the previous context sent (``(kept, more)`` or ``(None, block)``;
    ``(None, None)``: none)."""
    previous = ctx.previous
    if not previous.ledger_sent:
        return None, None
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
    size = ctx.count(base)
    heading = builder.memo.ledger.header if builder.memo is not None else DEFAULT_HEADER
    if size + ctx.count(system_block(heading, LEDGER_MORE_ID)) > builder.cap:
        # no block of values fits beside it (a block is its heading and more): rendered
        # anew if there is a value it does not show, found without rendering them
        if not builder.shows_beyond(base, edited, pinned):
            return None, base
        return None, _refilled(rendered, builder, ctx, edited, pinned)
    text = builder.beyond(base, edited, pinned)
    if text is None:  # it shows every value still to show
        return None, base
    more = system_block(text, LEDGER_MORE_ID)
    extra = ctx.count(more)
    if size + extra > builder.cap or extra > size:
        return None, _refilled(rendered, builder, ctx, edited, pinned)
    return base, more


LEDGER_REFILL = 0.6
"""The share of its cap a ledger a compaction renders anew fills, when that is at least
``ledger.max_tokens`` (:func:`ledger_low_water`)."""


def ledger_low_water(cap: int, ctx: StepContext) -> int | None:
    """The tokens a ledger of ``cap`` rendered anew at a compaction fills: its low-water
    mark, :data:`LEDGER_REFILL` of the cap, when that is at least ``ledger.max_tokens``
    (the cap grew with the budget); ``None``: the cap (a ledger near its floor holds
    values a tight budget needs).

    A ledger rendered anew at its cap is full: at the next compaction any new value
    sends it over the cap and it is rendered anew again, written again whole with the
    window after it. Rendered to its low-water mark, the next compactions stack their
    new values after it (:func:`stacked_ledger`) until it fills up, as the window
    refills; and the window's own low-water mark leaves it the room it grows back into
    (:meth:`EntityLedgerBlocks.regrowth`), so the context a compaction leaves is no
    larger than with a full ledger. Issue 37 (swebench-mini dev, agent-loop replay at
    Anthropic's cache prices, the cost against the full history with caching): at
    8,000 tokens (cap ~1,970) 72.3% became 68.9%, retention .9861 to .9846 (a low-water
    mark of 0.5: 68.4% at .9833; 0.6 without the window's share: 71.4% at .9861); at
    4,000 (cap ~970) a ledger refilled to 60% lost retention, .9588 to .9549, so a cap
    below ``max_tokens / LEDGER_REFILL`` is filled."""
    low = int(cap * LEDGER_REFILL)
    return low if low >= ctx.policy.ledger.max_tokens else None


def _refilled(
    rendered: Message,
    builder: LedgerBuilder,
    ctx: StepContext,
    edited: Sequence[Message],
    pinned: Sequence[Message],
) -> Message:
    """A ledger a compaction renders anew, down to its low-water mark
    (:func:`ledger_low_water`; else ``rendered``, the ledger at its cap)."""
    low = ledger_low_water(builder.cap, ctx)
    if low is None or ctx.count(rendered) <= low:
        return rendered
    again = builder.shrink((), edited, low, pinned)
    return again if again is not None else rendered
