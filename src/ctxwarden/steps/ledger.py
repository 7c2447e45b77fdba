"""The ledger layer of a build: values from messages the context no longer shows.

Everything before the window start (that is not pinned), and the original text of
every masked or truncated result, feeds :class:`~ctxwarden.memory.entity_ledger.EntityLedger`; its
rendering becomes one system block near the top of the context.

The region before the window only grows (the window start is sticky), so the ledger of
a conversation is extended, never rebuilt: a small module-level memo keyed by the
conversation's first message and the window start makes each build cost the messages
that left since the last one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ctxwarden.memory.entities import extract_entities
from ctxwarden.memory.entity_ledger import EntityLedger
from ctxwarden.messages import Message
from ctxwarden.tokens.counter import TokenCounter

__all__ = ["LEDGER_ID", "LedgerBuilder"]

LEDGER_ID = "ctxwarden:ledger"
_FRAMING = 5  # message framing + role tokens around the ledger text
_MEMO: OrderedDict[tuple[str, int], tuple[str, EntityLedger]] = OrderedDict()
_BY_CONVERSATION: dict[str, int] = {}
_MEMO_MAX = 256
# The rendered block per (conversation, window start, pinned, edited originals, cap): in
# an agent loop most builds change none of these, so they skip re-rendering the ledger.
_RenderKey = tuple[str, int, str, tuple[int, ...], tuple[tuple[str, str], ...], int, str]
_RENDERED: OrderedDict[_RenderKey, tuple[EntityLedger, Message | None]] = OrderedDict()


def _memo_get(history: Sequence[Message], anchor: str, start: int) -> EntityLedger | None:
    """A memoised ledger for this conversation up to ``start``, if its history matches."""
    hit = _MEMO.get((anchor, start))
    if hit is None or hit[0] != history[start - 1].fingerprint:
        return None
    _MEMO.move_to_end((anchor, start))
    return hit[1]


def _seed_tag(earlier: EntityLedger | None) -> str:
    """What tells ledgers grown from different ``earlier`` seeds apart in the memos."""
    return "" if earlier is None else f"|{earlier.seq}:{len(earlier)}"


def _dropped_ledger(
    history: Sequence[Message],
    sys_end: int,
    start: int,
    pinned: frozenset[int],
    earlier: EntityLedger | None = None,
) -> EntityLedger:
    """The ledger of ``history[sys_end:start]`` minus pinned messages, on top of
    ``earlier`` (values of messages older than ``history``), extended from a memo."""
    seed = earlier if earlier is not None else EntityLedger()
    if start <= sys_end:
        return seed
    anchor = history[sys_end].fingerprint + _seed_tag(earlier)
    hit = _memo_get(history, anchor, start)
    if hit is not None:
        return hit
    base_start = _BY_CONVERSATION.get(anchor, sys_end)
    base = _memo_get(history, anchor, base_start) if sys_end < base_start < start else None
    if base is None:
        base, base_start = seed, sys_end
    ledger = base
    found = [
        e for i in range(base_start, start) if i not in pinned for e in extract_entities(history[i])
    ]
    ledger = ledger.add(found)  # one add for the whole range: each add copies the ledger
    _MEMO[(anchor, start)] = (history[start - 1].fingerprint, ledger)
    _BY_CONVERSATION[anchor] = start
    if len(_MEMO) > _MEMO_MAX:
        _MEMO.popitem(last=False)
    return ledger


# The dropped-only ledger plus the edited originals, per dropped-only ledger: a batch of
# newly masked results extends the last branch instead of re-adding every masked one.
_BRANCHES: OrderedDict[int, tuple[EntityLedger, tuple[tuple[str, str], ...], EntityLedger]] = (
    OrderedDict()
)


def _with_edited(
    base: EntityLedger, edited: Sequence[Message], ids: tuple[tuple[str, str], ...]
) -> EntityLedger:
    """``base`` with the values of ``edited`` (identified by ``ids``: id and fingerprint)
    added, as a side branch (the memo keeps growing the dropped-only ledger), extended
    from the last branch when ``edited`` only grew at its end."""
    hit = _BRANCHES.get(id(base))
    if hit is not None and hit[0] is base and ids[: len(hit[1])] == hit[1]:
        new = edited[len(hit[1]) :]
        # the last branch is replaced below, so it may share its index with this one
        branch = hit[2].add([e for m in new for e in extract_entities(m)])
    else:
        branch = base.branch().add([e for m in edited for e in extract_entities(m)])
    _BRANCHES[id(base)] = (base, ids, branch)
    _BRANCHES.move_to_end(id(base))
    if len(_BRANCHES) > _MEMO_MAX:
        _BRANCHES.popitem(last=False)
    return branch


class LedgerBuilder:
    """Renders the ledger block for one build, within ``cap`` tokens."""

    def __init__(self, counter: TokenCounter, cap: int, earlier: EntityLedger | None = None):
        self.counter = counter
        self.cap = cap
        self.earlier = earlier
        self.ledger = EntityLedger()

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
        key: _RenderKey | None = None
        edited_ids = tuple((m.id, m.fingerprint) for m in edited)
        if start > first:
            key = (
                history[first].fingerprint + _seed_tag(self.earlier),
                start,
                history[start - 1].fingerprint,
                tuple(pinned),
                edited_ids,
                self.cap,
                self.counter.model,
            )
            hit = _RENDERED.get(key)
            if hit is not None:
                _RENDERED.move_to_end(key)
                self.ledger = hit[0]
                return hit[1]
        ledger = _dropped_ledger(history, first, start, frozenset(pinned), self.earlier)
        if edited:
            ledger = _with_edited(ledger, edited, edited_ids)
        self.ledger = ledger
        message = self._message(self.cap - _FRAMING)
        if key is not None:
            _RENDERED[key] = (ledger, message)
            if len(_RENDERED) > _MEMO_MAX:
                _RENDERED.popitem(last=False)
        return message

    def shrink(self, current: Message, max_tokens: int) -> Message | None:
        """The same ledger rendered within ``max_tokens`` (priority eviction)."""
        return self._message(max_tokens - _FRAMING)

    def _message(self, max_tokens: int) -> Message | None:
        if max_tokens <= 0:
            return None
        text = self.ledger.render(max_tokens, self.counter.count_text)
        return Message.system(text, id=LEDGER_ID) if text else None
