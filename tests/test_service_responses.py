"""``POST /v1/responses`` through ``ctxwarden serve`` (a process), with the real ``openai``
SDK (``responses.create``, ``responses.stream``) and the OpenAI Agents SDK's default
Responses model as clients, and a scripted upstream speaking the Responses wire format
(JSON and SSE), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
import pytest
from llm_servers import Reply, ScriptedServer, openai_error
from responses_servers import ToolLoopModel, response_events, response_json
from service_harness import ProxyServer, add_tenant, module_db, sid

from ctxwarden import TokenCounter, messages_from_openai, pairing_problems
from ctxwarden.formats.responses import (
    messages_from_responses,
    messages_to_responses,
    tools_as_openai,
)

__all__ = ["module_db"]  # the fixture, re-exported for pytest

MODEL = "gpt-4o"
INSTRUCTIONS = "You are a support agent. Keep order ids exact."
TOOLS = [
    {"type": "function", "name": "lookup", "description": "Find an order.",
     "parameters": {"type": "object", "properties": {"q": {"type": "integer"}}}},
    {"type": "web_search"},
]  # fmt: skip


@dataclass
class Env:
    proxy: ProxyServer
    upstream: ScriptedServer
    model: ToolLoopModel
    key: str
    clients: dict[str, openai.OpenAI] = field(default_factory=dict)

    def client(self) -> openai.OpenAI:
        if "c" not in self.clients:
            url = self.proxy.url + "/v1"
            self.clients["c"] = openai.OpenAI(base_url=url, api_key=self.key, max_retries=0)
        return self.clients["c"]

    def stored(self, session: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The stored session as Responses ``(instructions, input)``."""
        status, body = self.proxy.get(
            f"/v1/sessions/{session}/messages?limit=1000&meta=true", self.key
        )
        assert status == 200, body
        return messages_to_responses(messages_from_openai(body["messages"]))

    def builds(self, session: str) -> list[dict[str, Any]]:
        status, body = self.proxy.get(f"/v1/sessions/{session}/builds", self.key)
        assert status == 200, body
        return list(body["builds"])


@pytest.fixture(scope="module")
def env(module_db: str) -> Iterator[Env]:
    model = ToolLoopModel()
    upstream = ScriptedServer(model).start()
    key = add_tenant(module_db, "acme")
    proxy = ProxyServer(module_db, upstream=upstream.url + "/v1")
    env = Env(proxy, upstream, model, key)
    try:
        yield env
    finally:
        for client in env.clients.values():
            client.close()
        proxy.stop()
        upstream.stop()


@pytest.fixture(autouse=True)
def _fresh_script(env: Env) -> None:
    env.upstream._replies.clear()
    env.model.unknown_output = True


def hdr(session: str, budget: int | None = None) -> dict[str, str]:
    out = {"X-Ctxwarden-Session": session}
    if budget is not None:
        out["X-Ctxwarden-Max-Input-Tokens"] = str(budget)
    return out


def _lookup(arguments: str) -> str:
    q = json.loads(arguments)["q"]
    rows = [{"id": f"ORD-{q}-{i}", "note": "shipped from the north warehouse " * 6}
            for i in range(12)]  # fmt: skip
    return json.dumps({"rows": rows})


def _dump(items: Any) -> list[dict[str, Any]]:
    """Output items as the client sends them back: the SDK's own dump (without the
    ``parsed: None`` its stream helper adds to each text part)."""
    return [i.model_dump(exclude_unset=True, exclude_none=True) for i in items]


def _check_upstream_bodies(env: Env, first: int, budget: int, sent: list[list[Any]]) -> None:
    """Every request upstream got since ``first``: within the budget, every call with its
    output, and every reasoning and unknown item byte for byte as a client sent it."""
    counter = TokenCounter.for_model(MODEL)
    client_items = {json.dumps(i, sort_keys=True) for items in sent for i in items}
    for request in env.upstream.requests[first:]:
        body = request.json
        assert "previous_response_id" not in body
        assert body["instructions"] == INSTRUCTIONS
        assert body["tools"] == TOOLS and body["store"] is False
        items = body["input"]
        messages = messages_from_responses(items, body["instructions"])
        assert pairing_problems(messages) == []
        tools = tools_as_openai(body["tools"])
        assert counter.count_messages(messages, tools=tools).tokens <= budget
        calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
        outputs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
        assert calls == outputs
        for k, item in enumerate(items):
            if item.get("type") in ("reasoning", "x_trace", "x_client_note"):
                assert json.dumps(item, sort_keys=True) in client_items
            if item.get("type") == "reasoning":  # still before the call it came with
                after = [i.get("type") for i in items[k + 1 : k + 4]]
                assert after[0] == "message" and "function_call" in after


