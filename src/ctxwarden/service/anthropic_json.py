"""A built context as Anthropic request JSON, each message's blocks written once (speed only).

The proxy's ``/v1/messages`` route sends the built context on every call, and from one
call to the next it is mostly the same :class:`~ctxwarden.core.messages.Message` objects
(the session's decoded messages, the memoised cuts). Converting all of them with
:func:`~ctxwarden.formats.anthropic.messages_to_anthropic` and serialising the result
was the largest single cost of a proxied Anthropic call. :func:`request_json` writes
the same bytes ``orjson.dumps`` gives for that result, from each message's blocks as
compact JSON, kept on the message (a message never changes; the blocks of one depend
on nothing else, except that a cache breakpoint marks them, kept apart).

Where the blocks would depend on the rest of the context it answers ``None`` and the
caller converts the ordinary way: a call id used twice (renamed ``__dupN`` across the
whole request), a tool result not right after its call (that conversion raises the
error), a value ``orjson`` does not write (an integer past 64 bits).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import orjson

from ctxwarden.core.messages import Message
from ctxwarden.formats.anthropic import (
    check_breakpoints,
    mark_cached,
    system_block,
    tool_result_block,
    tool_use_blocks,
    user_blocks,
)
from ctxwarden.formats.openai_json import joined_object

__all__ = ["object_bytes", "request_json"]

_ATTR, _MARKED_ATTR = "_cw_anthropic_blocks", "_cw_anthropic_blocks_marked"
_TURN_HEAD = {role: b'{"role":"%s","content":[' % role.encode() for role in ("user", "assistant")}


class _NotPlain(Exception):
    """The context needs the ordinary conversion (see the module docstring)."""


def _blocks(message: Message, marked: bool) -> bytes:
    """``message``'s blocks as compact JSON without the list's brackets (``b""`` for
    none), memoised on the message."""
    attr = _MARKED_ATTR if marked else _ATTR
    found: bytes | None = message._memo.get(attr)
    if found is not None:
        return found
    role = message.role
    blocks: list[dict[str, Any]]
    if role == "system":
        blocks = [system_block(message)]
    elif role == "user":
        blocks = user_blocks(message)
    elif role == "tool":
        blocks = [tool_result_block(message, message.tool_call_id or "")]
    else:
        blocks = tool_use_blocks(message, [c.id for c in message.tool_calls])
    if marked:
        mark_cached(blocks)
    try:
        data = orjson.dumps(blocks)[1:-1]
    except (orjson.JSONEncodeError, TypeError) as exc:
        raise _NotPlain from exc
    message._memo[attr] = data
    return data


def request_json(
    messages: Sequence[Message], cache_breakpoints: Collection[str] = ()
) -> tuple[bytes | None, bytes] | None:
    """``(system, messages)`` of :func:`~ctxwarden.formats.anthropic.messages_to_anthropic`
    as ``orjson.dumps`` writes each (``system`` ``None`` when there is none), or ``None``
    when only that conversion gives them (see the module docstring)."""
    check_breakpoints(cache_breakpoints)
    system: list[bytes] = []
    parts = [b"["]  # the turns' JSON, joined once (the context's bytes copied once)
    turn = ""  # the role of the turn being written, "" before the first
    empty = True  # whether it has no block yet
    calls: set[str] = set()
    owed: set[str] = set()  # the calls of the assistant message the tool run answers
    try:
        for m in messages:
            role = m.role
            if role == "tool":
                call_id = m.tool_call_id or ""
                if call_id not in owed:
                    return None  # not right after its call: the conversion says why
                owed.discard(call_id)
                role = "user"
            else:
                owed = set()
                if role == "system" and not turn:
                    system.append(_blocks(m, m.id in cache_breakpoints))
                    continue
                if role == "system":  # after the conversation began: in place, as user text
                    role = "user"
                if role == "assistant":
                    for call in m.tool_calls:
                        if call.id in calls:
                            return None  # renamed __dupN across the request
                        calls.add(call.id)
                        owed.add(call.id)
            data = _blocks(m, m.id in cache_breakpoints)
            if role != turn:
                parts += (_TURN_HEAD[role],) if not turn else (b"]},", _TURN_HEAD[role])
                turn, empty = role, True
            if data:
                parts += (data,) if empty else (b",", data)
                empty = False
    except _NotPlain:
        return None
    parts.append(b"]}]" if turn else b"]")
    return (b"[" + b",".join(system) + b"]" if system else None), b"".join(parts)


def object_bytes(data: Mapping[str, object], written: Mapping[str, bytes]) -> bytes:
    """``orjson.dumps(data)`` for a JSON object with string keys, with the values of the
    keys in ``written`` given as compact JSON already, each copied once
    (:func:`~ctxwarden.formats.openai_json.joined_object`); raises as ``orjson.dumps``
    does."""
    pairs = (
        (orjson.dumps(k), written[k] if k in written else orjson.dumps(v)) for k, v in data.items()
    )
    return joined_object(pairs, b",", b":")
