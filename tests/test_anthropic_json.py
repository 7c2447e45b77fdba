"""The Anthropic route's request JSON written from memoised blocks is byte for byte what
``orjson.dumps`` writes for :func:`messages_to_anthropic`, or is refused (``None``)."""

from __future__ import annotations

import random

import orjson
import pytest

from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import Message, RawPart, ToolCall
from ctxwarden.formats import messages_from_anthropic, messages_to_anthropic
from ctxwarden.service.anthropic_json import object_bytes, request_json
from ctxwarden_bench.random_histories import random_history


def _ordinary(messages: list[Message], marks: set[str]) -> tuple[bytes | None, bytes]:
    system, turns = messages_to_anthropic(messages, cache_breakpoints=marks)
    return (orjson.dumps(system) if system else None), orjson.dumps(turns)


def _marks(rng: random.Random, messages: list[Message]) -> set[str]:
    return {m.id for m in rng.sample(messages, min(len(messages), rng.randint(0, 4)))}


@pytest.mark.parametrize("seed", range(60))
def test_random_histories_are_written_as_the_ordinary_conversion(seed: int) -> None:
    rng = random.Random(seed)
    history = random_history(seed)
    for _ in range(3):  # a window of the history (the context a build sends), marked
        start = rng.randrange(len(history))
        window = history[start:]
        marks = _marks(rng, window)
        try:
            want = _ordinary(window, marks)
        except InvalidMessageError:  # a window that starts on a result: refused
            assert request_json(window, marks) is None
            continue
        # twice: the second time from the blocks kept on the messages
        assert request_json(window, marks) == want
        assert request_json(window, marks) == want


def _thinking_turns() -> list[Message]:
    thinking = {"type": "thinking", "thinking": "Plan: look it up.", "signature": "c2ln+/=="}
    use_a = {"type": "tool_use", "id": "tu_a", "name": "lookup", "input": {"q": "a"}}
    use_b = {"type": "tool_use", "id": "tu_b", "name": "lookup", "input": {"q": "b"}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}  # fmt: skip
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "look"}, image]},
        {"role": "assistant", "content": [thinking, {"type": "text", "text": "On it."}, use_a]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_a",
                                      "content": "A", "is_error": True}]},
        {"role": "assistant", "content": [use_b, dict(thinking, signature="c2ln2")]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_b",
                                      "content": [{"type": "text", "text": "B"}]},
                                     {"type": "text", "text": "and now?"}]},
    ]  # fmt: skip
    return messages_from_anthropic([{"type": "text", "text": "Be brief."}], turns)


def test_thinking_images_errors_and_breakpoints_match() -> None:
    messages = _thinking_turns()
    for marks in ({m.id for m in messages[:4]}, {messages[3].id}, set()):
        assert request_json(messages, marks) == _ordinary(messages, marks)
    # the same message marked and unmarked: two kept forms, neither leaking into the other
    assert request_json(messages, set()) == _ordinary(messages, set())


def test_empty_content_system_between_and_merged_user_turns() -> None:
    call = ToolCall("c1", "lookup", '{"q": 1}')
    messages = [
        Message.system("one"),
        Message.user(""),  # no blocks: a turn of its own, empty
        Message.assistant("ok"),
        Message.user("a"),
        Message.system("two"),  # after the first turn: in place, text of the users' turn
        Message.user("b"),
        Message.assistant(None, (call,)),
        Message.tool("r", "c1"),
        Message.user(""),  # merges into the results' turn, adding nothing
        Message.assistant("done"),
    ]
    assert request_json(messages) == _ordinary(messages, set())
    assert _ordinary(messages, set())[1].count(b'"role":"user"') == 3
    system, turns = messages_to_anthropic(messages)
    assert system == [{"type": "text", "text": "one"}]
    assert [b["text"] for b in turns[2]["content"]] == ["a", "two", "b"]
    assert request_json([]) == _ordinary([], set()) == (None, b"[]")
    assert request_json(messages[:1]) == _ordinary(messages[:1], set())  # a system only


def test_a_system_message_after_the_first_turn_is_sent_in_place_as_user_text() -> None:
    """A layer after the task, a recall block after tool results, a client's own note:
    each stays where it stands (the ``system`` parameter keeps only the leading system
    messages, so changing such a block does not rewrite the cached system prompt), after
    the results it follows (Anthropic wants ``tool_result`` blocks first in a turn), and
    its breakpoint marks its own block."""
    call = ToolCall("c1", "lookup", '{"q": 1}')
    messages = [
        Message.system("prompt", id="s"),
        Message.system("facts", id="f"),
        Message.user("the task", id="t"),
        Message.system("ledger", id="l"),
        Message.assistant(None, (call,), id="a"),
        Message.tool("r", "c1", id="r"),
        Message.system("recalled", id="rc"),
        Message.user("and now?", id="u"),
    ]
    for marks in (set(), {"t", "l"}, {"s", "t", "l", "rc"}):
        assert request_json(messages, marks) == _ordinary(messages, marks)
    system, turns = messages_to_anthropic(messages, cache_breakpoints={"t", "l"})
    assert [b["text"] for b in system or []] == ["prompt", "facts"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    task, ledger = turns[0]["content"]
    assert (task["text"], ledger["text"]) == ("the task", "ledger")
    assert "cache_control" in task and "cache_control" in ledger
    assert [b["type"] for b in turns[2]["content"]] == ["tool_result", "text", "text"]
    assert [b.get("text") for b in turns[2]["content"][1:]] == ["recalled", "and now?"]


def test_contexts_only_the_ordinary_conversion_writes_are_refused() -> None:
    call = ToolCall("c1", "lookup", "{}")
    reused = [
        Message.user("q"),
        Message.assistant(None, (call,)),
        Message.tool("a", "c1"),
        Message.assistant(None, (call,)),  # the id again: renamed c1__dup2 in both
        Message.tool("b", "c1"),
    ]
    assert request_json(reused) is None
    assert b"c1__dup2" in _ordinary(reused, set())[1]
    orphan = [Message.user("q"), Message.tool("a", "c1")]
    assert request_json(orphan) is None
    with pytest.raises(InvalidMessageError, match="no tool call before it"):
        messages_to_anthropic(orphan)
    late = [Message.user("q"), Message.assistant(None, (call,)), Message.user("x")]
    late.append(Message.tool("a", "c1"))  # a result after another message: an orphan
    assert request_json(late) is None
    huge = [Message.user((RawPart({"type": "text", "text": "x", "n": 2**70}),))]
    assert request_json(huge) is None  # orjson writes no integer past 64 bits
    with pytest.raises(InvalidMessageError, match="at most 4 cache breakpoints"):
        request_json(reused, {"a", "b", "c", "d", "e"})


def test_object_bytes_is_orjson_with_values_given() -> None:
    data = {"model": "m", "messages": None, "max_tokens": 5, "system": None, "x": [1.5, "é"]}
    written = {"messages": b'[{"role":"user","content":[]}]', "system": b"[]"}
    want = orjson.dumps({**data, "messages": [{"role": "user", "content": []}], "system": []})
    assert object_bytes(data, written) == want
    assert object_bytes({}, {}) == orjson.dumps({}) and object_bytes({"a": 1}, {}) == b'{"a":1}'
