"""``ctxwarden serve`` with the real ``anthropic`` SDK as client and a local upstream
speaking the Messages API (JSON and SSE with ``event:`` lines), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx2
import pytest
from llm_servers import Recorded, Reply, ScriptedServer, anthropic_error, anthropic_message
from service_harness import ProxyServer, add_tenant, anthropic_rich_stream, cli, module_db, sid

from ctxwarden.memory.entity_ledger import DEFAULT_HEADER

__all__ = ["module_db"]

MODEL = "claude-sonnet-4-5"


def fake_model(request: Recorded) -> Reply:
    body = request.json
    if body.get("stream"):
        return Reply(events=anthropic_rich_stream(text=f"seen {len(body['messages'])}", tool=None))
    return Reply(body=anthropic_message(f"seen {len(body['messages'])}", input_tokens=20))


@dataclass
class Env:
    proxy: ProxyServer
    upstream: ScriptedServer
    key: str
    clients: dict[str, anthropic.Anthropic] = field(default_factory=dict)

    def client(self, key: str | None = None) -> anthropic.Anthropic:
        key = key or self.key
        if key not in self.clients:
            self.clients[key] = anthropic.Anthropic(
                base_url=self.proxy.url, api_key=key, max_retries=0
            )
        return self.clients[key]

    def stored(self, session: str, **q: str) -> list[dict[str, Any]]:
        query = "&".join(f"{k}={v}" for k, v in q.items())
        status, body = self.proxy.get(f"/v1/sessions/{session}/messages?{query}", self.key)
        assert status == 200, body
        return list(body["messages"])


@pytest.fixture(scope="module")
def env(module_db: str) -> Iterator[Env]:
    upstream = ScriptedServer(fake_model).start()
    key = add_tenant(module_db, "acme")
    proxy = ProxyServer(module_db, anthropic_upstream=upstream.url)
    env = Env(proxy, upstream, key)
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


def hdr(session: str) -> dict[str, str]:
    return {"X-Ctxwarden-Session": session}


def test_json_call_places_cache_breakpoints_and_stores_the_reply(env: Env) -> None:
    session = sid()
    msg = env.client().messages.create(
        model=MODEL, max_tokens=64, system="Be brief.",
        messages=[{"role": "user", "content": "Hi"}], extra_headers=hdr(session),
    )  # fmt: skip
    assert msg.content[0].text == "seen 1"  # type: ignore[union-attr]
    sent = env.upstream.requests[-1]
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == "sk-upstream-anthropic"
    assert sent.headers["anthropic-version"]
    assert sent.json["system"][0]["text"] == "Be brief."
    assert sent.json["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert sent.json["max_tokens"] == 64
    assert env.stored(session) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "seen 1"},
    ]


def test_stream_bytes_pass_through_with_event_lines(env: Env) -> None:
    events = anthropic_rich_stream(
        text="hello world", tool=("tu_1", "lookup", {"q": "x"}), thinking="hmm"
    )
    env.upstream.reply(Reply(events=events))
    body = {"model": MODEL, "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": "go"}]}  # fmt: skip
    with httpx2.stream(
        "POST", env.proxy.url + "/v1/messages", json=body,
        headers={"x-api-key": env.key, **hdr(sid())},
    ) as r:  # fmt: skip
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        received = b"".join(r.iter_bytes())
    assert received == "".join(events).encode()  # ping, thinking, signature, all of it


def test_stream_through_the_sdk_merges_usage_and_stores_tool_use(env: Env) -> None:
    session = sid()
    tool = ("tu_9", "lookup", {"id": 9})
    env.upstream.reply(
        Reply(events=anthropic_rich_stream(text="Looking.", tool=tool, thinking="p"))
    )
    history: list[dict[str, Any]] = [{"role": "user", "content": "find 9"}]
    with env.client().messages.stream(
        model=MODEL, max_tokens=64, messages=history, extra_headers=hdr(session),
        tools=[{"name": "lookup", "input_schema": {"type": "object"}}],
    ) as stream:  # fmt: skip
        final = stream.get_final_message()
    kinds = [b.type for b in final.content]
    assert kinds == ["thinking", "text", "tool_use"]
    assert final.content[1].text == "Looking."  # type: ignore[union-attr]
    assert final.content[2].input == {"id": 9}  # type: ignore[union-attr]
    stored = env.stored(session)
    assert stored[-1]["tool_calls"][0]["id"] == "tu_9"
    assert json.loads(stored[-1]["tool_calls"][0]["function"]["arguments"]) == {"id": 9}
    _, detail = env.proxy.get(f"/v1/sessions/{session}", env.key)
    # message_start: 120 input + 40 cache read + 10 cache write; message_delta: 33 output
    assert detail["usage"] == {
        "input_tokens": 170,
        "output_tokens": 33,
        "cached_input_tokens": 40,
        "cache_write_tokens": 10,
        "calls": 1,
    }

    # the agent echoes the reply and answers the tool: no branch, pairs kept
    history += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "tu_9", "content": "ok"}],
        },
    ]
    raw = env.client().messages.with_raw_response.create(
        model=MODEL, max_tokens=64, messages=history, extra_headers=hdr(session)
    )
    assert raw.headers["x-ctxwarden-session"] == session
    sent = env.upstream.requests[-1].json["messages"]
    uses = [b["id"] for t in sent for b in t["content"] if b.get("type") == "tool_use"]
    results = [
        b["tool_use_id"] for t in sent for b in t["content"] if b.get("type") == "tool_result"
    ]
    assert uses == results == ["tu_9"]
    assert [m["role"] for m in env.stored(session)] == ["user", "assistant", "tool", "assistant"]


def test_mid_stream_error_event_reaches_the_sdk_and_the_partial_is_marked(env: Env) -> None:
    session = sid()
    env.upstream.reply(Reply(events=anthropic_rich_stream(text="abcdef", tool=None, error=True)))
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"), env.client().messages.stream(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "x"}],
        extra_headers=hdr(session),
    ) as stream:  # fmt: skip
        for _ in stream:
            pass
    # the proxy stores what it got once upstream closed: wait for the build row to say so
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _, builds = env.proxy.get(f"/v1/sessions/{session}/builds", env.key)
        if builds["builds"][-1]["status"] != "forwarded":
            break
        time.sleep(0.05)
    assert builds["builds"][-1]["status"] == "upstream_error"
    last = env.stored(session, meta="true")[-1]
    assert last["content"] == "abc" and last["ctxwarden"]["meta"]["partial"] is True


def test_errors_use_the_anthropic_shape(env: Env) -> None:
    with pytest.raises(anthropic.AuthenticationError) as err:
        env.client(key="cwk_wrong").messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.body["type"] == "error"  # type: ignore[index]
    env.upstream.reply(Reply(529, anthropic_error("busy", "overloaded_error")))
    with pytest.raises(anthropic.APIStatusError, match="busy") as over:
        env.client().messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}],
            extra_headers=hdr(sid()),
        )  # fmt: skip
    assert over.value.status_code == 529
    with pytest.raises(anthropic.BadRequestError, match=r"at least|budget"):
        env.client().messages.create(
            model=MODEL, max_tokens=8, system="Rules. " * 300,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={**hdr(sid()), "X-Ctxwarden-Max-Input-Tokens": "20"},
        )  # fmt: skip


def test_openai_routes_without_an_openai_upstream_say_so(env: Env) -> None:
    r = httpx2.post(
        env.proxy.url + "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]},
        headers={"authorization": f"Bearer {env.key}"},
    )
    assert r.status_code == 404 and "--upstream" in r.json()["error"]["message"]
    models = httpx2.get(env.proxy.url + "/v1/models", headers={"x-api-key": env.key}).json()
    assert MODEL in {m["id"] for m in models["data"]}


THOUGHT = "The user wants record 9; the lookup tool has it. " * 40
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"


def _thinking_reply(stream: bool) -> Reply:
    """A reply that thinks (a signed block and a redacted one), says a word and calls a tool."""
    tool = ("tu_think", "lookup", {"id": 9})
    if stream:
        events = anthropic_rich_stream(
            text="Looking.", tool=tool, thinking=THOUGHT, redacted="ENCRYPTED=="
        )
        return Reply(events=[e.replace("sig-abc", SIGNATURE) for e in events])
    body = anthropic_message("", stop_reason="tool_use")
    body["content"] = [
        {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
        {"type": "redacted_thinking", "data": "ENCRYPTED=="},
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": tool[0], "name": tool[1], "input": tool[2]},
    ]
    return Reply(body=body)


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_blocks_go_back_upstream_unchanged_in_a_tool_loop(env: Env, stream: bool) -> None:
    """Anthropic requires the assistant turn before a tool_result to carry its thinking
    blocks exactly as received: the proxy stores them and sends them back, in place,
    signature intact, counted in the input tokens."""
    session = sid()
    tools = [{"name": "lookup", "input_schema": {"type": "object"}}]
    history: list[dict[str, Any]] = [{"role": "user", "content": "find 9"}]
    env.upstream.reply(_thinking_reply(stream))
    kw: dict[str, Any] = dict(
        model=MODEL, max_tokens=2048, messages=history, tools=tools, extra_headers=hdr(session),
        thinking={"type": "enabled", "budget_tokens": 1024},
    )  # fmt: skip
    if stream:
        with env.client().messages.stream(**kw) as events:
            final = events.get_final_message()
    else:
        final = env.client().messages.create(**kw)
    assert [b.type for b in final.content] == ["thinking", "redacted_thinking", "text", "tool_use"]
    assert final.content[0].signature == SIGNATURE  # type: ignore[union-attr]

    # the agent loop: the reply as the SDK gave it, then the tool's result
    history += [
        {"role": "assistant", "content": final.content},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "tu_think", "content": "record 9: ok"}]},
    ]  # fmt: skip
    raw = env.client().messages.with_raw_response.create(**{**kw, "messages": history})
    assert raw.headers["x-ctxwarden-session"] == session  # no branch: the echo matched
    sent = env.upstream.requests[-1].json
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    turn = sent["messages"][1]
    assert turn["role"] == "assistant"
    assert turn["content"] == [
        {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
        {"type": "redacted_thinking", "data": "ENCRYPTED=="},
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "tu_think", "name": "lookup", "input": {"id": 9}},
    ]
    assert sent["messages"][2]["content"][0]["tool_use_id"] == "tu_think"
    # counted: the thinking alone is several hundred tokens of what was sent
    assert int(raw.headers["x-ctxwarden-input-tokens"]) > len(THOUGHT.split())

    # a client that drops the thinking of its earlier turns still extends the session
    answer = raw.parse()
    history[1] = {
        "role": "assistant",
        "content": [b for b in final.content if "thinking" not in b.type],
    }
    history += [
        {"role": "assistant", "content": answer.content},
        {"role": "user", "content": "thanks"},
    ]
    again = env.client().messages.with_raw_response.create(**{**kw, "messages": history})
    assert again.headers["x-ctxwarden-session"] == session
    assert [m["role"] for m in env.stored(session)] == [
        "user", "assistant", "tool", "assistant", "user", "assistant"
    ]  # fmt: skip
    # what the store holds goes upstream: the turn as Anthropic sent it
    assert env.upstream.requests[-1].json["messages"][1]["content"][0]["signature"] == SIGNATURE


def test_the_anthropic_sdk_lists_models_in_its_own_shape(env: Env) -> None:
    """``client.models.list()``: the Anthropic upstream's list when it answers (passed
    as sent, with the server's key), else the registry's Claude models in that shape."""
    listed = {"data": [{"type": "model", "id": "claude-x", "display_name": "Claude X",
                        "created_at": "2026-01-01T00:00:00Z"}],
              "has_more": False, "first_id": "claude-x", "last_id": "claude-x"}  # fmt: skip
    env.upstream.reply(Reply(body=listed), Reply(404, anthropic_error("no", "not_found_error")))
    page = env.client().models.list()
    assert [(m.id, m.display_name) for m in page.data] == [("claude-x", "Claude X")]
    asked = env.upstream.requests[-1]
    assert asked.method == "GET" and asked.path == "/v1/models"
    assert asked.headers["x-api-key"] == "sk-upstream-anthropic"
    fallback = env.client().models.list()
    assert MODEL in {m.id for m in fallback.data}
    assert {m.type for m in fallback.data} == {"model"}
    assert not any(m.id.startswith("gpt") for m in fallback.data)


def test_the_anthropic_sdk_retrieves_one_model_in_its_own_shape(env: Env) -> None:
    """``client.models.retrieve``: the Anthropic upstream's model when it answers, else the
    registry's Claude entry; an unknown model is the SDK's NotFoundError."""
    own = {"type": "model", "id": "claude-x", "display_name": "Claude X",
           "created_at": "2026-01-01T00:00:00Z"}  # fmt: skip
    missing = Reply(404, anthropic_error("no", "not_found_error"))
    env.upstream.reply(Reply(body=own), missing, missing)
    got = env.client().models.retrieve("claude-x")
    assert (got.id, got.display_name) == ("claude-x", "Claude X")
    asked = env.upstream.requests[-1]
    assert asked.method == "GET" and asked.path == "/v1/models/claude-x"
    assert asked.headers["x-api-key"] == "sk-upstream-anthropic"
    fallback = env.client().models.retrieve(MODEL)
    assert (fallback.id, fallback.type) == (MODEL, "model")
    with pytest.raises(anthropic.NotFoundError) as unknown:
        env.client().models.retrieve("claude-none")
    assert unknown.value.response.json()["error"]["type"] == "not_found_error"


def test_a_tenants_own_upstream_key_is_sent_instead_of_the_servers(env: Env) -> None:
    name = f"own-key-{sid()}"
    done = cli("tenant", "add", name, "--db", env.proxy.db,
               env={"CTXWARDEN_TENANT_ANTHROPIC_API_KEY": "sk-tenant-own"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip().splitlines()[-1]
    assert "sk-tenant-own" not in done.stdout
    env.client(key).messages.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}]
    )
    assert env.upstream.requests[-1].headers["x-api-key"] == "sk-tenant-own"


def test_count_tokens_asks_the_anthropic_upstream_for_the_request_as_sent(env: Env) -> None:
    """Claude Code calls ``/v1/messages/count_tokens`` often: the proxy answers it from
    the Anthropic upstream (the client's request as sent, the server's key), storing nothing."""
    env.upstream.reply(Reply(body={"input_tokens": 1234}), Reply(body={"input_tokens": 99}))
    turns = [{"role": "user", "content": "how long is this?"}]
    counted = env.client().messages.count_tokens(model=MODEL, system="Be brief.", messages=turns)
    assert counted.input_tokens == 1234
    asked = env.upstream.requests[-1]
    assert asked.path == "/v1/messages/count_tokens"
    assert asked.headers["x-api-key"] == "sk-upstream-anthropic"
    assert asked.json == {"model": MODEL, "system": "Be brief.", "messages": turns}
    beta = env.client().beta.messages.count_tokens(model=MODEL, messages=turns)
    assert beta.input_tokens == 99
    env.upstream.reply(Reply(body={"input_tokens": 7}))
    raw = httpx2.post(
        env.proxy.url + "/v1/messages/count_tokens?beta=true",
        json={"model": MODEL, "messages": turns},
        headers={"x-api-key": env.key},
    )
    assert raw.json() == {"input_tokens": 7}  # fmt: skip
    assert env.upstream.requests[-1].path == "/v1/messages/count_tokens?beta=true"
    env.upstream.reply(Reply(400, anthropic_error("model: unknown", "invalid_request_error")))
    with pytest.raises(anthropic.BadRequestError, match="model: unknown"):
        env.client().messages.count_tokens(model="nope", messages=turns)


def test_a_ledger_after_the_task_goes_upstream_as_text_of_the_task_turn(env: Env) -> None:
    """A coding agent's loop through the proxy under a tight budget: once the window
    moves, the ledger follows the task. On Anthropic's wire it is a text block of the
    task's user turn, not part of ``system`` (which would make every new rendering of it
    rewrite the cached system prompt and task), and the task's block is a breakpoint."""
    session = sid()
    system = "You fix bugs in the repository with the read tool."
    task = "Fix the crash in the request handler; the failing test is tests/test_handler.py."
    tools = [{"name": "read", "input_schema": {"type": "object"}}]
    history: list[dict[str, Any]] = [{"role": "user", "content": task}]
    headers = {**hdr(session), "X-Ctxwarden-Max-Input-Tokens": "1500"}
    for i in range(12):
        use = {"type": "tool_use", "id": f"tu_{i}", "name": "read",
               "input": {"path": f"src/pkg/module_{i}.py"}}  # fmt: skip
        env.upstream.reply(
            Reply(body=anthropic_message("Reading.", extra_content=[use], stop_reason="tool_use"))
        )
        reply = env.client().messages.create(
            model=MODEL, max_tokens=256, system=system, messages=history, tools=tools,
            extra_headers=headers,
        )  # fmt: skip
        lines = [f"def handler_{i}_{k}(request_{k}): return route_{i}_{k}(request_{k})"
                 for k in range(25)]  # fmt: skip
        history += [
            {"role": "assistant", "content": reply.content},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"tu_{i}", "content": "\n".join(lines)}]},
        ]  # fmt: skip
    sent = [r.json for r in env.upstream.requests[-12:]]
    assert all([b["text"] for b in body["system"]] == [system] for body in sent)
    with_ledger = [
        body
        for body in sent
        if any(b.get("text", "").startswith(DEFAULT_HEADER) for b in _blocks(body))
    ]
    assert with_ledger, "the budget should have moved the window and filled the ledger"
    for body in with_ledger:
        first = body["messages"][0]["content"]
        assert first[0]["text"] == task and first[0]["cache_control"] == {"type": "ephemeral"}
        assert first[1]["text"].startswith(DEFAULT_HEADER)


