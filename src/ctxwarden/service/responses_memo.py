"""The Responses route's conversion of a client's input items, reused from its last call
(speed only).

An agent sends its whole history as ``input`` on every call: the last call's items, then
a few new ones. Converting 200 items to messages (and keying each for the history's
chain) took ~25 ms a call here, five times the proxy's whole budget. :class:`ItemsMemo`
keeps, per scope (tenant and session header), the last call's items and the messages
made of them with their keys; a call whose items begin with the same items (compared by
value: the parsed dicts are new each call) reuses the messages of that common front,
all but the last (new items may continue its turn), and converts from there
(:func:`~ctxwarden.formats.responses.convert_items` gives the same messages converting
from any message's first item). Bounded in scopes and in the bytes of the bodies they
came from; without it every call converts everything, with the same result. The
``instructions`` a call sends (the same text call after call) are kept the same way, as
their system message and its key (:meth:`ItemsMemo.instructions`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import compress, count
from operator import is_not
from typing import Any

from ctxwarden.core.messages import Message
from ctxwarden.formats.responses import convert_items, instructions_message
from ctxwarden.service.history import message_key

__all__ = ["ItemsMemo"]


@dataclass(frozen=True, slots=True)
class _Span:
    first: int
    end: int
    message: Message
    key: bytes


@dataclass(frozen=True, slots=True)
class _Last:
    items: Sequence[Any]
    spans: tuple[_Span, ...]
    size: int


class ItemsMemo:
    """Per scope, the last input's messages and keys (see the module docstring)."""

    def __init__(self, scopes: int = 256, max_bytes: int = 64 * 1024 * 1024) -> None:
        self._last: OrderedDict[Hashable, _Last] = OrderedDict()
        self._scopes, self._max_bytes, self._bytes = scopes, max_bytes, 0
        self._heads: OrderedDict[Hashable, tuple[str, Message, bytes]] = OrderedDict()

    def instructions(self, scope: Hashable, text: Any) -> tuple[Message, bytes]:
        """:func:`~ctxwarden.formats.responses.instructions_message` of ``text`` and its
        key, the last call's when ``text`` is the same (a text longer than the scopes'
        share of the bytes is not kept)."""
        kept = self._heads.get(scope)
        if kept is not None and kept[0] == text:
            self._heads.move_to_end(scope)
            return kept[1], kept[2]
        message = instructions_message(text)  # (not a string: the error it raises)
        key = message_key(message)
        if len(text) <= self._max_bytes // self._scopes:
            self._heads[scope] = (text, message, key)
            self._heads.move_to_end(scope)
            while len(self._heads) > self._scopes:
                self._heads.popitem(last=False)
        return message, key

    def convert(
        self, scope: Hashable, items: Sequence[Any], size: int
    ) -> tuple[list[Message], list[bytes]]:
        """The messages of ``items`` (a body of ``size`` bytes) and their keys."""
        last = self._last.pop(scope, None)
        kept: list[_Span] = []
        if last is not None:
            self._bytes -= last.size
            same = _common(last.items, items)
            kept = [s for s in last.spans if s.end <= same][:-1]
        start = kept[-1].end if kept else 0
        spans = kept + [
            _Span(first, end, m, message_key(m)) for first, end, m in convert_items(items, start)
        ]
        if size <= self._max_bytes:
            self._last[scope] = _Last(items, tuple(spans), size)
            self._bytes += size
            while len(self._last) > self._scopes or self._bytes > self._max_bytes:
                _, dropped = self._last.popitem(last=False)
                self._bytes -= dropped.size
        return [s.message for s in spans], [s.key for s in spans]


def _common(before: Sequence[Any], now: Sequence[Any]) -> int:
    """How many leading items ``before`` and ``now`` share (equal values)."""
    n = min(len(before), len(now))
    # the front the body memo gave back as the very objects, found in C; then by value
    first = next(compress(count(), map(is_not, before, now)), n)
    for i in range(first, n):
        if before[i] is not now[i] and before[i] != now[i]:
            return i
    return n
