"""A built context as OpenAI chat JSON text, each message's text memoised (speed only).

The proxy sends the built context on every call, and from one call to the next it is
mostly the same messages (the stored ones, their truncated and masked copies, the
ledger block): :func:`messages_json` writes each message's JSON once and joins the
texts, exactly as ``json.dumps(messages_to_openai(messages), ensure_ascii=False)``
writes the list. The memo is bounded and locked and caches a pure function: without
it every byte is the same.

A message's text is looked up by its fingerprint (what the provider sees) and the
order of its extra keys, which together fix the text whenever its content is a string
(or none) and its extra values are scalars; any other message (content parts, nested
extra values, whose key order the fingerprint does not see) is written afresh.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

from ctxwarden.core.caching import BoundedCache
from ctxwarden.core.messages import Message
from ctxwarden.formats.openai import META_KEY, message_to_openai

__all__ = [
    "dumps",
    "joined_object",
    "message_json",
    "messages_json",
    "messages_json_bytes",
    "messages_json_pieces",
    "meta_message_bytes",
    "meta_message_json",
    "object_json",
    "object_json_bytes",
]

_SCALARS = (str, int, float, bool, type(None))
dumps = json.JSONEncoder(ensure_ascii=False).encode
"""``json.dumps(value, ensure_ascii=False)``, the same text: the encoder that call builds
each time, built once (the proxy writes dozens of keys and values per call; an encoder
keeps no state between calls)."""


# bounded in entries and in characters: 64 agents of 200 messages, two forms each
_MEMO: BoundedCache[Hashable, str] = BoundedCache(
    "openai_json.texts", 32_768, max_weight=64 * 1024 * 1024, weigh=len
)
_META_MEMO: BoundedCache[Hashable, str] = BoundedCache(
    "openai_json.meta_texts", 32_768, max_weight=64 * 1024 * 1024, weigh=len
)


def _key(message: Message) -> Hashable | None:
    """What fixes ``message``'s JSON text, or None when the fingerprint does not."""
    if not isinstance(message.content, str | None):
        return None
    extra = message.extra
    if not extra:
        return (message.fingerprint, ())
    if not all(isinstance(v, _SCALARS) for v in extra.values()):
        return None
    return (message.fingerprint, tuple(extra))


_TEXT_ATTR, _META_ATTR = "_cw_openai_json", "_cw_openai_meta_json"
_BYTES_ATTR, _META_BYTES_ATTR = "_cw_openai_json_utf8", "_cw_openai_meta_json_utf8"


def _remember(message: Message, attr: str, text: str) -> str:
    """Keep ``text`` on the message itself, next to its cached ``fingerprint``: a
    :class:`Message` never changes, and the same objects (the session's decoded messages,
    the memoised cuts) come back build after build, so the next lookup is one dict read."""
    message._memo[attr] = text
    return text


def message_json(message: Message) -> str:
    """``json.dumps(message_to_openai(message), ensure_ascii=False)``, memoised."""
    found: str | None = message._memo.get(_TEXT_ATTR)
    if found is not None:
        return found
    key = _key(message)
    found = _MEMO.get(key) if key is not None else None
    if found is not None:
        return _remember(message, _TEXT_ATTR, found)
    text = dumps(message_to_openai(message))
    if key is not None:
        _MEMO.put(key, text)
        _remember(message, _TEXT_ATTR, text)
    return text


def _meta_key(message: Message) -> Hashable | None:
    """:func:`_key` plus our metadata, or None when they do not fix the text (a nested
    ``meta`` value, an extra key named like ours)."""
    key = _key(message)
    if key is None or META_KEY in message.extra:
        return None
    meta: tuple[tuple[str, type, object], ...] = ()
    if message.meta:
        meta = tuple((k, type(v), v) for k, v in message.meta.items())  # True and 1 differ
        if not all(isinstance(v, _SCALARS) for _, _, v in meta):
            return None
    m = message
    return (key, m.id, m.kind, m.pinned, m.priority, type(m.created_at), m.created_at, meta)


def meta_message_json(message: Message) -> str:
    """``json.dumps(message_to_openai(message, with_meta=True), ensure_ascii=False)``,
    memoised (the build log writes every built message this way on every build)."""
    found: str | None = message._memo.get(_META_ATTR)
    if found is not None:
        return found
    key = _meta_key(message)
    found = _META_MEMO.get(key) if key is not None else None
    if found is not None:
        return _remember(message, _META_ATTR, found)
    text = dumps(message_to_openai(message, with_meta=True))
    if key is not None:
        _META_MEMO.put(key, text)
        _remember(message, _META_ATTR, text)
    return text


