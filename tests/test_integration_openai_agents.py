"""OpenAI Agents SDK: ``CtxwardenSession`` + ``context_filter`` in ``Runner.run``'s real loop.

The model is the SDK's own ``agents.testing.ScriptedModel``; before every tool call it
emits a reasoning item, as reasoning models do, so the test also checks that a
reasoning item always reaches the model next to the item that followed it.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import pytest

pytest.importorskip("agents", reason="needs ctxwarden[openai-agents]")

from agents import Agent, FunctionTool, RunConfig, Runner
from agents.memory import Session
from agents.run import ModelInputData
from agents.testing import ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseReasoningItem
from openai.types.responses.response_reasoning_item import Summary
from test_integration_common import (
    BUDGET,
    MODEL,
    Replay,
    check_audit,
    check_full_history,
    check_model_calls,
    load_replay,
)

from ctxwarden import Message, TokenCounter, pairing_problems
from ctxwarden.integrations._responses import items_from_message
from ctxwarden.integrations.openai_agents import (
    CtxwardenSession,
    context_filter,
    messages_from_items,
)
from ctxwarden.pipeline.carried import split_folded


def _steps(replay: Replay) -> tuple[list[list[Any]], dict[str, str]]:
    """Each step's output items, and which item each reasoning item must precede."""
    outputs: list[list[Any]] = []
    follows: dict[str, str] = {}
    for k, step in enumerate(replay.script()):
        out: list[Any] = []
        if step.calls:
            rs = f"rs_{k}"
            summary = [
                Summary(text=f"Next: {step.calls[0]['function']['name']}.", type="summary_text")
            ]
            out.append(ResponseReasoningItem(id=rs, type="reasoning", summary=summary))
            follows[rs] = f"msg_{k}" if step.text else step.calls[0]["id"]
        if step.text:
            out.append(assistant_message(step.text, item_id=f"msg_{k}"))
        for c in step.calls:
            out.append(
                function_call(c["function"]["name"], c["function"]["arguments"], call_id=c["id"])
            )
        outputs.append(out)
    return outputs, follows


def _tools(replay: Replay) -> list[FunctionTool]:
    def tool(name: str) -> FunctionTool:
        async def invoke(ctx: Any, args: str) -> str:
            return replay.tool_output(name, json.loads(args))

        return FunctionTool(
            name=name,
            description=f"The airline's {name} tool.",
            params_json_schema={"type": "object", "properties": {}, "additionalProperties": True},
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )

    return [tool(n) for n in replay.tool_names]


def _tool_dict(t: FunctionTool) -> dict[str, Any]:
    fn = {"name": t.name, "description": t.description, "parameters": t.params_json_schema}
    return {"type": "function", "function": fn}


def _item_key(item: dict[str, Any]) -> str:
    return str(item.get("call_id") or item.get("id"))


DBS = ["sqlite"]
if os.environ.get("CTXWARDEN_TEST_POSTGRES"):
    DBS.append("postgres")


def _db(kind: str, tmp_path: Any, pg_schema_url: str | None) -> str:
    if kind == "postgres":
        assert pg_schema_url
        return pg_schema_url
    return f"sqlite:///{tmp_path / 'agents.db'}"


@pytest.mark.parametrize("db", DBS)
async def test_tau_bench_replay_through_runner(
    db: str, tmp_path: Any, pg_schema_url: str | None
) -> None:
    replay = load_replay()
    outputs, follows = _steps(replay)
    model = ScriptedModel(outputs)
    tools = _tools(replay)
    agent = Agent(name="airline", instructions=replay.system, model=model, tools=tools)
    ctx = context_filter(model=MODEL, max_input_tokens=BUDGET)
    config = RunConfig(call_model_input_filter=ctx, tracing_disabled=True)
    session = CtxwardenSession(f"tau-{uuid.uuid4().hex}", db=_db(db, tmp_path, pg_schema_url))
    try:
        for user in replay.users:
            await Runner.run(agent, user, session=session, run_config=config, max_turns=100)
        model.assert_complete()
        calls = model.calls
        received = [
            [Message.system(c.system_instructions or ""), *messages_from_items(c.input)]
            for c in calls
        ]
        check_model_calls(replay, received, [_tool_dict(t) for t in calls[0].tools])
        for c in calls:  # the prompt as instructions, not as an input item
            assert c.system_instructions is not None and c.system_instructions.startswith(
                replay.system
            )
            items = [dict(i) for i in c.input]
            for i, item in enumerate(items):
                if item.get("type") == "reasoning":
                    assert i + 1 < len(items) and _item_key(items[i + 1]) == follows[item["id"]]
        assert sum(i.get("type") == "reasoning" for c in calls for i in c.input) > len(calls)
        # the session keeps everything: exactly the items the runner stored
        stored = await session.get_items()
        check_full_history(replay, [Message.system(replay.system), *messages_from_items(stored)])
        assert sum(i.get("type") == "reasoning" for i in stored) == len(follows)
        check_audit(ctx.last_audit)
        assert ctx.last_build is not None and ctx.last_build.audit is ctx.last_audit
    finally:
        session.close()


ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "hi"},
    {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"},
            {"type": "input_file", "file_id": "file_1"},
        ],
    },
    {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"text": "Look it up.", "type": "summary_text"}],
    },
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}
        ],
    },
    {
        "type": "function_call",
        "call_id": "c1",
        "name": "lookup",
        "arguments": '{"q": "x"}',
        "id": "fc_1",
    },
    {
        "type": "function_call",
        "call_id": "c2",
        "name": "lookup",
        "arguments": '{"q": "y"}',
        "id": "fc_2",
    },
    {"type": "function_call_output", "call_id": "c1", "output": "X"},
    {
        "type": "function_call_output",
        "call_id": "c2",
        "output": [{"type": "input_text", "text": "Y"}],
    },
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
    {"role": "developer", "content": "be brief"},
]


