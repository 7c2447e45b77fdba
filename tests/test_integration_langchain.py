"""LangChain v1: ``ContextMiddleware`` in ``create_agent``'s real loop (sync and async)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("langchain", reason="needs ctxwarden[langchain]")

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field
from test_integration_common import (
    BUDGET,
    MODEL,
    Replay,
    check_audit,
    check_full_history,
    check_model_calls,
    load_replay,
)

import ctxwarden
from ctxwarden.integrations._common import ContextBuilder, split_system
from ctxwarden.integrations._langchain_messages import convert_history
from ctxwarden.integrations.langchain import (
    ContextMiddleware,
    message_from_langchain,
    message_to_langchain,
)
from ctxwarden.pipeline.carried import layer_name, split_folded


class ScriptedChatModel(BaseChatModel):
    """A chat model that answers with the next scripted message and records its input."""

    script: list[AIMessage]
    received: list[list[BaseMessage]] = Field(default_factory=list)
    tool_defs: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        self.tool_defs[:] = [convert_to_openai_tool(t) for t in tools]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.received.append(list(messages))
        reply = self.script[len(self.received) - 1]
        return ChatResult(generations=[ChatGeneration(message=reply)])


def _scripted(replay: Replay) -> ScriptedChatModel:
    script = [
        AIMessage(
            content=s.text or "",
            tool_calls=[
                {"name": n, "args": a, "id": c["id"]}
                for (n, a), c in zip(s.call_args, s.calls, strict=True)
            ],
            id=f"ai-{uuid.uuid4()}",
        )
        for s in replay.script()
    ]
    return ScriptedChatModel(script=script)


def _tools(replay: Replay) -> list[StructuredTool]:
    def tool(name: str) -> StructuredTool:
        return StructuredTool.from_function(
            func=lambda **args: replay.tool_output(name, args),
            name=name,
            description=f"The airline's {name} tool.",
            args_schema={"type": "object", "properties": {}, "additionalProperties": True},
        )

    return [tool(n) for n in replay.tool_names]


def _run(
    use_async: bool, session: ctxwarden.Session | None = None
) -> tuple[Replay, ScriptedChatModel, ContextMiddleware, list[BaseMessage]]:
    replay = load_replay()
    model = _scripted(replay)
    middleware = ContextMiddleware(model=MODEL, max_input_tokens=BUDGET, session=session)
    agent = create_agent(
        model,
        _tools(replay),
        system_prompt=replay.system,
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "tau"}, "recursion_limit": 200}
    for user in replay.users:
        turn = {"messages": [HumanMessage(user)]}
        if use_async:
            asyncio.run(agent.ainvoke(turn, config))
        else:
            agent.invoke(turn, config)
    state = agent.get_state(config).values["messages"]
    return replay, model, middleware, state


@pytest.mark.parametrize("use_async", [False, True], ids=["invoke", "ainvoke"])
def test_tau_bench_replay_through_create_agent(use_async: bool) -> None:
    replay, model, middleware, state = _run(use_async)
    received = [
        [message_from_langchain(m, index=i) for i, m in enumerate(c)] for c in model.received
    ]
    check_model_calls(replay, received, model.tool_defs)
    for call in model.received:  # the prompt as LangChain's system message, not in messages
        assert isinstance(call[0], SystemMessage)
        assert not any(isinstance(m, SystemMessage) for m in call[1:])
    # the graph state keeps everything, with the system prompt outside it
    check_full_history(
        replay,
        [message_from_langchain(SystemMessage(replay.system))]
        + [message_from_langchain(m, index=i) for i, m in enumerate(state)],
    )
    check_audit(middleware.last_audit)
    assert middleware.last_build is not None
    assert middleware.last_build.audit is middleware.last_audit


def test_a_masked_result_is_a_copy_and_the_state_keeps_the_original() -> None:
    _, model, _, state = _run(False)
    by_id = {m.id: m for m in state}
    copies = same = 0
    for call in model.received:
        for m in call[1:]:
            original = by_id[m.id]  # every message sent is one of the state's (by id)
            if m == original:
                same += 1
                continue
            # a masked or truncated tool result: a shorter copy; the state keeps the original
            assert isinstance(m, ToolMessage) and m.tool_call_id == original.tool_call_id
            assert len(str(m.content)) < len(str(original.content))
            copies += 1
    assert copies and same


def test_with_a_session_every_message_is_stored_once_and_built_from_the_store(
    tmp_path: Any,
) -> None:
    with ctxwarden.Session(f"sqlite:///{tmp_path / 'lc.db'}", "lc-tau") as session:
        replay, model, middleware, state = _run(True, session)
        received = [
            [message_from_langchain(m, index=i) for i, m in enumerate(c)] for c in model.received
        ]
        check_model_calls(replay, received, model.tool_defs)
        stored = list(session.messages())
        # the system prompt and every message but the last reply (stored at the next call)
        assert len(stored) == 1 + len(state) - 1
        assert [m.id for m in stored[1:]] == [m.id for m in state[:-1]]
        assert message_to_langchain(stored[2]).model_dump() == state[1].model_dump()
        check_audit(middleware.last_audit)


def test_with_a_session_a_changed_system_prompt_replaces_the_stored_one(tmp_path: Any) -> None:
    with ctxwarden.Session(f"sqlite:///{tmp_path / 'lc2.db'}", "lc-prompt") as session:
        ctx = ContextMiddleware(model=MODEL, max_input_tokens=BUDGET, session=session)
        replies = [AIMessage("first", id="a1"), AIMessage("second", id="a2")]
        model = ScriptedChatModel(script=replies)
        saver = InMemorySaver()
        config: Any = {"configurable": {"thread_id": "p"}}
        for prompt, text in (("You are terse.", "hi"), ("You are verbose.", "again")):
            agent = create_agent(
                model, [], system_prompt=prompt, middleware=[ctx], checkpointer=saver
            )
            agent.invoke({"messages": [HumanMessage(text)]}, config)
        last = model.received[-1]
        assert last[0].content == "You are verbose."
        assert [type(m).__name__ for m in last] == [
            "SystemMessage",
            "HumanMessage",
            "AIMessage",
            "HumanMessage",
        ]


ROUND_TRIP = [
    SystemMessage("You are terse."),
    HumanMessage(
        [
            {"type": "text", "text": "What is in this picture?"},
            {
                "type": "image_url",
                "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"},
            },
            {"type": "image", "base64": "AAAA", "mime_type": "image/png"},
        ],
        id="h1",
    ),
    AIMessage(
        "Let me look that up.",
        tool_calls=[{"name": "lookup", "args": {"q": "cat", "n": [1, 2]}, "id": "call_1"}],
        id="a1",
        response_metadata={"model_name": "gpt-4o", "finish_reason": "tool_calls"},
        usage_metadata={"input_tokens": 10, "output_tokens": 3, "total_tokens": 13},
    ),
    ToolMessage("a cat", tool_call_id="call_1", name="lookup", id="t1", status="success"),
    AIMessage([{"type": "text", "text": "A cat.", "annotations": []}], id="a2"),
    # Anthropic's chat model: each call a tool_use block and a tool_calls entry
    AIMessage(
        [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "dog"}},
        ],
        tool_calls=[{"name": "lookup", "args": {"q": "dog"}, "id": "toolu_1"}],
        id="a3",
    ),
    AIMessage(
        [{"type": "tool_use", "id": "toolu_2", "name": "lookup", "input": {"q": "owl"}}],
        tool_calls=[{"name": "lookup", "args": {"q": "owl"}, "id": "toolu_2"}],
        id="a4",
    ),
    # LangChain's standard v1 content, and OpenAI's Responses API in responses/v1
    AIMessage(
        content_blocks=[
            {"type": "text", "text": "Checking."},
            {"type": "tool_call", "id": "call_5", "name": "lookup", "args": {"q": "elk"}},
        ],
        id="a5",
        response_metadata={"output_version": "v1"},
    ),
    AIMessage(
        [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_6",
                "name": "lookup",
                "arguments": '{"q":"yak"}',
            },
        ],
        tool_calls=[{"name": "lookup", "args": {"q": "yak"}, "id": "call_6"}],
        id="a6",
        response_metadata={"output_version": "responses/v1"},
    ),
]


@pytest.mark.parametrize("message", ROUND_TRIP, ids=lambda m: m.type)
def test_messages_convert_without_loss(message: BaseMessage) -> None:
    ours = message_from_langchain(message)
    back = message_to_langchain(ours)
    assert type(back) is type(message)
    assert back.model_dump() == message.model_dump()
    json.dumps(ctxwarden.messages_to_openai([ours]))  # ours is a valid wire message too


def test_conversion_keeps_tool_calls_ids_and_parts() -> None:
    human, ai, tool = (message_from_langchain(m) for m in ROUND_TRIP[1:4])
    assert [type(p).__name__ for p in human.content or ()] == ["TextPart", "ImagePart", "RawPart"]
    assert ai.tool_calls == (ctxwarden.ToolCall("call_1", "lookup", '{"q": "cat", "n": [1, 2]}'),)
    assert (tool.role, tool.tool_call_id, tool.id) == ("tool", "call_1", "t1")
    ctxwarden.validate_pairing([human, ai, tool])


FED_BUDGET = 1600


def _head_and_newest(messages: Sequence[ctxwarden.Message]) -> tuple[list[str | None], Any]:
    """The prompt and the layers after it (by name), and the newest message."""
    head, rest = split_system(messages)
    return [head[0].text, *(layer_name(m.text) for m in head[1:])], (rest[-1].role, rest[-1].text)


def test_output_fed_back_as_history_is_not_stacked() -> None:
    """Each turn's history is what the model saw on the last call and its answer (the
    middleware's output fed back), through ``create_agent``'s real loop with the prompt
    in the messages: the layers folded into the prompt are recognised and replaced, never
    stacked (issue 35, item 4): each turn's context has the prompt and layers the full
    history gives (their values may differ: the output's cut results say less than the
    originals, and the window, cut by token counts of random message ids, may too)."""
    replay = load_replay()
    model = _scripted(replay)
    middleware = ContextMiddleware(model=MODEL, max_input_tokens=FED_BUDGET)
    tools = _tools(replay)
    defs = [convert_to_openai_tool(t) for t in tools]
    agent = create_agent(model, tools, middleware=[middleware])
    fed: list[BaseMessage] = [SystemMessage(replay.system)]
    full = list(fed)
    for user in replay.users:
        turn = [HumanMessage(user)]
        built = [
            ContextBuilder(MODEL, FED_BUDGET).build(convert_history(None, [*h, *turn])[0], defs)
            for h in (fed, full)
        ]
        assert _head_and_newest(built[0].messages) == _head_and_newest(built[1].messages)
        result = agent.invoke({"messages": [*fed, *turn]}, {"recursion_limit": 200})
        full = [*full, *turn, *result["messages"][len(fed) + 1 :]]
        fed = [*model.received[-1], result["messages"][-1]]
    assert len(model.received) == len(replay.script())
    assert len(full) == len(replay.trace)  # the full history, rebuilt beside the fed one
    counter = ctxwarden.TokenCounter.for_model(MODEL)
    for k, call in enumerate(model.received):
        ours = [message_from_langchain(m, index=i) for i, m in enumerate(call)]
        # one system message, the prompt first, each layer in it at most once
        assert [m.role for m in ours].count("system") == 1 and ours[0].role == "system", k
        prompt, layers = split_folded(ours[0].text)
        assert prompt == replay.system, k
        assert len({name for name, _ in layers}) == len(layers), k
        assert counter.count_messages(ours, model.tool_defs).tokens <= FED_BUDGET, k
        assert ctxwarden.pairing_problems(ours) == [], k
    carried = [c for c in model.received if "\n\nValues from earlier" in str(c[0].content)]
    assert len(carried) > len(model.received) // 2  # the ledger went on being shown


def test_a_system_prompt_given_back_with_its_layers_is_not_stacked() -> None:
    """An agent made with an earlier call's system message (the layers folded in) as its
    ``system_prompt``: the model gets the prompt once and each layer once."""
    replay = load_replay()
    model = _scripted(replay)
    tools = _tools(replay)
    first = create_agent(model, tools, system_prompt=replay.system, middleware=[
        ContextMiddleware(model=MODEL, max_input_tokens=FED_BUDGET)])  # fmt: skip
    result = first.invoke({"messages": [HumanMessage(u) for u in replay.users[:1]]})
    for user in replay.users[1:3]:
        result = first.invoke({"messages": [*result["messages"], HumanMessage(user)]})
    seen = model.received[-1]
    assert split_folded(str(seen[0].content))[1]  # the layers came folded in the prompt
    again = create_agent(model, tools, system_prompt=str(seen[0].content), middleware=[
        ContextMiddleware(model=MODEL, max_input_tokens=FED_BUDGET)])  # fmt: skip
    before = len(model.received)
    again.invoke(
        {"messages": [*seen[1:], result["messages"][-1], HumanMessage(replay.users[3])]},
        {"recursion_limit": 200},
    )
    for call in model.received[before:]:
        assert sum(isinstance(m, SystemMessage) for m in call) == 1
        prompt, layers = split_folded(str(call[0].content))
        assert prompt == replay.system
        assert len({name for name, _ in layers}) == len(layers)


def test_a_call_sent_cut_goes_back_to_langchain_cut() -> None:
    """The build's last resort cuts the newest call's arguments when they outgrow the
    budget: the AI message given back carries them cut in ``tool_calls`` and in OpenAI's
    raw ``additional_kwargs``, still an object; they went back whole before."""
    from ctxwarden.integrations._langchain_messages import message_back

    heredoc = "cat > big.py <<'EOF'\n" + "x = 1\n" * 2000 + "EOF"
    raw = {"id": "c1", "type": "function",
           "function": {"name": "bash", "arguments": json.dumps({"command": heredoc})}}  # fmt: skip
    call = {"name": "bash", "args": {"command": heredoc}, "id": "c1", "type": "tool_call"}
    ai = AIMessage(
        "Writing it.", tool_calls=[call], additional_kwargs={"tool_calls": [raw]}, id="ai1"
    )
    history = [HumanMessage("Write big.py.", id="h1"), ai,
               ToolMessage("written", tool_call_id="c1", id="t1")]  # fmt: skip
    ours, originals = convert_history(SystemMessage("You are a coding agent."), history)
    built = ctxwarden.build_context(ours, "gpt-4o", 600)
    back = [message_back(m, originals) for m in built.messages]
    sent = next(m for m in back if isinstance(m, AIMessage))
    command = sent.tool_calls[0]["args"]["command"]
    assert command.startswith("cat > big.py <<'EOF'\nx = 1\n") and len(command) < len(heredoc)
    arguments = sent.additional_kwargs["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == sent.tool_calls[0]["args"]
    assert isinstance(back[-1], ToolMessage) and back[-1].content == "written"
    assert ai.tool_calls[0]["args"]["command"] == heredoc  # the state keeps the original


def _bash_tool(outputs: list[str]) -> StructuredTool:
    def bash(command: str) -> str:
        outputs.append(command)
        return "written"

    return StructuredTool.from_function(bash, name="bash", description="Run a shell command.")


@pytest.mark.parametrize("stored", [False, True], ids=["state", "session"])
def test_anthropics_chat_model_through_the_middleware_counts_each_call_once(
    stored: bool, tmp_path: Any
) -> None:
    """``ChatAnthropic`` gives each call twice in its AI message: a ``tool_use`` block of
    the content and an entry of ``tool_calls``. Through ``create_agent`` with the real
    chat model against a local server that speaks Anthropic's Messages API: the build
    counts the call once (as the same message with its call in ``tool_calls`` alone), and
    when the call outgrows the budget its block goes to Anthropic cut, in its place after
    the text, once. Before, the block was a part beside the call: counted twice, the call
    block was dropped from the request whole (the model saw neither its call nor the
    result it asked for). The same with ``session=``: built from the stored messages."""
    pytest.importorskip("langchain_anthropic", reason="needs langchain-anthropic (dev extra)")
    from langchain_anthropic import ChatAnthropic
    from llm_servers import Reply, ScriptedServer

    from ctxwarden.core.tokens.counter import TokenCounter

    heredoc = "cat > big.py <<'EOF'\n" + "x = 1\n" * 2000 + "EOF"
    use = {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": heredoc}}
    first = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
        "content": [{"type": "text", "text": "Writing big.py."}, use],
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }  # fmt: skip
    done = {**first, "id": "msg_2", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "Done."}]}  # fmt: skip
    server = ScriptedServer().start()
    try:
        server.reply(Reply(body=first), Reply(body=done))
        chat = ChatAnthropic(
            model="claude-haiku-4-5", base_url=server.url, api_key="sk-ant-test", max_retries=0
        )  # type: ignore[call-arg]
        session = ctxwarden.Session(f"sqlite:///{tmp_path / 's.db'}", "a1") if stored else None
        middleware = ContextMiddleware(
            model="claude-haiku-4-5", max_input_tokens=800, session=session
        )
        outputs: list[str] = []
        agent = create_agent(chat, [_bash_tool(outputs)], system_prompt="You are a coding agent.",
                             middleware=[middleware])  # fmt: skip
        result = agent.invoke({"messages": [HumanMessage("Write big.py.")]})
        bodies = [r.json for r in server.requests]
    finally:
        server.stop()
    assert outputs == [heredoc]  # the tool ran the call as the model made it
    ai = next(m for m in result["messages"] if isinstance(m, AIMessage) and m.tool_calls)
    assert [b["type"] for b in ai.content] == ["text", "tool_use"]  # type: ignore[index,union-attr]
    assert ai.tool_calls[0]["args"]["command"] == heredoc  # the state keeps the original

    ours = message_from_langchain(ai)
    plain = message_from_langchain(AIMessage("Writing big.py.", tool_calls=ai.tool_calls, id=ai.id))
    counter = TokenCounter.for_model("claude-haiku-4-5")
    assert counter.count_message(ours) == counter.count_message(plain)
    assert message_to_langchain(ours) == ai  # and back without loss

    sent = bodies[1]["messages"][1]
    assert sent["role"] == "assistant"
    assert [b["type"] for b in sent["content"]] == ["text", "tool_use"]
    command = sent["content"][1]["input"]["command"]
    assert command.startswith("cat > big.py <<'EOF'\nx = 1\n") and len(command) < len(heredoc)
    assert bodies[1]["messages"][2]["content"][0]["tool_use_id"] == "toolu_01"
    audit = middleware.last_audit
    assert audit is not None and audit.input_tokens <= 800


@pytest.mark.parametrize(
    ("kind", "block", "key"),
    [
        ("tool_use", {"id": "c1", "name": "bash"}, "input"),
        ("tool_call", {"id": "c1", "name": "bash"}, "args"),
        ("function_call", {"id": "fc_1", "call_id": "c1", "name": "bash"}, "arguments"),
    ],
)
def test_a_call_repeated_in_the_content_is_counted_once_and_goes_back_cut(
    kind: str, block: dict[str, Any], key: str
) -> None:
    """Each content block that repeats a call of ``tool_calls`` (Anthropic's ``tool_use``,
    LangChain's standard ``tool_call``, OpenAI Responses' ``function_call``) is the call
    once: counted as the message without it, and when the build cuts the call's
    arguments the block goes back in its place holding them cut, in its own form."""
    from ctxwarden.core.tokens.counter import TokenCounter
    from ctxwarden.integrations._langchain_messages import message_back

    heredoc = "cat > big.py <<'EOF'\n" + "x = 1\n" * 2000 + "EOF"
    args = {"command": heredoc}
    own = json.dumps(args) if key == "arguments" else args
    content = [{"type": "text", "text": "Writing it."}, {"type": kind, **block, key: own}]
    call = {"name": "bash", "args": args, "id": "c1", "type": "tool_call"}
    ai = AIMessage(content, tool_calls=[call], id="ai1")  # type: ignore[arg-type]
    counter = TokenCounter.for_model("gpt-4o")
    plain = AIMessage("Writing it.", tool_calls=[call], id="ai1")
    assert counter.count_message(message_from_langchain(ai)) == counter.count_message(
        message_from_langchain(plain)
    )
    history = [HumanMessage("Write big.py.", id="h1"), ai,
               ToolMessage("written", tool_call_id="c1", id="t1")]  # fmt: skip
    ours, originals = convert_history(SystemMessage("You are a coding agent."), history)
    built = ctxwarden.build_context(ours, "gpt-4o", 600)
    sent = next(m for m in (message_back(m, originals) for m in built.messages) if m.type == "ai")
    assert isinstance(sent, AIMessage) and len(sent.content) == 2
    back = sent.content[1]
    assert isinstance(back, dict) and back["type"] == kind and back.get("id") == block["id"]
    cut = json.loads(back[key]) if key == "arguments" else back[key]
    assert cut == sent.tool_calls[0]["args"] and len(cut["command"]) < len(heredoc)
    assert ai.content[1][key] == own  # type: ignore[index]  # the state keeps the original
