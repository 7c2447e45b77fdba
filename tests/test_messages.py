"""The message model and its wire formats: lossless round trips, pairing, clear errors."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

import ctxwarden
from ctxwarden import InvalidMessageError, Message, ToolCall
from ctxwarden.core.messages import ImagePart, RawPart, TextPart
from ctxwarden.core.pairing import group_blocks, pairing_problems, validate_pairing
from ctxwarden.formats.anthropic import messages_from_anthropic, messages_to_anthropic
from ctxwarden.formats.openai import (
    message_from_openai,
    message_to_openai,
    messages_from_openai,
    messages_to_openai,
)


def _shape(messages: list[Message]) -> list[tuple[Any, ...]]:
    return [
        (
            m.role,
            m.text,
            tuple((c.id, c.name, json.loads(c.arguments or "{}")) for c in m.tool_calls),
            m.tool_call_id,
        )
        for m in messages
    ]


def test_openai_round_trip_is_identity_on_tau_bench(tau_bench_path: Path) -> None:
    runs = json.loads(tau_bench_path.read_text())
    assert len(runs) == 120
    for run in runs:
        parsed = messages_from_openai(run["traj"])
        assert messages_to_openai(parsed) == run["traj"]
        validate_pairing(parsed)


def test_message_methods_round_trip_the_tau_bench_messages(tau_bench_path: Path) -> None:
    """Issue 2's per-message contract, kept through the layout change (issue 35): thin
    methods over the converters of ``ctxwarden.formats.openai``."""
    runs = json.loads(tau_bench_path.read_text())
    for run in runs:
        for i, raw in enumerate(run["traj"]):
            message = Message.from_openai(raw, index=i)
            assert message.to_openai() == raw
            assert message == message_from_openai(raw, index=i)
    stored = Message.tool("{}", "c1", id="r1", pinned=True).to_openai(with_meta=True)
    assert stored["ctxwarden"]["id"] == "r1" and stored["ctxwarden"]["pinned"] is True
    assert Message.from_openai(stored).pinned
    with pytest.raises(InvalidMessageError, match="role") as err:
        Message.from_openai({"content": "x"}, index=7)
    assert err.value.index == 7


def test_anthropic_round_trip_keeps_text_calls_results_and_pairing(tau_bench_path: Path) -> None:
    runs = json.loads(tau_bench_path.read_text())
    for run in runs:
        parsed = messages_from_openai(run["traj"])
        system, turns = messages_to_anthropic(parsed)
        roles = [t["role"] for t in turns]
        assert all(a != b for a, b in itertools.pairwise(roles))  # alternation
        ids = [b["id"] for t in turns for b in t["content"] if b.get("type") == "tool_use"]
        assert len(ids) == len(set(ids))  # reused call ids made unique for Anthropic
        back = messages_from_anthropic(system, turns)
        assert _shape(back) == _shape(parsed)
        assert pairing_problems(back) == []


def test_reused_call_ids_pair_by_position() -> None:
    msgs = [
        Message.user("go"),
        Message.assistant(None, (ToolCall("call_1", "a"),)),
        Message.tool("first", "call_1"),
        Message.assistant(None, (ToolCall("call_1", "b"),)),
        Message.tool("second", "call_1"),
    ]
    blocks = group_blocks(msgs)
    assert [len(b.messages) for b in blocks] == [1, 2, 2]
    assert [b.messages[-1].text for b in blocks[1:]] == ["first", "second"]
    system, turns = messages_to_anthropic(msgs)
    uses = [b["id"] for t in turns for b in t["content"] if b.get("type") == "tool_use"]
    results = [
        b["tool_use_id"] for t in turns for b in t["content"] if b.get("type") == "tool_result"
    ]
    assert uses == results == ["call_1", "call_1__dup2"]
    assert [m.tool_call_id for m in messages_from_anthropic(system, turns) if m.role == "tool"] == [
        "call_1",
        "call_1",
    ]


def test_parallel_results_merge_into_one_user_turn() -> None:
    calls = (ToolCall("c1", "x"), ToolCall("c2", "y"))
    msgs = [Message.user("go"), Message.assistant("two calls", calls)]
    msgs += [Message.tool("r1", "c1"), Message.tool("r2", "c2"), Message.user("thanks")]
    _, turns = messages_to_anthropic(msgs)
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert [b["type"] for b in turns[2]["content"]] == ["tool_result", "tool_result", "text"]


def test_thinking_blocks_go_back_byte_for_byte_in_their_place() -> None:
    """Anthropic checks a thinking block's signature and its place in the turn: both
    survive the round trip, through the stored (OpenAI-shaped) form too, and count."""
    thinking = {"type": "thinking", "thinking": "Plan: look it up.", "signature": "c2ln+/=="}
    redacted = {"type": "redacted_thinking", "data": "RU5DUllQVEVE"}
    use_a = {"type": "tool_use", "id": "tu_a", "name": "lookup", "input": {"q": "a"}}
    use_b = {"type": "tool_use", "id": "tu_b", "name": "lookup", "input": {"q": "b"}}
    result = {"type": "tool_result", "tool_use_id": "tu_a", "content": "A"}
    result_b = {"type": "tool_result", "tool_use_id": "tu_b", "content": "B"}
    turns = [
        {"role": "user", "content": "find a and b"},
        {"role": "assistant", "content": [thinking, redacted, {"type": "text", "text": "On it."},
                                          use_a]},
        {"role": "user", "content": [result]},
        # interleaved thinking: a block after a call keeps its place
        {"role": "assistant", "content": [use_b, dict(thinking, signature="c2ln2")]},
        {"role": "user", "content": [result_b]},
    ]  # fmt: skip
    parsed = messages_from_anthropic(None, turns)
    assert parsed[1].text == "On it." and [c.id for c in parsed[1].tool_calls] == ["tu_a"]
    stored = messages_from_openai(messages_to_openai(parsed, with_meta=True))
    for messages in (parsed, stored):
        _, back = messages_to_anthropic(messages)
        assert json.dumps([back[1], back[3]]) == json.dumps([turns[1], turns[3]])
    counter = ctxwarden.TokenCounter.for_model("claude-sonnet-4-5")
    bare = Message.assistant("On it.", parsed[1].tool_calls)
    assert counter.count_message(parsed[1]) > counter.count_message(bare) + 10
    # a cache breakpoint never lands on a thinking block (the API refuses it)
    _, marked = messages_to_anthropic(parsed[3:4], cache_breakpoints={parsed[3].id})
    assert [("cache_control" in b) for b in marked[0]["content"]] == [True, False]


def test_parts_images_and_unknown_keys_survive() -> None:
    raw = [
        {"role": "developer", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,iVBORw0K", "detail": "low"},
                },
                {"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}},
            ],
        },
        {"role": "assistant", "content": None, "refusal": "no", "tool_calls": []},
    ]
    parsed = messages_from_openai(raw)
    assert parsed[0].role == "system"
    assert isinstance(parsed[1].content, tuple)
    assert [type(p) for p in parsed[1].content] == [TextPart, ImagePart, RawPart]
    assert messages_to_openai(parsed) == raw
    _, turns = messages_to_anthropic(parsed[1:2])
    image = turns[0]["content"][1]
    assert image == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"},
    }


def test_metadata_rides_along_only_when_asked() -> None:
    m = Message.user("pin me", pinned=True, priority="high", id="x1")
    wire = message_to_openai(m)
    assert "ctxwarden" not in wire
    with_meta = ctxwarden.messages_to_openai([m], with_meta=True)[0]
    back = message_from_openai(with_meta)
    assert (back.id, back.pinned, back.priority) == ("x1", True, "high")


def test_tool_result_kind_is_detected() -> None:
    assert Message.tool('{"a": [1, 2]}', "c").kind == "json"
    trace = 'Traceback (most recent call last):\n  File "app.py", line 3, in <module>\nKeyError: 1'
    assert Message.tool(trace, "c").kind == "stack_trace"
    article = "The committee met on Monday. " * 40
    assert Message.tool(article, "c").kind == "article"
    assert Message.tool("ok", "c").kind == "text"


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ([{"content": "no role"}], r"message 0, field 'role': missing role"),
        (
            [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}],
            r"message 1, field 'role'",
        ),
        ([{"role": "tool", "content": "x"}], r"message 0, field 'tool_call_id'"),
        ([{"role": "user", "content": 5}], r"message 0, field 'content'"),
        ([{"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}], r"function.name"),
        (["not an object"], r"message 0: a message must be a JSON object"),
    ],
)
def test_bad_messages_name_index_and_field(raw: list[Any], match: str) -> None:
    with pytest.raises(InvalidMessageError, match=match):
        messages_from_openai(raw)


def test_orphan_tool_result_is_rejected_with_its_index() -> None:
    msgs = messages_from_openai(
        [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c9", "content": "x"}]
    )
    with pytest.raises(
        InvalidMessageError, match=r"message 1, field 'tool_call_id': tool result for call 'c9'"
    ):
        validate_pairing(msgs)
    with pytest.raises(InvalidMessageError, match="has no tool call before it"):
        messages_to_anthropic(msgs)


def test_messages_are_frozen() -> None:
    m = Message.user("x")
    with pytest.raises(AttributeError):
        m.content = "y"  # type: ignore[misc]


def test_a_copy_under_another_id_keeps_what_was_computed_and_nothing_else() -> None:
    """``with_id`` carries the fingerprint and text over (they ignore ids), equal to what
    the copy would compute itself, and copies nothing not yet computed."""
    original = Message.tool('{"rows": [1, 2]}', "call_1", name="lookup", id="x1", meta={"k": 1})
    fresh = original.with_id("m7")
    assert "fingerprint" not in fresh.__dict__  # not computed yet: not copied
    fingerprint, text = original.fingerprint, original.text
    copy = original.with_id("m8")
    assert copy.__dict__["fingerprint"] == fingerprint and copy.__dict__["text"] == text
    assert fresh.fingerprint == fingerprint and fresh.text == text  # computed alike
    assert (copy.id, copy.kind, copy.meta, copy.tool_call_id) == ("m8", "json", {"k": 1}, "call_1")
    assert copy == original.with_id("m8") and copy != original


def test_a_copy_under_another_id_is_the_message_built_with_that_id() -> None:
    """The copy is made without building the message again: every field is the one a
    message built with that id holds, no memo of another kind (a token count, a logged
    text that names the id) comes along, and an id that is no string is refused as at
    construction; an empty one gives the id derived from the content."""
    from dataclasses import fields

    original = Message.tool("x" * 40, "call_1", name="lookup", id="x1", pinned=True)
    original._memo["_ctxwarden_row"] = "names x1"  # a memo that holds the old id
    copy = original.with_id("m3")
    built = Message.tool("x" * 40, "call_1", name="lookup", id="m3", pinned=True)
    assert all(getattr(copy, f.name) == getattr(built, f.name) for f in fields(Message))
    assert copy == built and "_ctxwarden_row" not in copy._memo
    with pytest.raises(InvalidMessageError, match="must be a str"):
        original.with_id(7)  # type: ignore[arg-type]
    assert original.with_id("").id == Message.tool("x" * 40, "call_1", name="lookup").id
