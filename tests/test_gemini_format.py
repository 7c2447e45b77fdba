"""The Gemini wire format: ``contents`` <-> messages, lossless, calls paired with their
responses by id or by name and order, through a build and the session store."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from ctxwarden import Policy, Session, build_context
from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import ImagePart, RawPart
from ctxwarden.formats import message_from_openai, message_to_openai
from ctxwarden.formats.gemini import (
    contents_from_gemini,
    merge_streamed_parts,
    messages_from_gemini,
    messages_to_gemini,
    reply_from_gemini,
)

SYSTEM = {"parts": [{"text": "You are a bot."}, {"text": "Be brief."}], "role": "user"}
SIG = "c2lnbmF0dXJl"
CONTENTS: list[dict[str, Any]] = [
    {"role": "user", "parts": [
        {"text": "hi"}, {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
    ]},
    {"role": "model", "parts": [
        {"text": "thinking...", "thought": True},
        {"functionCall": {"name": "get", "args": {"x": 1}}, "thoughtSignature": SIG},
        {"functionCall": {"name": "get", "args": {"x": 2}}},
        {"executableCode": {"language": "PYTHON", "code": "print(1)"}},
    ]},
    {"role": "user", "parts": [
        {"functionResponse": {"name": "get", "response": {"output": "one"}}},
        {"functionResponse": {"name": "get", "response": {"a": [1, 2], "b": None}}},
    ]},
    {"role": "model", "parts": [{"functionCall": {"id": "c9", "name": "q", "args": {}}}]},
    {"role": "user", "parts": [
        {"text": "note"},
        {"functionResponse": {"id": "c9", "name": "q", "response": {"result": "ok"}}},
        {"futurePart": {"z": [1, 2.5, "ü"]}},
    ]},
    {"role": "user", "parts": [{"text": "again"}]},
    {"role": "model", "parts": [{"text": "done", "thoughtSignature": SIG}]},
]  # fmt: skip


def test_round_trip_is_exact() -> None:
    messages = messages_from_gemini(SYSTEM, CONTENTS)
    system, contents = messages_to_gemini(messages)
    assert system == SYSTEM
    assert json.dumps(contents) == json.dumps(CONTENTS)  # key order too


def test_calls_pair_by_name_and_order_with_stable_synthetic_ids() -> None:
    messages = messages_from_gemini(None, CONTENTS)
    first = messages[1]
    assert [c.id for c in first.tool_calls] == ["gemini-1-0", "gemini-1-1"]
    assert [json.loads(c.arguments) for c in first.tool_calls] == [{"x": 1}, {"x": 2}]
    results = [m for m in messages if m.role == "tool"]
    assert [m.tool_call_id for m in results] == ["gemini-1-0", "gemini-1-1", "c9"]
    assert results[0].content == "one"  # a single-text response is its text
    assert json.loads(str(results[1].content)) == {"a": [1, 2], "b": None}
    # the same contents give the same ids; a reply stored as turn 7 gets its resent ids
    assert messages_from_gemini(None, copy.deepcopy(CONTENTS)) == messages
    reply = reply_from_gemini({"role": "model", "parts": [{"functionCall": {"name": "f"}}]}, 7)
    resent, _ = contents_from_gemini([*CONTENTS, {"role": "model", "parts": [
        {"functionCall": {"name": "f"}}]}], start=7)  # fmt: skip
    assert resent == [reply] and reply.tool_calls[0].id == "gemini-7-0"


def test_parts_are_modelled_where_the_message_model_can_and_raw_otherwise() -> None:
    messages = messages_from_gemini(None, CONTENTS)
    user = messages[0].content
    assert isinstance(user, tuple) and isinstance(user[1], ImagePart)  # counted as an image
    model = messages[1].content
    assert isinstance(model, tuple) and all(isinstance(p, RawPart) for p in model)
    signed = model[1]
    assert isinstance(signed, RawPart) and signed.data["part"]["thoughtSignature"] == SIG


def test_turn_continuations_round_trip_through_the_store(tmp_path: Any) -> None:
    """What ``meta`` holds (response envelopes, joined turns, part order) survives the
    store: read back, the messages still write the same contents."""
    messages = messages_from_gemini(SYSTEM, CONTENTS)
    with Session(f"sqlite:///{tmp_path / 's.db'}", "chat", tenant="acme") as session:
        session.append(messages)
    with Session(f"sqlite:///{tmp_path / 's.db'}", "chat", tenant="acme") as reopened:
        stored = list(reopened.messages())
    assert messages_to_gemini(stored) == (SYSTEM, CONTENTS)
    again = [message_from_openai(message_to_openai(m, with_meta=True)) for m in stored]
    assert messages_to_gemini(again) == (SYSTEM, CONTENTS)


def test_a_built_context_keeps_calls_with_responses_and_signatures() -> None:
    filler = " ".join(f"line {i} of a long log" for i in range(400))
    contents: list[dict[str, Any]] = []
    for turn in range(6):
        contents += [
            {"role": "user", "parts": [{"text": f"question {turn}"}]},
            {"role": "model", "parts": [
                {"functionCall": {"name": "read", "args": {"n": turn}}, "thoughtSignature": SIG}]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "read", "response": {"output": filler}}}]},
            {"role": "model", "parts": [{"text": f"answer {turn}"}]},
        ]  # fmt: skip
    messages = messages_from_gemini({"parts": [{"text": "Agent."}]}, contents)
    built = build_context(messages, model="gemini-2.5-flash", policy=Policy(max_input_tokens=3000))
    assert built.input_tokens <= 3000
    _, sent = messages_to_gemini(built.messages)
    assert len(json.dumps(sent)) < len(json.dumps(contents))  # something was cut
    owed: list[str] = []
    for turn in sent:
        names = [p["functionCall"]["name"] for p in turn["parts"] if "functionCall" in p]
        answered = [p["functionResponse"]["name"] for p in turn["parts"] if "functionResponse" in p]
        if turn["role"] == "model":
            assert not owed
            owed = names
            assert all(p["thoughtSignature"] == SIG for p in turn["parts"] if "functionCall" in p)
        else:
            assert answered == owed[: len(answered)] and (not answered or answered == owed)
            owed = []


def test_messages_from_other_formats_write_valid_gemini() -> None:
    messages = [
        message_from_openai({"role": "system", "content": "S"}),
        message_from_openai({"role": "user", "content": "go"}),
        message_from_openai({"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"k\": 1}"}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
        ]}),
        message_from_openai({"role": "tool", "tool_call_id": "a", "name": "f", "content": "x"}),
        message_from_openai({"role": "tool", "tool_call_id": "b", "name": "g",
                             "content": "{\"ok\": true}"}),
    ]  # fmt: skip
    system, contents = messages_to_gemini(messages)
    assert system == {"parts": [{"text": "S"}]}
    assert contents == [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [
            {"functionCall": {"id": "a", "name": "f", "args": {"k": 1}}},
            {"functionCall": {"id": "b", "name": "g", "args": {}}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"id": "a", "name": "f", "response": {"output": "x"}}},
            {"functionResponse": {"id": "b", "name": "g", "response": {"ok": True}}}]},
    ]  # fmt: skip


def test_a_system_message_after_the_first_turn_is_text_of_the_user_turn_it_meets() -> None:
    """A layer after the task, a recall block after function responses or after a model
    turn: each is sent where it stands, as text of a user turn (``systemInstruction``
    keeps the leading system messages only), and the turns still alternate."""
    from ctxwarden.core.messages import Message

    call = {"functionCall": {"id": "c1", "name": "f", "args": {}}}
    answer = {"functionResponse": {"id": "c1", "name": "f", "response": {"output": "r1"}}}
    sent = [
        {"role": "user", "parts": [{"text": "the task"}]},
        {"role": "model", "parts": [call]},
        {"role": "user", "parts": [answer, {"text": "and now?"}]},
        {"role": "model", "parts": [{"text": "ok"}]},
        {"role": "user", "parts": [{"text": "more?"}]},
    ]
    history = messages_from_gemini({"parts": [{"text": "prompt"}]}, copy.deepcopy(sent))
    task, call_m, result, asked, ok, more = history[1:]
    messages = [
        history[0], Message.system("facts"), task, Message.system("ledger"), call_m, result,
        Message.system("recalled"), asked, ok, Message.system("recalled again"), more,
    ]  # fmt: skip
    system, contents = messages_to_gemini(messages)
    assert system == {"parts": [{"text": "prompt"}, {"text": "facts"}]}
    assert [c["role"] for c in contents] == ["user", "model", "user", "model", "user"]
    assert contents[0]["parts"] == [{"text": "the task"}, {"text": "ledger"}]
    assert contents[2]["parts"] == [answer, {"text": "recalled"}, {"text": "and now?"}]
    assert contents[4]["parts"] == [{"text": "recalled again"}, {"text": "more?"}]


def test_a_result_added_to_a_replied_call_keeps_its_pairing_without_ids() -> None:
    """The proxy's recall rounds answer a reply's call with a plain tool message: a
    synthetic id is not written, so upstream pairs them by name and order as it sent."""
    from ctxwarden.core.messages import Message

    call = {"functionCall": {"name": "ctxwarden_recall", "args": {"handle": "cw:msg:m1"}}}
    reply = reply_from_gemini({"role": "model", "parts": [call]}, 3)
    result = Message.tool("the original", reply.tool_calls[0].id, name="ctxwarden_recall")
    _, contents = messages_to_gemini([reply, result])
    assert contents == [
        {"role": "model", "parts": [call]},
        {"role": "user", "parts": [{"functionResponse": {
            "name": "ctxwarden_recall", "response": {"output": "the original"}}}]},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("contents", "message"),
    [
        ("not a list", "contents must be a list"),
        ([{"role": "system", "parts": []}], "role must be user or model"),
        ([{"role": "user", "parts": "x"}], "parts must be a list of objects"),
        ([{"role": "model", "parts": [{"functionCall": {"args": {}}}]}], "string name"),
        ([{"role": "model", "parts": [{"functionCall": {"name": "f", "args": [1]}}]}],
         "args must be an object"),
        ([{"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]}],
         "no unanswered functionCall"),
    ],
)  # fmt: skip
def test_malformed_contents_are_errors_naming_the_problem(contents: Any, message: str) -> None:
    with pytest.raises(InvalidMessageError, match=message):
        messages_from_gemini(None, contents)


def test_streamed_text_pieces_join_into_one_part() -> None:
    parts = [
        {"text": "Let", "thought": True},
        {"text": " me", "thought": True},
        {"text": "Hel"},
        {"text": "lo", "thoughtSignature": SIG},
        {"functionCall": {"name": "f", "args": {}}},
        {"text": "after"},
    ]
    assert merge_streamed_parts(parts) == [
        {"text": "Let me", "thought": True},
        {"text": "Hello", "thoughtSignature": SIG},
        {"functionCall": {"name": "f", "args": {}}},
        {"text": "after"},
    ]