def _blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for m in body["messages"] for b in m["content"] if isinstance(b, dict)]


def test_a_tool_use_too_big_for_the_budget_goes_upstream_cut_beside_its_result(env: Env) -> None:
    """Claude Code writing a file through the proxy under a tight budget: the newest
    ``tool_use`` (a heredoc) outgrows what is left, so its input goes upstream cut, still
    an object, beside the ``tool_result`` it asked for, its thinking block as received;
    the store keeps the call whole."""
    session = sid()
    heredoc = "cat > big.py <<'EOF'\n" + "x = 1\n" * 2000 + "EOF"
    write = {"type": "tool_use", "id": "tu_big", "name": "bash", "input": {"command": heredoc}}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Write big.py."},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
            {"type": "text", "text": "Writing it."}, write]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "tu_big", "content": "written"}]},
    ]  # fmt: skip
    raw = env.client().messages.with_raw_response.create(
        model=MODEL, max_tokens=256, system="You are a coding agent.", messages=history,
        tools=[{"name": "bash", "input_schema": {"type": "object"}}],
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_headers={**hdr(session), "X-Ctxwarden-Max-Input-Tokens": "1200"},
    )  # fmt: skip
    assert int(raw.headers["x-ctxwarden-input-tokens"]) <= 1200
    sent = env.upstream.requests[-1].json["messages"]
    turn = sent[1]["content"]
    assert turn[0] == {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE}
    use = next(b for b in turn if b["type"] == "tool_use")
    assert (use["id"], use["name"]) == ("tu_big", "bash")
    assert isinstance(use["input"], dict)
    assert use["input"]["command"].startswith("cat > big.py <<'EOF'\nx = 1\n")
    assert len(use["input"]["command"]) < len(heredoc)
    assert sent[2]["content"][0]["tool_use_id"] == "tu_big"  # the result it asked for
    stored = next(m for m in env.stored(session) if m.get("tool_calls"))
    assert json.loads(stored["tool_calls"][0]["function"]["arguments"]) == write["input"]
