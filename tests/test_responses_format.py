"""The Responses API items <-> our messages (:mod:`ctxwarden.formats.responses`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctxwarden import build_context, pairing_problems
from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import ImagePart, RawPart, TextPart
from ctxwarden.formats.responses import (
    instructions_message,
    message_items,
    messages_from_responses,
    messages_to_responses,
    reply_from_output,
    tools_as_openai,
)

REASONING = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB=="}
ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "hi"},
    {"type": "x_client_note", "note": "rides with the user turn"},
    {"type": "message", "role": "developer",
     "content": [{"type": "input_text", "text": "be nice"}]},
    REASONING,
    {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "lookup",
     "arguments": '{"a":1}', "status": "completed"},
    {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "lookup", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "res1"},
    {"type": "x_unknown_between", "x": 1},
    {"type": "function_call_output", "call_id": "c2",
     "output": [{"type": "input_text", "text": "r2"}]},
    {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "done", "annotations": []}]},
    {"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
    {"role": "user", "content": [{"type": "input_text", "text": "q"},
                                 {"type": "input_image", "image_url": "data:image/png;base64,AA"}]},
]  # fmt: skip


def test_items_map_to_messages_and_back_byte_for_byte() -> None:
    messages = messages_from_responses(ITEMS, "Be exact.")
    assert [m.role for m in messages] == [
        "system", "user", "system", "assistant", "tool", "tool", "assistant", "user",
    ]  # fmt: skip
    assert messages[1].content == (TextPart("hi"), RawPart(ITEMS[1]))  # in the user's turn
    calls = messages[3]  # reasoning and both calls: one block with the two outputs
    assert calls.content == (RawPart(REASONING),) and [c.id for c in calls.tool_calls] == [
        "c1",
        "c2",
    ]
    assert messages[5].text == "r2" and messages[6].text == "done"
    assert isinstance((messages[7].content or ())[1], ImagePart)
    assert pairing_problems(messages) == []
    instructions, items = messages_to_responses(messages)
    assert instructions == "Be exact." and items == ITEMS
    assert json.dumps(items) == json.dumps(ITEMS)  # key order too


def test_a_string_input_and_an_unknown_first_item() -> None:
    messages = messages_from_responses("hello")
    assert [(m.role, m.content) for m in messages] == [("user", "hello")]
    assert messages_to_responses(messages) == (None, [{"role": "user", "content": "hello"}])
    odd = [{"type": "item_reference", "id": "msg_0"}, {"role": "user", "content": "next"}]
    messages = messages_from_responses(odd)
    assert messages[0].role == "user" and messages[0].content == (RawPart(odd[0]),)
    assert messages_to_responses(messages)[1] == odd


def test_a_changed_tool_result_keeps_its_item_and_what_rode_with_it() -> None:
    messages = messages_from_responses(ITEMS)
    masked = messages[3].with_content("[masked]")
    assert message_items(masked) == [{**ITEMS[6], "output": "[masked]"}, ITEMS[7]]
    shorter = (TextPart("done, shorter"), RawPart(ITEMS[10]), RawPart(ITEMS[11]))
    answer = messages[5].with_content(shorter)
    assert message_items(answer) == [
        {**ITEMS[9], "content": [{"type": "output_text", "text": "done, shorter",
                                  "annotations": []}]},
        ITEMS[10],
        ITEMS[11],
    ]  # fmt: skip
    user = messages[0].with_content((TextPart("hi, shorter"), RawPart(ITEMS[1])))
    assert message_items(user) == [{"role": "user", "content": "hi, shorter"}, ITEMS[1]]
    assert message_items(messages[0].with_content("cut")) == [{"role": "user", "content": "cut"}]
    assert message_items(messages[5].with_content("cut")) == [  # its raw parts gone too
        {**ITEMS[9], "content": [{"type": "output_text", "text": "cut", "annotations": []}]}
    ]


def test_a_build_under_budget_keeps_reasoning_with_its_calls() -> None:
    items: list[dict[str, Any]] = []
    for t in range(30):
        items += [
            {"role": "user", "content": f"turn {t} " + "words " * 40},
            {**REASONING, "id": f"rs_{t}", "encrypted_content": f"enc-{t}"},
            {"type": "function_call", "call_id": f"c{t}", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{t}", "output": "out " * 200},
        ]
    built = build_context(messages_from_responses(items, "sys"), model="gpt-4o",
                          max_input_tokens=2000)  # fmt: skip
    assert pairing_problems(built.messages) == []
    _, sent = messages_to_responses(built.messages)
    for k, item in enumerate(sent):
        if item.get("type") == "reasoning":
            assert item in items and sent[k + 1]["type"] == "function_call"
            assert sent[k + 1]["call_id"] == "c" + item["id"].removeprefix("rs_")


def test_the_reply_is_one_assistant_message_with_its_response() -> None:
    output = [REASONING, {"type": "function_call", "call_id": "c9", "name": "f", "arguments": "{}"}]
    reply = reply_from_output(output, {"id": "resp_1", "store": True})
    assert reply is not None and reply.role == "assistant"
    assert reply.meta["responses"]["response"] == {"id": "resp_1", "store": True}
    assert message_items(reply) == output
    assert reply_from_output([]) is None


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "needs a call_id"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "needs a call_id"),
        ({"input": ["text"]}, "must be an object"),
        ({"input": [{"role": "robot", "content": "x"}]}, "role"),
        ({"input": {"role": "user"}}, "input must be a string or a list"),
        ({"input": "x", "instructions": ["no"]}, "instructions must be a string"),
    ],
)
def test_malformed_input_names_the_problem(given: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidMessageError, match=says):
        messages_from_responses(given["input"], given.get("instructions"))


def test_function_tools_are_counted_in_chat_shape() -> None:
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}},
             {"type": "web_search"}]  # fmt: skip
    assert tools_as_openai(tools) == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]


def test_the_routes_memo_converts_as_a_fresh_conversion_does() -> None:
    """:class:`ItemsMemo` reuses the last call's messages for the items a client resent
    and converts the rest: the same messages and keys as converting everything, whether
    the new items continue the last turn, follow it, or an earlier item was edited."""
    from ctxwarden.service.history import message_key
    from ctxwarden.service.responses_memo import ItemsMemo

    memo = ItemsMemo()

    def check(items: list[dict[str, Any]]) -> list[Any]:
        got, keys = memo.convert("scope", [json.loads(json.dumps(i)) for i in items], 100)
        want = messages_from_responses(items)
        assert got == want and keys == [message_key(m) for m in want]
        return got

    first = check(ITEMS[:5])  # ends inside a run of model-side items
    second = check(ITEMS[:9])  # the run goes on, then outputs
    assert second[:2] == first[:2] and second[0] is first[0]  # reused, not converted
    check(ITEMS)
    edited = [*ITEMS[:6], {**ITEMS[6], "output": "edited"}, *ITEMS[7:]]
    check(edited)
    check(ITEMS[:3])  # a shorter history


def test_the_routes_memo_keeps_the_instructions_message_of_its_text() -> None:
    """:meth:`ItemsMemo.instructions` gives the system message and key a fresh
    conversion gives, the last call's objects for the same text, new ones for another
    text or scope; a text that is no string is refused as without the memo."""
    from ctxwarden.service.history import message_key
    from ctxwarden.service.responses_memo import ItemsMemo

    memo = ItemsMemo(scopes=2, max_bytes=2 * 40)
    for text in ("Be brief.", "Be brief!", "x" * 41):  # (the last one too long to keep)
        first, key = memo.instructions("a", text)
        want = instructions_message(text)
        assert first == want and first.meta == want.meta and key == message_key(want)
        again, again_key = memo.instructions("a", "".join(list(text)))  # equal, not identical
        assert (again is first) == (len(text) <= 40) and again_key == key
    kept_b = memo.instructions("b", "Be brief.")[0]
    assert memo.instructions("a", "Be brief.")[0] is not kept_b  # scopes apart
    memo.instructions("c", "Be brief.")  # two scopes kept: "b" (used longest ago) goes
    assert memo.instructions("b", "Be brief.")[0] is not kept_b
    with pytest.raises(InvalidMessageError):
        memo.instructions("a", ["not", "a", "string"])
