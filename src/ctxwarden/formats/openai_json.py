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
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence

from ctxwarden.formats.openai import message_to_openai
from ctxwarden.messages import Message

__all__ = ["message_json", "messages_json", "object_json"]

_MEMO: OrderedDict[Hashable, str] = OrderedDict()
_MEMO_MAX = 8_192
_LOCK = threading.Lock()
_SCALARS = (str, int, float, bool, type(None))


def _key(message: Message) -> Hashable | None:
    """What fixes ``message``'s JSON text, or None when the fingerprint does not."""
    if not isinstance(message.content, str | None):
        return None
    if not all(isinstance(v, _SCALARS) for v in message.extra.values()):
        return None
    return (message.fingerprint, tuple(message.extra))


def message_json(message: Message) -> str:
    """``json.dumps(message_to_openai(message), ensure_ascii=False)``, memoised."""
    key = _key(message)
    if key is not None:
        with _LOCK:
            found = _MEMO.get(key)
            if found is not None:
                _MEMO.move_to_end(key)
                return found
    text = json.dumps(message_to_openai(message), ensure_ascii=False)
    if key is not None:
        with _LOCK:
            _MEMO[key] = text
            while len(_MEMO) > _MEMO_MAX:
                _MEMO.popitem(last=False)
    return text


def messages_json(messages: Sequence[Message]) -> str:
    """``json.dumps(messages_to_openai(messages), ensure_ascii=False)``, byte for byte
    (a list is its items' texts joined by ``", "``), each message's text memoised."""
    return "[" + ", ".join(map(message_json, messages)) + "]"


def object_json(data: dict[str, object], written: dict[str, str]) -> str:
    """``json.dumps(data, ensure_ascii=False)`` for a JSON object with string keys, byte
    for byte, with the values of the keys in ``written`` given as JSON text already."""
    items = (
        json.dumps(k, ensure_ascii=False)
        + ": "
        + (written[k] if k in written else json.dumps(v, ensure_ascii=False))
        for k, v in data.items()
    )
    return "{" + ", ".join(items) + "}"