def test_items_convert_to_messages_and_back_as_given() -> None:
    messages = messages_from_items(ITEMS)
    assert [m.role for m in messages] == [
        "user",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "system",
    ]
    group = messages[2]  # reasoning, text and both calls: one block with its two results
    assert group.text == "Checking." and [c.id for c in group.tool_calls] == ["c1", "c2"]
    assert [type(p).__name__ for p in messages[1].content or ()] == [
        "TextPart",
        "ImagePart",
        "RawPart",
    ]
    assert [i for m in messages for i in items_from_message(m, m)] == ITEMS
    masked = messages[3].with_content("[masked]")
    assert items_from_message(masked, messages[3]) == [{**ITEMS[6], "output": "[masked]"}]


@pytest.mark.parametrize("db", DBS)
async def test_session_returns_exactly_the_items_it_was_given(
    db: str, tmp_path: Any, pg_schema_url: str | None
) -> None:
    session = CtxwardenSession(f"items-{uuid.uuid4().hex}", db=_db(db, tmp_path, pg_schema_url))
    try:
        assert isinstance(session, Session)  # the SDK's runtime-checkable protocol
        assert await session.get_items() == []
        await session.add_items(ITEMS[:5])  # type: ignore[arg-type]
        await session.add_items(ITEMS[5:])  # type: ignore[arg-type]
        assert await session.get_items() == ITEMS
        assert await session.get_items(limit=2) == ITEMS[-2:]
        assert await session.pop_item() == ITEMS[-1]
        assert await session.get_items() == ITEMS[:-1]
        await session.clear_session()
        assert await session.get_items() == [] and await session.pop_item() is None
        await session.add_items([ITEMS[0]])  # type: ignore[list-item]
        assert await session.get_items() == [ITEMS[0]]
        # nothing is deleted: the store still holds every item ever added
        assert len(list(session._session.messages())) == len(ITEMS) + 1
    finally:
        session.close()


FED_BUDGET = 1600


async def test_output_fed_back_as_history_is_not_stacked() -> None:
    """Each turn runs the agent with what the model saw on the last call: its
    instructions (the layers folded in) and input items, and the answer (the filter's
    output fed back). The layers are recognised and replaced, never stacked (issue 35)."""
    replay = load_replay()
    outputs, _ = _steps(replay)
    model = ScriptedModel(outputs)
    agent = Agent(name="airline", instructions=replay.system, model=model, tools=_tools(replay))
    ctx = context_filter(model=MODEL, max_input_tokens=FED_BUDGET)
    config = RunConfig(call_model_input_filter=ctx, tracing_disabled=True)
    fed: list[Any] = []
    for user in replay.users:
        turn = [*fed, {"role": "user", "content": user}]
        result = await Runner.run(agent, turn, run_config=config, max_turns=100)
        last = model.calls[-1]
        agent = agent.clone(instructions=last.system_instructions)
        fed = [*last.input, *(i.to_input_item() for i in result.new_items[-1:])]
    model.assert_complete()
    counter = TokenCounter.for_model(MODEL)
    tools = [_tool_dict(t) for t in model.calls[0].tools]
    shown = 0
    for k, c in enumerate(model.calls):
        prompt, layers = split_folded(c.system_instructions or "")
        assert prompt == replay.system, k
        assert len({name for name, _ in layers}) == len(layers), k  # each layer once
        shown += bool(layers)
        received = [Message.system(c.system_instructions or ""), *messages_from_items(c.input)]
        assert [m.role for m in received].count("system") == 1, k
        assert counter.count_messages(received, tools).tokens <= FED_BUDGET, k
        assert pairing_problems(received) == [], k
    assert shown > len(model.calls) // 2


def test_a_call_sent_cut_goes_to_the_model_cut() -> None:
    """The build's last resort cuts the newest call's arguments (and its text) when they
    outgrow the budget: the filter gives the model the items as built, each call with
    its arguments as cut and the text as cut, the reasoning item before them as given
    (they went to the model whole before, over the budget the build counted)."""
    heredoc = json.dumps({"command": "cat > big.py <<'EOF'\n" + "x = 1\n" * 2000 + "EOF"})
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [],
                 "encrypted_content": "gAAAAB-opaque"}  # fmt: skip
    text = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Writing it. " * 300,
                         "annotations": []}]}  # fmt: skip
    call = {"type": "function_call", "call_id": "c9", "name": "bash", "arguments": heredoc}
    items = [
        {"role": "user", "content": "Write big.py."},
        reasoning,
        text,
        call,
        {"type": "function_call_output", "call_id": "c9", "output": "written"},
    ]
    data = ModelInputData(input=items, instructions="You are a coding agent.")  # type: ignore[arg-type]
    ctx = context_filter(model=MODEL, max_input_tokens=900)
    out = ctx.build(data)
    sent = [dict(i) for i in out.input]  # type: ignore[call-overload]
    assert reasoning in sent and sent[-1] == items[-1]
    sent_call = next(i for i in sent if i.get("type") == "function_call")
    built_call = next(m for m in ctx.last_build.messages if m.tool_calls).tool_calls[0]  # type: ignore[union-attr]
    assert sent_call["arguments"] == built_call.arguments != heredoc
    assert json.loads(sent_call["arguments"])["command"].startswith("cat > big.py")
    sent_text = next(i for i in sent if i.get("type") == "message" and i.get("role") == "assistant")
    assert len(sent_text["content"][0]["text"]) < len(text["content"][0]["text"])  # type: ignore[index]
    received = [Message.system(out.instructions or ""), *messages_from_items(out.input)]
    assert TokenCounter.for_model(MODEL).count_messages(received).tokens <= 900
