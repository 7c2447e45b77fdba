"""pydantic-ai 2.x: ``ContextCapability`` (and ``history_processor`` in ``ProcessHistory``)
in ``Agent.run``'s real loop, with pydantic-ai's own ``FunctionModel``."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="needs ctxwarden[pydantic-ai]")

from pydantic_ai import Agent, Tool
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    CompactionPart,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
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
from ctxwarden.integrations.pydantic_ai import (
    ContextCapability,
    history_processor,
    messages_from_pydantic,
)
from ctxwarden.pipeline.carried import layer_name


def _model(
    replay: Replay, received: list[list[ModelMessage]], infos: list[AgentInfo]
) -> FunctionModel:
    script = replay.script()

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        received.append(list(messages))
        infos.append(info)
        step = script[len(received) - 1]
        parts: list[Any] = [TextPart(step.text)] if step.text else []
        parts += [
            ToolCallPart(name, args, tool_call_id=c["id"])
            for (name, args), c in zip(step.call_args, step.calls, strict=True)
        ]
        return ModelResponse(parts=parts)

    return FunctionModel(respond)


def _tools(replay: Replay) -> list[Tool[Any]]:
    def tool(name: str) -> Tool[Any]:
        def call(**args: Any) -> str:
            return replay.tool_output(name, args)

        schema = {"type": "object", "properties": {}, "additionalProperties": True}
        return Tool.from_schema(
            call, name=name, description=f"The airline's {name} tool.", json_schema=schema
        )

    return [tool(n) for n in replay.tool_names]


def _tool_dicts(info: AgentInfo) -> list[dict[str, Any]]:
    fn = [
        {"name": t.name, "description": t.description or "", "parameters": t.parameters_json_schema}
        for t in [*info.function_tools, *info.output_tools]
    ]
    return [{"type": "function", "function": f} for f in fn]


def _ours(messages: list[ModelMessage]) -> list[Message]:
    return messages_from_pydantic(messages).messages


async def _replay(
    capability: Any, prompt: str = "system_prompt"
) -> tuple[Replay, list[list[ModelMessage]], list[AgentInfo], list[ModelMessage]]:
    replay = load_replay()
    received: list[list[ModelMessage]] = []
    infos: list[AgentInfo] = []
    agent = Agent(
        _model(replay, received, infos),
        tools=_tools(replay),
        capabilities=[capability],
        **{prompt: replay.system},
    )
    history: list[ModelMessage] = []
    for user in replay.users:
        result = await agent.run(user, message_history=history)
        history = result.all_messages()
    return replay, received, infos, history


async def test_tau_bench_replay_through_agent_run() -> None:
    ctx = ContextCapability(model=MODEL, max_input_tokens=BUDGET)
    replay, received, infos, history = await _replay(ctx)
    check_model_calls(replay, [_ours(r) for r in received], _tool_dicts(infos[0]))
    for messages in received:  # the system prompt first, as pydantic-ai sends it
        first = messages[0]
        assert isinstance(first, ModelRequest) and isinstance(first.parts[0], SystemPromptPart)
        assert first.parts[0].content == replay.system
    check_full_history(replay, _ours(history))  # the run's history keeps everything
    check_audit(ctx.last_audit)
    assert ctx.last_build is not None and ctx.last_build.audit is ctx.last_audit
    # what was sent is the run's own objects, or copies of its requests with fewer/cut parts
    kept = {id(m) for m in history}
    copies = [m for r in received for m in r if id(m) not in kept]
    assert copies and all(isinstance(m, ModelRequest) for m in copies)


async def test_instructions_count_as_the_system_prompt() -> None:
    ctx = ContextCapability(model=MODEL, max_input_tokens=BUDGET)
    replay, received, infos, history = await _replay(ctx, prompt="instructions")
    # pydantic-ai strips the instructions' trailing whitespace
    assert all(info.instructions == replay.system.strip() for info in infos)
    sent = [
        [Message.system(i.instructions or ""), *_ours(r)]
        for r, i in zip(received, infos, strict=True)
    ]
    check_model_calls(replay, sent, _tool_dicts(infos[0]))
    check_full_history(replay, [Message.system(replay.system), *_ours(history)])
    check_audit(ctx.last_audit)
    assert ctx.last_build is not None
    assert ctx.last_build.messages[0].text == replay.system.strip()


async def test_history_processor_in_process_history() -> None:
    tools = [t.tool_def for t in _tools(load_replay())]  # a plain processor cannot see them
    processor = history_processor(model=MODEL, max_input_tokens=BUDGET, tools=tools)
    audits: list[Any] = []

    def process(messages: list[ModelMessage]) -> list[ModelMessage]:
        out = processor(messages)
        audits.append(processor.last_audit)
        return out

    replay, received, infos, _ = await _replay(ProcessHistory(process))
    check_model_calls(replay, [_ours(r) for r in received], _tool_dicts(infos[0]))
    # ProcessHistory keeps what the processor returned as the run's history (pydantic-ai
    # >= 2.68 carries it into later runs too), so a late call may have nothing left to cut:
    # every call fits, and the calls that had too much were cut.
    assert len(audits) == len(received)
    assert all(a.input_tokens <= BUDGET for a in audits)
    cut = [a for a in audits if {x.action for x in a.actions} & {"masked", "dropped", "truncated"}]
    assert cut, "no call was cut"
    check_audit(cut[0])


FED_BUDGET = 1600


def _system_texts(messages: list[ModelMessage]) -> list[str]:
    return [m.text for m in _ours(messages) if m.role == "system"]


async def test_history_processor_fed_its_own_output_runs_to_the_end() -> None:
    """pydantic-ai keeps what the plain processor returned as the run's history, so every
    call feeds ctxwarden's layers back in: they are recognised and replaced, never
    stacked (issue 35: 7 system messages and a BudgetError at 1,600 tokens before)."""
    tools = [t.tool_def for t in _tools(load_replay())]
    processor = history_processor(model=MODEL, max_input_tokens=FED_BUDGET, tools=tools)
    audits: list[Any] = []
    again: list[tuple[list[str], list[str]]] = []

    def process(messages: list[ModelMessage]) -> list[ModelMessage]:
        out = processor(messages)
        audits.append(processor.last_audit)
        # built again (a fresh processor: no remembered build), the output is itself
        fresh = history_processor(model=MODEL, max_input_tokens=FED_BUDGET, tools=tools)
        again.append(([m.text for m in _ours(out)], [m.text for m in _ours(fresh(out))]))
        return out

    replay, received, infos, _ = await _replay(ProcessHistory(process))
    assert len(received) == len(replay.script()) == 31  # the run went to its end
    assert all(a.input_tokens <= FED_BUDGET for a in audits)
    assert any(m.role == "system" and m.text.startswith("Values") for m in _ours(received[-1]))
    assert all(first == second for first, second in again)
    # the original: the same run through the non-destructive capability
    original = ContextCapability(model=MODEL, max_input_tokens=FED_BUDGET)
    _, sent, _, _ = await _replay(original)
    counter = TokenCounter.for_model(MODEL)
    for k, (fed, orig) in enumerate(zip(received, sent, strict=True)):
        systems = _system_texts(fed)
        assert len(systems) <= len(_system_texts(orig)), k
        assert systems[0] == replay.system, k
        names = [layer_name(t) for t in systems[1:]]
        assert None not in names and len(set(names)) == len(names), k  # each layer once
        ours = _ours(fed)
        assert pairing_problems(ours) == [], k
        assert counter.count_messages(ours, _tool_dicts(infos[k])).tokens <= FED_BUDGET, k


def test_conversion_keeps_parts_ids_and_compaction() -> None:
    history: list[ModelMessage] = [
        ModelRequest(
            parts=[
                SystemPromptPart("be brief"),
                UserPromptPart(["look", ImageUrl("https://x/y.png")]),
            ]
        ),
        ModelResponse(parts=[CompactionPart(content="earlier: the user is Ann"), TextPart("ok")]),
        ModelResponse(
            parts=[TextPart("checking"), ToolCallPart("lookup", {"q": "x"}, tool_call_id="c1")]
        ),
        ModelRequest(
            parts=[ToolReturnPart("lookup", "X", tool_call_id="c1"), UserPromptPart("thanks")]
        ),
    ]
    conv = messages_from_pydantic(history)
    roles = [m.role for m in conv.messages]
    assert roles == ["system", "user", "assistant", "assistant", "tool", "user"]
    assert [type(p).__name__ for p in conv.messages[1].content or ()] == ["TextPart", "ImagePart"]
    assert conv.messages[2].pinned  # a compaction is always sent, unchanged
    assert conv.messages[3].tool_calls[0].id == "c1" and conv.messages[4].tool_call_id == "c1"
    assert conv.messages[4].text == "X"
    # unchanged, the history goes back as the very objects
    processor = history_processor(model=MODEL, max_input_tokens=BUDGET)
    out = processor(history)
    assert all(a is b for a, b in zip(out, history, strict=True))


def test_a_compaction_survives_a_tight_budget_unchanged() -> None:
    compaction = ModelResponse(parts=[CompactionPart(content="earlier: user Ann, booking JG7FMM")])
    history: list[ModelMessage] = [
        ModelRequest(parts=[SystemPromptPart("be brief"), UserPromptPart("hello")]),
        compaction,
    ]
    for i in range(40):
        history.append(
            ModelResponse(parts=[ToolCallPart("lookup", {"i": i}, tool_call_id=f"c{i}")])
        )
        history.append(
            ModelRequest(
                parts=[ToolReturnPart("lookup", f"result {i} " * 80, tool_call_id=f"c{i}")]
            )
        )
    history.append(ModelRequest(parts=[UserPromptPart("and now?")]))
    processor = history_processor(model=MODEL, max_input_tokens=1500)
    out = processor(history)
    assert any(m is compaction for m in out)
    assert len(out) < len(history) and {a.action for a in processor.last_audit.actions} & {
        "dropped",
        "masked",
    }
    ours = _ours(out)
    assert ours[0].text == "be brief" and pairing_problems(ours) == []


@pytest.mark.parametrize("as_dict", [True, False])
def test_a_call_sent_cut_goes_to_the_model_cut(as_dict: bool) -> None:
    """The build's last resort cuts the newest call's text and arguments when they
    outgrow the budget: the processor gives the model that response with its text part
    and its call's arguments as cut (in the form they came in: a dict or a JSON string),
    beside the result; it gave back the original parts before, over the budget."""
    heredoc = "cat > big.py <<'EOF'\n" + "x = 1\n" * 2000 + "EOF"
    args: Any = {"command": heredoc} if as_dict else json.dumps({"command": heredoc})
    prose = "I will write the file now. " * 200
    history: list[ModelMessage] = [
        ModelRequest(
            parts=[SystemPromptPart("You are a coding agent."), UserPromptPart("Write it")]
        ),
        ModelResponse(parts=[TextPart(prose), ToolCallPart("bash", args, tool_call_id="c1")]),
        ModelRequest(parts=[ToolReturnPart("bash", "written", tool_call_id="c1")]),
    ]
    processor = history_processor(model=MODEL, max_input_tokens=700)
    out = processor(history)
    response = next(m for m in out if isinstance(m, ModelResponse))
    text, call = response.parts
    assert isinstance(text, TextPart) and isinstance(call, ToolCallPart)
    assert text.content.startswith("I will write the file now.") and len(text.content) < len(prose)
    assert isinstance(call.args, dict if as_dict else str)
    command = call.args_as_dict()["command"]
    assert command.startswith("cat > big.py <<'EOF'\nx = 1\n") and len(command) < len(heredoc)
    assert TokenCounter.for_model(MODEL).count_messages(_ours(out)).tokens <= 700
    assert history[1].parts[1].args == args  # the history keeps the original