def _question(t: int) -> str:
    return f"Turn {t}: where is order ORD-{t}? " + "Please check the warehouse notes. " * 10


def _loop(env: Env, session: str, *, stream: bool, turns: int, budget: int) -> list[Any]:
    """An agent's tool loop through the proxy: per turn a question (with an unknown
    client-side item), the model's call, the tool's output, the model's answer."""
    client = env.client()
    items: list[dict[str, Any]] = []
    sent: list[list[Any]] = []
    final: Any = None
    for t in range(turns):
        items += [{"role": "user", "content": _question(t)},
                  {"type": "x_client_note", "note": f"client-side {t}"}]  # fmt: skip
        while True:
            sent.append(list(items))
            kw: dict[str, Any] = dict(
                model=MODEL, input=items, instructions=INSTRUCTIONS, tools=TOOLS, store=False,
                extra_headers=hdr(session, budget), include=["reasoning.encrypted_content"],
                reasoning={"effort": "low"}, max_output_tokens=500, metadata={"run": "test"},
                parallel_tool_calls=True,
            )  # fmt: skip
            if stream:
                with client.responses.stream(**kw) as events:
                    kinds = {e.type for e in events}
                    final = events.get_final_response()
                assert "response.output_text.delta" in kinds and "response.completed" in kinds
            else:
                final = client.responses.create(**kw)
            items += _dump(final.output)
            calls = [o for o in final.output if o.type == "function_call"]
            if not calls:
                break
            items += [{"type": "function_call_output", "call_id": c.call_id,
                       "output": _lookup(c.arguments)} for c in calls]  # fmt: skip
    sent.append(list(items))
    return [items, sent, final]


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_sdk_tool_loop_is_built_within_budget_and_stored_whole(env: Env, stream: bool) -> None:
    session = sid()
    first = len(env.upstream.requests)
    budget = 1500
    env.model.unknown_output = not stream
    items, sent, final = _loop(env, session, stream=stream, turns=6, budget=budget)
    assert final.output_text.startswith("seen ")
    _check_upstream_bodies(env, first, budget, sent)
    forwarded = env.upstream.requests[first:]
    assert len(forwarded) == 12
    assert all(r.json.get("stream", False) is stream for r in forwarded)
    assert all(r.json["include"] == ["reasoning.encrypted_content"] for r in forwarded)
    assert all(r.json["metadata"] == {"run": "test"} for r in forwarded)
    assert all(r.json["max_output_tokens"] == 500 for r in forwarded)
    # the first call goes whole; later ones were cut to the budget
    assert forwarded[0].json["input"] == sent[0]
    assert len(forwarded[-1].json["input"]) < len(sent[-2])
    # the stored session is the conversation: every item the client sent, then the reply
    instructions, stored = env.stored(session)
    assert instructions == INSTRUCTIONS
    assert stored == items
    builds = env.builds(session)
    assert len(builds) == 12 and {b["status"] for b in builds} == {"complete"}
    _, detail = env.proxy.get(f"/v1/sessions/{session}", env.key)
    assert detail["usage"]["calls"] == 12
    assert detail["usage"]["cached_input_tokens"] == 12 * 40


def test_response_headers_and_whole_history_pass_byte_for_byte(env: Env) -> None:
    session = sid()
    raw = env.client().responses.with_raw_response.create(
        model=MODEL, input="Where is ORD-7?", instructions=INSTRUCTIONS, tools=TOOLS,
        extra_headers=hdr(session),
    )  # fmt: skip
    reply = raw.parse()
    assert reply.output[0].type == "reasoning"
    assert reply.output[0].encrypted_content is not None
    sent = env.upstream.requests[-1]
    assert sent.path == "/v1/responses"
    assert sent.headers["authorization"] == "Bearer sk-upstream-openai"
    assert sent.json["input"] == [{"role": "user", "content": "Where is ORD-7?"}]
    assert sent.json["instructions"] == INSTRUCTIONS
    assert int(raw.headers["x-ctxwarden-input-tokens"]) > 0
    assert len(raw.headers["x-ctxwarden-build-id"]) == 32
    assert raw.headers["x-ctxwarden-session"] == session
    # the next call resends everything: upstream gets exactly the client's items
    items = [{"role": "user", "content": "Where is ORD-7?"}, *_dump(reply.output),
             {"type": "function_call_output", "call_id": reply.output[-1].call_id,
              "output": "shipped"}]  # fmt: skip
    env.client().responses.create(
        model=MODEL, input=items, instructions=INSTRUCTIONS, tools=TOOLS,
        extra_headers=hdr(session),
    )  # fmt: skip
    assert env.upstream.requests[-1].body.count(b"gAAAAB-opaque") == 1
    assert env.upstream.requests[-1].json["input"] == items
    assert len(env.builds(session)) == 2  # the echo matched: no branch


