"""A chat request's body, read without parsing again the history the client sent last
time (speed only).

An agent sends its whole history on every call, and from one call to the next the body is
the previous one with a few messages added at the end of ``messages``. JSON is read left
to right, so a body whose text begins with the last body's text up to the end of its last
message holds, up to there, the same values. :class:`BodyMemo` keeps that front per scope
(the routes use route, tenant and session header) with the values read from it — the
pairs before ``messages`` and the messages themselves, the very objects — and what the
route made of them (their keys; for Anthropic, the converted messages too); a body that
begins with it reuses them and only the rest is read. The front is compared as bytes,
against the last body itself (no copy), and only the rest is decoded: the ~330 KB a
client resends each call is neither decoded nor copied again. Everything is read with the
stdlib's C scanner, value by value (:meth:`json.JSONDecoder.raw_decode`), so the result
is exactly what ``json.loads`` gives, duplicate keys and key order included. It also tells
whether the text holds ``NaN`` or ``Infinity``, looking only at text it had not seen.

A body it cannot walk (not UTF-8, not an object, no non-empty ``messages`` list of objects,
``messages`` twice, any JSON error) is left to the ordinary parse
(:func:`~ctxwarden.service.body.parse_json`), which gives the errors. The memo is bounded in
bytes and sessions, and its absence changes nothing but speed. Reusing the objects relies
on the proxy never changing a parsed message or value, which the proxy's tests check.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["BodyMemo", "Reading"]

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_PER_SCOPE = 4  # clients sharing a scope (no session header): each keeps its own front
#: a front's estimated memory per byte of its text: the body, and the values read from it
#: (strings as long, plus dicts and lists)
_COST_PER_BYTE = 3


class _Unwalkable(Exception):
    """The body is not one the memo reads; the ordinary parse decides what it is."""


@dataclass(frozen=True, slots=True)
class _Front:
    """A body through the end of its last message, and what was read from it."""

    raw: bytes  # the whole body it was read from (kept, not copied)
    size: int  # the bytes of ``raw`` through the end of its last message: the front
    head: tuple[tuple[str, Any], ...]  # the pairs before "messages", in order
    messages: tuple[dict[str, Any], ...]
    made: object  # what the route made of the messages (keep()), or None
    nonfinite: bool  # the text holds NaN or Infinity (as a value, or inside a string)


@dataclass(frozen=True, slots=True)
class Reading:
    """A body as :func:`json.loads` reads it (``data``); its first ``reused`` messages are
    the objects read on an earlier call, of which the route made ``made`` (what it gave
    :meth:`BodyMemo.keep`; ``None`` when nothing was kept)."""

    data: dict[str, Any]
    reused: int
    made: object
    scope: Hashable
    front: _Front
    replaces: _Front | None
    nonfinite: bool  # the body's text holds NaN or Infinity (as a value or in a string)


def _skip(s: str, i: int) -> int:
    found = _WS.match(s, i)
    assert found is not None  # the pattern matches the empty string
    return found.end()


def _value(s: str, i: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(s, i)
    except (ValueError, RecursionError) as exc:
        raise _Unwalkable from exc


def _messages(s: str, i: int, into: list[dict[str, Any]]) -> tuple[int, int]:
    """Read objects from ``i`` (a value's first character) up to the closing ``]``:
    ``(index after it, index after the last object)``."""
    while True:
        message, end = _value(s, i)
        if type(message) is not dict:  # a number's end would be ambiguous; the route refuses it
            raise _Unwalkable
        into.append(message)
        i = _skip(s, end)
        mark = s[i : i + 1]
        if mark == "]":
            return i + 1, end
        if mark != ",":
            raise _Unwalkable
        i = _skip(s, i + 1)


def _pairs(s: str, i: int, into: list[tuple[str, Any]], field: str = "messages") -> None:
    """Read the object's remaining pairs from ``i`` (after a value: ``,`` or ``}`` next)
    to its end, which must end the text."""
    while True:
        i = _skip(s, i)
        mark = s[i : i + 1]
        if mark == "}":
            if _skip(s, i + 1) != len(s):
                raise _Unwalkable
            return
        if mark != ",":
            raise _Unwalkable
        key, i = _key(s, _skip(s, i + 1))
        if key == field:
            raise _Unwalkable
        value, i = _value(s, i)
        into.append((key, value))


def _key(s: str, i: int) -> tuple[str, int]:
    """A pair's key at ``i``, and the index of its value."""
    if s[i : i + 1] != '"':
        raise _Unwalkable
    key, i = _value(s, i)
    i = _skip(s, i)
    if s[i : i + 1] != ":":
        raise _Unwalkable
    return key, _skip(s, i + 1)


def _walk(
    s: str, field: str = "messages"
) -> tuple[list[tuple[str, Any]], list[dict[str, Any]], int, list[tuple[str, Any]]]:
    """The whole body: ``(pairs before messages, messages, end of the last, pairs after)``."""
    i = _skip(s, 0)
    if s[i : i + 1] != "{":
        raise _Unwalkable
    head: list[tuple[str, Any]] = []
    i = _skip(s, i + 1)
    while True:
        key, i = _key(s, i)
        if key == field:
            break
        value, i = _value(s, i)
        head.append((key, value))
        i = _skip(s, i)
        if s[i : i + 1] != ",":
            raise _Unwalkable  # "}" too: no messages
        i = _skip(s, i + 1)
    if s[i : i + 1] != "[":
        raise _Unwalkable
    messages: list[dict[str, Any]] = []
    i, last = _messages(s, _skip(s, i + 1), messages)
    tail: list[tuple[str, Any]] = []
    _pairs(s, i, tail, field)
    return head, messages, last, tail


def _after(
    s: str, field: str = "messages"
) -> tuple[list[dict[str, Any]], int, list[tuple[str, Any]]]:
    """The rest ``s`` of a body after a front: ``(new messages, end of the last message
    in ``s`` (0: none), pairs after)``."""
    last = 0
    i = _skip(s, last)
    new: list[dict[str, Any]] = []
    if s[i : i + 1] == ",":
        i, last = _messages(s, _skip(s, i + 1), new)
    elif s[i : i + 1] == "]":
        i += 1
    else:
        raise _Unwalkable
    tail: list[tuple[str, Any]] = []
    _pairs(s, i, tail, field)
    return new, last, tail


@dataclass(slots=True)
class _Scope:
    fronts: list[_Front]
    misses: int = 0  # bodies in a row that began with none of the fronts


class BodyMemo:
    """Per (tenant, session header): the last bodies' fronts (see the module docstring).

    Walking a whole body costs about three times what ``orjson`` takes to parse it, so a
    scope whose bodies keep missing (a client that trims or edits its history each call)
    is walked on its 1st, 2nd, 4th, 8th … miss in a row only, and parsed the ordinary way
    in between."""

    def __init__(self, scopes: int = 512, max_bytes: int = 128 * 1024 * 1024) -> None:
        self._scopes: OrderedDict[Hashable, _Scope] = OrderedDict()
        self._max_scopes, self._max_bytes, self._bytes = scopes, max_bytes, 0
        self._lock = threading.Lock()

    def read(self, scope: Hashable, raw: bytes, field: str = "messages") -> Reading | None:
        """``raw`` read as ``json.loads`` would, reusing what an earlier body of ``scope``
        shares with it; ``None`` for a body the memo does not walk (see the class).
        ``field`` names the list that grows (the Responses route's ``input``)."""
        with self._lock:
            kept = self._scopes.get(scope)
            fronts = list(kept.fronts) if kept is not None else []
        known = max((f for f in fronts if _begins(raw, f)), key=_length, default=None)
        if known is None:
            with self._lock:
                if kept is None:
                    kept = self._scopes.setdefault(scope, _Scope([]))
                    self._trim()
                kept.misses += 1
                if kept.misses & (kept.misses - 1):  # not a power of two: not this time
                    return None
        seen = known.size if known is not None else 0
        try:
            # the front ends with a message's "}": the rest starts on a character
            s = raw[seen:].decode("utf-8")  # (raw[0:] is raw itself: no copy)
            if known is not None:
                new, last, tail = _after(s, field)
                head, messages = list(known.head), [*known.messages, *new]
            else:
                head, messages, last, tail = _walk(s, field)
        except (_Unwalkable, UnicodeDecodeError, RecursionError):  # (the parse refuses depth)
            return None
        data = dict(head)  # json.loads's order: each key where first written, last value
        data[field] = messages
        for key, value in tail:
            data[key] = value
        early = known is not None and known.nonfinite
        in_front = early or _nonfinite(s, 0, last)
        size = seen + (last if s.isascii() else len(s[:last].encode("utf-8")))
        front = _Front(raw, size, tuple(head), tuple(messages), None, in_front)
        reused = len(known.messages) if known is not None else 0
        made = known.made if known is not None else None
        nonfinite = in_front or _nonfinite(s, last, len(s))
        return Reading(data, reused, made, scope, front, known, nonfinite)

    def keep(self, reading: Reading, made: object) -> None:
        """Remember ``reading``'s front, and what the route ``made`` of all its messages,
        for the scope's next body."""
        front = replace(reading.front, made=made)
        with self._lock:
            kept = self._scopes.pop(reading.scope, None) or _Scope([])
            fronts = kept.fronts
            gone = [
                f
                for f in fronts
                if f is reading.replaces or (f.size <= front.size and _begins(front.raw, f))
            ]
            if len(fronts) - len(gone) >= _PER_SCOPE:
                gone.append(next(f for f in fronts if f not in gone))  # the oldest
            kept.fronts = [f for f in fronts if f not in gone] + [front]
            if reading.replaces is not None:  # a walk after misses does not end the run
                kept.misses = 0
            self._scopes[reading.scope] = kept
            self._bytes += _cost(front) - sum(_cost(f) for f in gone)
            self._trim()

    def _trim(self) -> None:
        """Drop the least recently kept scopes beyond the bounds (the lock held)."""
        while self._scopes and (
            len(self._scopes) > self._max_scopes or self._bytes > self._max_bytes
        ):
            _, dropped = self._scopes.popitem(last=False)
            self._bytes -= sum(_cost(f) for f in dropped.fronts)

    @property
    def size_bytes(self) -> int:
        """The estimated memory the kept fronts hold."""
        return self._bytes


def _nonfinite(s: str, start: int, end: int) -> bool:
    """Whether ``s[start:end]`` holds ``NaN`` or ``Infinity`` (values only ``json`` reads
    and writes; ``orjson`` would write them as ``null``)."""
    return s.find("NaN", start, end) >= 0 or s.find("Infinity", start, end) >= 0


def _begins(raw: bytes, front: _Front) -> bool:
    """Whether ``raw`` begins with ``front``'s bytes (compared in place, not copied)."""
    return len(raw) >= front.size and raw.startswith(memoryview(front.raw)[: front.size])


def _length(front: _Front) -> int:
    return front.size


def _cost(front: _Front) -> int:
    return len(front.raw) * _COST_PER_BYTE
