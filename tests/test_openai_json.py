"""The memoised OpenAI JSON of a context is byte for byte what json.dumps writes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctxwarden.core.messages import Message
from ctxwarden.formats.openai import message_from_openai, messages_to_openai
from ctxwarden.formats.openai_json import (
    dumps,
    messages_json,
    messages_json_bytes,
    messages_json_pieces,
    object_json,
    object_json_bytes,
)
from ctxwarden.pipeline.engine import build_context
from ctxwarden_bench.proxy import conversation


def _plain(messages: list[Message]) -> str:
    return json.dumps(messages_to_openai(messages), ensure_ascii=False)


def test_messages_json_equals_json_dumps_twice_over() -> None:
    history = [message_from_openai(m) for m in conversation(120)]
    built = build_context(history, "gpt-4o", 3_000)
    for messages in (history, built.messages, built.messages):  # the last: every memo hit
        assert messages_json(messages) == _plain(messages)
        assert messages_json_bytes(messages) == _plain(messages).encode()


def test_messages_the_fingerprint_cannot_tell_apart_are_written_afresh() -> None:
    # same fingerprint (sorted keys), different key order in content parts and extras
    raw: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "x", "b": 1, "a": 2}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"a": 2, "b": 1, "type": "x"}]},
        {"role": "assistant", "content": "hi", "refusal": None, "audio": {"id": "1", "b": 2}},
        {"role": "assistant", "content": "hi", "audio": {"b": 2, "id": "1"}, "refusal": None},
        {"role": "assistant", "content": "hi", "refusal": None, "x": "é\u2028"},
        {"role": "assistant", "content": "hi", "x": "é\u2028", "refusal": None},
        {"role": "developer", "content": "Be brief. ✓ 🙂"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "f", "arguments": "{\"q\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"ok\": true}"},
    ]  # fmt: skip
    messages = [message_from_openai(m) for m in raw]
    assert messages[0].fingerprint == messages[1].fingerprint
    for _ in range(2):
        assert messages_json(messages) == _plain(messages)
        assert messages_json_bytes(messages) == _plain(messages).encode()
        for m in messages:
            assert messages_json([m]) == _plain([m])
            assert messages_json_bytes([m]) == _plain([m]).encode()


def test_object_json_equals_json_dumps() -> None:
    body: dict[str, object] = {
        "model": "gpt-4o",
        "messages": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [{"type": "function", "function": {"name": "ü", "parameters": {}}}],
        "temperature": 0.1,
        "n": 1,
        "stop": None,
    }
    history = [message_from_openai(m) for m in conversation(12)]
    written = object_json(body, {"messages": messages_json(history)})
    assert written == json.dumps(
        {**body, "messages": messages_to_openai(history)}, ensure_ascii=False
    )
    assert object_json_bytes(body, {"messages": messages_json_bytes(history)}) == written.encode()


def test_object_json_is_json_dumps_when_the_data_holds_its_markers() -> None:
    """The object is dumped in one call with a marker where a written value goes: data
    whose own text holds a marker (a value, a key, or a written value holding the next
    marker) is still written byte for byte as ``json.dumps`` writes it."""
    from ctxwarden.formats.openai_json import _SLOT

    first, second = _SLOT.format(0), _SLOT.format(1)
    data: dict[str, object] = {"a": first, first: 1, "w": None, "v": None, "z": "\u2603"}
    for written in (
        {"w": "[1]", "v": "2"},
        {"w": json.dumps(second), "v": "2"},  # a written value holding the next marker
        {"w": "[]", "absent": "3"},  # a written key the data does not have: not written
    ):
        expected = {**data, **{k: json.loads(v) for k, v in written.items() if k in data}}
        assert object_json(data, written) == json.dumps(expected, ensure_ascii=False)


def test_the_edges_of_the_joins_are_written_as_json_dumps_writes_them() -> None:
    """No message, one message, an empty object and one key: the brackets and braces put on
    the first and last piece rather than around the whole."""
    one = [message_from_openai({"role": "user", "content": "é"})]
    assert messages_json_bytes([]) == b"[]" == json.dumps([]).encode()
    assert messages_json_bytes(one) == _plain(one).encode()
    assert object_json_bytes({}, {}) == b"{}"
    assert object_json_bytes({"messages": None}, {"messages": b"[]"}) == b'{"messages": []}'
    assert object_json_bytes({"a": 1}, {}) == json.dumps({"a": 1}).encode()
    for messages in ([], one, one * 3):  # the pieces given as the value, unjoined
        pieces = messages_json_pieces(messages)
        assert b"".join(pieces) == messages_json_bytes(messages) == _plain(messages).encode()
        whole = object_json_bytes({"m": 1, "messages": None}, {"messages": pieces})
        want = {"m": 1, "messages": json.loads(_plain(messages))}
        assert whole == json.dumps(want, ensure_ascii=False).encode()


def test_a_context_utf8_cannot_hold_raises_as_encode_does() -> None:
    odd = message_from_openai({"role": "user", "content": "lone \ud800"})
    for _ in range(2):  # nothing is kept of a text that cannot be encoded
        with pytest.raises(UnicodeEncodeError):
            messages_json_bytes([odd])


def test_dumps_is_json_dumps_without_ascii_escapes() -> None:
    values: list[Any] = ["naïve ✓ \u2028 \ud800 \x00", 1, 1.0, 1e-05, float("nan"), True, None,
                         {"b": [1, {"a": "x"}], "a": 2.5}, [], {}, ["é", -0.0]]  # fmt: skip
    for value in values:
        assert dumps(value) == json.dumps(value, ensure_ascii=False)
    with pytest.raises(TypeError):
        dumps({1j: 1})  # as json.dumps refuses it