def test_previous_response_id_forwarded_while_whole_then_rebuilt_with_audit(env: Env) -> None:
    session = sid()
    client = env.client()
    long_question = "Where is ORD-9? " + "The customer wrote a long complaint. " * 60
    first = client.responses.create(
        model=MODEL, input=long_question, instructions=INSTRUCTIONS, tools=TOOLS,
        extra_headers=hdr(session),
    )  # fmt: skip
    call = first.output[-1]
    # only the new item and the response it follows: upstream holds the history
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, instructions=INSTRUCTIONS, tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Monday"}],
        extra_headers=hdr(session),
    )  # fmt: skip
    body = env.upstream.requests[-1].json
    assert body["previous_response_id"] == first.id
    assert [i["type"] for i in body["input"]] == ["function_call_output"]
    warnings = env.builds(session)[-1]["audit"]["warnings"]
    assert any("forwarded" in w and first.id in w for w in warnings)
    _, stored = env.stored(session)
    assert [i.get("type", "message") for i in stored][-2:] == ["function_call_output", "message"]
    # a budget that cuts the history: the proxy rebuilds and sends everything it kept
    third = client.responses.create(
        model=MODEL, previous_response_id=second.id, instructions=INSTRUCTIONS, tools=TOOLS,
        input=[{"role": "user", "content": "And ORD-10?"}], extra_headers=hdr(session, 400),
    )  # fmt: skip
    body = env.upstream.requests[-1].json
    assert "previous_response_id" not in body
    assert body["input"][-1] == {"role": "user", "content": "And ORD-10?"}
    assert long_question not in json.dumps(body["input"])
    assert pairing_problems(messages_from_responses(body["input"])) == []
    warnings = env.builds(session)[-1]["audit"]["warnings"]
    assert any("not forwarded" in w and second.id in w for w in warnings)
    # the next one follows a response whose upstream copy was cut: rebuilt again
    client.responses.create(
        model=MODEL, previous_response_id=third.id, instructions=INSTRUCTIONS, tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": third.output[-1].call_id,
                "output": "ok"}], extra_headers=hdr(session),
    )  # fmt: skip
    assert "previous_response_id" not in env.upstream.requests[-1].json
    # a response the proxy never saw goes as sent, and the audit says so
    client.responses.create(
        model=MODEL, previous_response_id="resp_elsewhere", input="hi",
        extra_headers=hdr(sid()),
    )  # fmt: skip
    assert env.upstream.requests[-1].json["previous_response_id"] == "resp_elsewhere"


def test_bad_input_and_upstream_errors_in_openai_shape(env: Env) -> None:
    before = len(env.upstream.requests)
    with pytest.raises(openai.BadRequestError) as err:
        env.client().responses.create(model=MODEL, input=[{"type": "function_call_output"}])
    assert "call_id" in str(err.value) or "input" in str(err.value)
    with pytest.raises(openai.BadRequestError) as err:
        env.client().responses.create(model=MODEL, input=[])
    assert isinstance(err.value.body, dict) and "input" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        env.client().responses.create(
            model=MODEL, input="hi", instructions="Rules. " * 400,
            extra_headers=hdr(sid(), 50),
        )  # fmt: skip
    assert isinstance(err.value.body, dict) and err.value.body["code"] == "context_budget_too_small"
    assert len(env.upstream.requests) == before  # nothing was forwarded
    r = httpx2.post(env.proxy.url + "/v1/responses", json={"model": MODEL, "input": "x"})
    assert r.status_code == 401 and "error" in r.json()
    env.upstream.reply(Reply(429, openai_error("slow down", "rate_limit_error")))
    with pytest.raises(openai.RateLimitError, match="slow down"):
        env.client().responses.create(model=MODEL, input="x", extra_headers=hdr(sid()))