def messages_json(messages: Sequence[Message]) -> str:
    """``json.dumps(messages_to_openai(messages), ensure_ascii=False)``, byte for byte
    (a list is its items' texts joined by ``", "``), each message's text memoised."""
    return "[" + ", ".join(map(message_json, messages)) + "]"


def _utf8(message: Message, json_of: Callable[[Message], str], text_attr: str, attr: str) -> bytes:
    """``json_of(message)`` as UTF-8, kept on the message (as ``attr``) when its text is
    (as ``text_attr``): a context's bytes are then joined, not encoded again on every
    call. A text that UTF-8 cannot hold (a lone surrogate) raises as ``str.encode`` does."""
    found: bytes | None = message._memo.get(attr)
    if found is not None:
        return found
    text = json_of(message)
    data = text.encode()
    if message._memo.get(text_attr) is text:  # the text is memoised: so are its bytes
        message._memo[attr] = data
    return data


def _message_bytes(message: Message) -> bytes:
    """:func:`message_json` as UTF-8, memoised with it (see :func:`_utf8`)."""
    return _utf8(message, message_json, _TEXT_ATTR, _BYTES_ATTR)


def meta_message_bytes(message: Message) -> bytes:
    """:func:`meta_message_json` as UTF-8, memoised with it (see :func:`_utf8`): the
    build log joins a context's bytes instead of encoding its text."""
    return _utf8(message, meta_message_json, _META_ATTR, _META_BYTES_ATTR)


def messages_json_bytes(messages: Sequence[Message]) -> bytes:
    """``messages_json(messages).encode()``, byte for byte, each message's UTF-8 memoised
    (UTF-8 of a concatenation is the concatenation of the parts' UTF-8)."""
    return b"".join(messages_json_pieces(messages))


def messages_json_pieces(messages: Sequence[Message]) -> list[bytes]:
    """The pieces of :func:`messages_json_bytes`, unjoined: a proxied call's context is
    hundreds of KB, which :func:`object_json_bytes` then copies once into the body (the
    brackets ride on the first and last message's bytes, not around the whole)."""
    # the memo read inline: a call's context is hundreds of messages whose bytes are kept
    pieces = [m._memo.get(_BYTES_ATTR) or _message_bytes(m) for m in messages]
    if not pieces:
        return [b"[]"]
    out = [b", "] * (2 * len(pieces) - 1)
    out[::2] = pieces
    out[0] = b"[" + out[0]
    out[-1] += b"]"
    return out


def object_json_bytes(data: dict[str, object], written: Mapping[str, bytes | list[bytes]]) -> bytes:
    """``object_json(data, ...).encode()`` with the values of the keys in ``written``
    given as UTF-8 JSON already, as bytes or as pieces to join (the proxy's request body:
    its messages, from :func:`messages_json_pieces`), each copied once (one join)."""
    pairs = (
        (dumps(k).encode(), written[k] if k in written else dumps(v).encode())
        for k, v in data.items()
    )
    return joined_object(pairs, b", ", b": ")


def joined_object(
    pairs: Iterable[tuple[bytes, bytes | list[bytes]]], comma: bytes, colon: bytes
) -> bytes:
    """A JSON object from its keys and values written already (a value as bytes or as
    pieces), in one join: the body sent upstream holds hundreds of KB of messages, which
    braces and keys concatenated around them would copy again."""
    parts: list[bytes] = []
    for key, value in pairs:
        parts += (comma, key, colon)
        if isinstance(value, list):
            parts += value
        else:
            parts.append(value)
    if not parts:
        return b"{}"
    parts[0] = b"{"
    parts.append(b"}")
    return b"".join(parts)


_SLOT = "\x00ctxwarden-written-{}\x00"  # a value written in its place, then replaced


def object_json(data: dict[str, object], written: dict[str, str]) -> str:
    """``json.dumps(data, ensure_ascii=False)`` for a JSON object with string keys, byte
    for byte, with the values of the keys in ``written`` given as JSON text already:
    the object is dumped in one call with a marker in each such value's place (a string
    with NULs, which JSON writes escaped), each marker then replaced by its value; a
    marker that the data's own text holds too is not replaced, the object is written
    pair by pair instead."""
    slots = {k: _SLOT.format(i) for i, k in enumerate(written)}
    text = dumps({k: slots.get(k, v) for k, v in data.items()})
    for key, slot in slots.items():
        if key in data:
            marker = dumps(slot)
            if text.count(marker) != 1:
                return _pairs_json(data, written)
            text = text.replace(marker, written[key])
    return text


def _pairs_json(data: dict[str, object], written: dict[str, str]) -> str:
    items = (dumps(k) + ": " + (written[k] if k in written else dumps(v)) for k, v in data.items())
    return "{" + ", ".join(items) + "}"
