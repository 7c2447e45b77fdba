"""The client's messages as :func:`~ctxwarden.service.history.wire_key` s, memoised per
client session (speed only).

An agent sends its whole history on every call, and from one call to the next it is the
previous call's messages plus a few new ones; keying every message again was the
proxy's largest cost in the event loop. :class:`KeyMemo` keeps, per client session, the
previous call's messages as ``orjson`` bytes and their keys: when this call's messages,
written the same way, start with those bytes, the first keys are reused and only the new
messages are keyed. Equal bytes mean equal values, types included (``1``, ``1.0`` and
``true`` are written apart), so the keys are exactly what keying every message gives;
anything orjson cannot write (a lone surrogate, an integer beyond 64 bits) is keyed
afresh. Bounded in sessions and bytes, and locked: its absence changes no key.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import orjson

from ctxwarden.service.history import wire_key

__all__ = ["KeyMemo"]


class KeyMemo:
    def __init__(self, sessions: int = 512, max_bytes: int = 128 * 1024 * 1024) -> None:
        self._entries: OrderedDict[Hashable, tuple[bytes, list[bytes]]] = OrderedDict()
        self._sessions, self._max_bytes, self._bytes = sessions, max_bytes, 0
        self._lock = threading.Lock()

    def keys(self, scope: Hashable, messages: Sequence[Mapping[str, Any]]) -> list[bytes]:
        """``[wire_key(m) for m in messages]``, reusing the keys of ``scope``'s last call."""
        try:
            written = orjson.dumps(messages)
        except (orjson.JSONEncodeError, TypeError):
            return [wire_key(m) for m in messages]
        with self._lock:
            found = self._entries.get(scope)
        keys: list[bytes] | None = None
        if found is not None:
            before, known = found
            # "[a,b" + "," or "]": the first len(known) messages are written alike
            n = len(before) - 1
            if written.startswith(before[:-1]) and written[n : n + 1] in (b",", b"]"):
                keys = known + [wire_key(m) for m in messages[len(known) :]]
        if keys is None:
            keys = [wire_key(m) for m in messages]
        self._put(scope, written, keys)
        return keys

    def _put(self, scope: Hashable, written: bytes, keys: list[bytes]) -> None:
        with self._lock:
            old = self._entries.pop(scope, None)
            self._bytes += len(written) - (len(old[0]) if old is not None else 0)
            self._entries[scope] = (written, keys)
            while self._entries and (
                len(self._entries) > self._sessions or self._bytes > self._max_bytes
            ):
                self._bytes -= len(self._entries.popitem(last=False)[1][0])