def test_upstream_without_store_and_a_stored_json_reply(env: Env) -> None:
    session = sid()
    text = {"type": "output_text", "text": "plain", "annotations": []}
    output = [{"type": "message", "id": "msg_x", "role": "assistant", "status": "completed",
               "content": [text]}]  # fmt: skip
    env.upstream.reply(Reply(body=response_json(output, rid="resp_x", store=False)))
    env.client().responses.create(model=MODEL, input="q", extra_headers=hdr(session))
    env.client().responses.create(
        model=MODEL, input="q2", previous_response_id="resp_x", extra_headers=hdr(session)
    )
    body = env.upstream.requests[-1].json
    assert "previous_response_id" not in body  # upstream did not keep it: the proxy rebuilds
    assert body["input"] == [{"role": "user", "content": "q"}, *output,
                             {"role": "user", "content": "q2"}]  # fmt: skip


async def test_agents_sdk_runner_with_its_default_responses_model(env: Env) -> None:
    """``Runner.run`` with the Agents SDK's default model (``OpenAIResponsesModel``, the
    SDK's own provider) and a function tool, turn after turn, through the proxy."""
    agents = pytest.importorskip("agents", reason="needs ctxwarden[openai-agents]")
    from agents.models.openai_responses import OpenAIResponsesModel

    env.model.unknown_output = False  # (the SDK refuses an output item type it lacks)
    session = sid()
    budget = 1500
    client = openai.AsyncOpenAI(
        base_url=env.proxy.url + "/v1", api_key=env.key, max_retries=0,
        default_headers=hdr(session, budget),
    )  # fmt: skip
    ran: list[int] = []

    @agents.function_tool
    def lookup(q: int) -> str:
        """Find an order."""
        ran.append(q)
        return _lookup(json.dumps({"q": q}))

    provider = agents.OpenAIProvider(openai_client=client, use_responses=True)
    config = agents.RunConfig(model_provider=provider, tracing_disabled=True)
    agent = agents.Agent(name="support", instructions=INSTRUCTIONS, model=MODEL, tools=[lookup])
    assert isinstance(provider.get_model(MODEL), OpenAIResponsesModel)
    first = len(env.upstream.requests)
    conversation: list[Any] = []
    try:
        for t in range(5):
            conversation.append({"role": "user", "content": _question(t)})
            result = await agents.Runner.run(agent, conversation, run_config=config)
            assert str(result.final_output).startswith("seen ")
            conversation = result.to_input_list()
    finally:
        await client.close()
    assert len(ran) == 5
    forwarded = env.upstream.requests[first:]
    assert len(forwarded) == 10
    counter = TokenCounter.for_model(MODEL)
    produced = {json.dumps(i, sort_keys=True) for r in env.model.responses for i in r["output"]}
    for request in forwarded:
        body = request.json
        assert body["instructions"] == INSTRUCTIONS
        messages = messages_from_responses(body["input"], body["instructions"])
        assert pairing_problems(messages) == []
        tools = tools_as_openai(body["tools"])
        assert counter.count_messages(messages, tools=tools).tokens <= budget
        for item in body["input"]:
            if item.get("type") == "reasoning":  # the model's own, byte for byte
                assert json.dumps(item, sort_keys=True) in produced
    assert len(forwarded[-1].json["input"]) < len(conversation) - 1  # cut to the budget
    instructions, stored = env.stored(session)
    assert instructions == INSTRUCTIONS
    assert stored == conversation


def test_a_failed_stream_passes_through_and_keeps_what_arrived(env: Env) -> None:
    session = sid()
    text = {"type": "output_text", "text": "Half an answer", "annotations": []}
    output = [{"type": "message", "id": "msg_f", "role": "assistant", "status": "completed",
               "content": [text]}]  # fmt: skip
    events = response_events(response_json(output))
    failed = {"type": "response.failed", "sequence_number": 99,
              "response": {**response_json([]), "status": "failed",
                           "error": {"code": "server_error", "message": "boom"}}}  # fmt: skip
    cut = [e for e in events if "output_text.delta" in e or "response.created" in e]
    env.upstream.reply(
        Reply(events=[*cut, f"event: response.failed\ndata: {json.dumps(failed)}\n\n"])
    )
    seen = []
    with env.client().responses.create(
        model=MODEL, input="q", stream=True, extra_headers=hdr(session)
    ) as stream:
        seen = [e.type for e in stream]
    assert seen[0] == "response.created" and seen[-1] == "response.failed"
    assert env.builds(session)[-1]["status"] == "upstream_error"
    _, body = env.proxy.get(f"/v1/sessions/{session}/messages?meta=true", env.key)
    last = body["messages"][-1]
    assert last["content"] == "Half an answer" and last["ctxwarden"]["meta"]["partial"] is True


def test_a_body_with_nan_is_refused_as_on_the_other_routes(env: Env) -> None:
    """NaN is no JSON (the edge's rule on every route): a clear 400, nothing forwarded."""
    body = b'{"model": "gpt-4o", "input": "hi", "metadata": {"score": NaN}}'
    headers = {"authorization": f"Bearer {env.key}", "content-type": "application/json",
               "x-ctxwarden-session": sid()}  # fmt: skip
    sent = len(env.upstream.requests)
    r = httpx2.post(env.proxy.url + "/v1/responses", content=body, headers=headers, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert len(env.upstream.requests) == sent


def _sent_within(env: Env, session: str, items: list[dict[str, Any]], budget: int) -> Any:
    """The input items upstream got for ``items`` sent under ``budget``, which the proxy's
    input-token header says it kept."""
    raw = env.client().responses.with_raw_response.create(
        model=MODEL, input=items, instructions=INSTRUCTIONS, tools=TOOLS,  # type: ignore[arg-type]
        extra_headers=hdr(session, budget=budget),
    )  # fmt: skip
    assert int(raw.headers["x-ctxwarden-input-tokens"]) <= budget
    return env.upstream.requests[-1].json["input"]


def test_a_function_call_too_big_for_the_budget_goes_upstream_cut_beside_its_output(
    env: Env,
) -> None:
    """Codex writing a file through /v1/responses under a tight budget: the newest
    ``function_call`` (a heredoc) outgrows what is left, so its ``arguments`` go upstream
    cut, still a JSON object, beside the ``function_call_output`` it asked for; the
    reasoning item before it passes as received and the store keeps the call whole."""
    session = sid()
    heredoc = "cat > big.py <<'EOF'\n" + "x = 1\n" * 2000 + "EOF"
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [],
                 "encrypted_content": "gAAAAB-opaque-write"}  # fmt: skip
    call = {"type": "function_call", "call_id": "call_big", "name": "shell",
            "arguments": json.dumps({"command": heredoc})}  # fmt: skip
    items = [
        {"role": "user", "content": "Write big.py."},
        reasoning,
        call,
        {"type": "function_call_output", "call_id": "call_big", "output": "written"},
    ]
    sent = _sent_within(env, session, items, 1200)
    assert reasoning in sent
    sent_call = next(i for i in sent if i.get("type") == "function_call")
    assert (sent_call["call_id"], sent_call["name"]) == ("call_big", "shell")
    command = json.loads(sent_call["arguments"])["command"]
    assert command.startswith("cat > big.py <<'EOF'\nx = 1\n") and len(command) < len(heredoc)
    assert sent[-1] == items[-1]  # the output it asked for
    _, stored = env.stored(session)
    assert (
        next(i for i in stored if i.get("type") == "function_call")["arguments"]
        == call["arguments"]
    )


def test_a_custom_tool_call_too_big_for_the_budget_goes_upstream_cut(env: Env) -> None:
    """Codex's ``apply_patch`` is a custom tool: its call carries the patch as ``input``
    text. One too big for the budget goes upstream with that input cut, as the build
    counted it, beside its output (it went whole before, over the budget)."""
    session = sid()
    patch = "*** Begin Patch\n*** Add File: big.py\n" + "+x = 1\n" * 2000 + "*** End Patch"
    call = {"type": "custom_tool_call", "call_id": "call_patch", "name": "apply_patch",
            "input": patch}  # fmt: skip
    items = [
        {"role": "user", "content": "Add big.py."},
        call,
        {"type": "custom_tool_call_output", "call_id": "call_patch", "output": "Done!"},
    ]
    sent = _sent_within(env, session, items, 1200)
    sent_call = next(i for i in sent if i.get("type") == "custom_tool_call")
    assert (sent_call["call_id"], sent_call["name"]) == ("call_patch", "apply_patch")
    assert sent_call["input"].startswith("*** Begin Patch") and len(sent_call["input"]) < len(patch)
    assert sent[-1] == items[-1]
    counter = TokenCounter.for_model(MODEL)
    received = messages_from_responses(sent, INSTRUCTIONS)
    assert counter.count_messages(received).tokens <= 1200
