"""``ctxwarden serve`` as a process, the real ``openai`` SDK as its client, and a local
upstream speaking the chat-completions wire format (JSON, SSE text and tool-call deltas),
on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
import pytest
from llm_servers import (
    Recorded,
    Reply,
    ScriptedServer,
    openai_completion,
    openai_error,
    openai_stream,
    openai_tool_calls,
    openai_tool_stream,
)
from service_harness import ProxyServer, add_tenant, cli, module_db, sid

from ctxwarden import TokenCounter, messages_from_openai, pairing_problems

__all__ = ["module_db"]  # the fixture, re-exported for pytest


def fake_model(request: Recorded) -> Reply:
    """Answers 'seen N' where N is how many messages upstream received."""
    body = request.json
    text = f"seen {len(body['messages'])}"
    if body.get("stream"):
        return Reply(events=openai_stream(text.split(" "), prompt=50, completion=2, cached=8))
    return Reply(body=openai_completion(text, prompt=50, completion=2, cached=8))


@dataclass
class Env:
    proxy: ProxyServer
    upstream: ScriptedServer
    key: str
    other_key: str
    clients: dict[str, openai.OpenAI] = field(default_factory=dict)

    def client(self, key: str | None = None) -> openai.OpenAI:
        key = key or self.key
        if key not in self.clients:
            url = self.proxy.url + "/v1"
            self.clients[key] = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
        return self.clients[key]

    def stored(self, session: str, key: str | None = None, **q: Any) -> list[dict[str, Any]]:
        query = "&".join(f"{k}={v}" for k, v in q.items())
        status, body = self.proxy.get(
            f"/v1/sessions/{session}/messages?limit=1000&{query}", key or self.key
        )
        assert status == 200, body
        return list(body["messages"])


@pytest.fixture(scope="module")
def env(module_db: str) -> Iterator[Env]:
    upstream = ScriptedServer(fake_model).start()
    key = add_tenant(module_db, "acme")
    other = add_tenant(module_db, "globex")
    proxy = ProxyServer(
        module_db,
        upstream=upstream.url + "/v1",
        extra=("--max-body-mb", "1", "--upstream-timeout", "1.5"),
    )
    env = Env(proxy, upstream, key, other)
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


def hdr(session: str, **more: str) -> dict[str, str]:
    return {"X-Ctxwarden-Session": session, **more}


def tool_history(turns: int, result_chars: int = 3000) -> list[dict[str, Any]]:
    """A tool-using agent: each turn a question, a search call, its long result, an answer."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a support agent."}]
    for i in range(turns):
        out.append({"role": "user", "content": f"Where is order ORD-{1000 + i}?"})
        out.append({
            "role": "assistant", "content": None,
            "tool_calls": [{"id": f"call_{i}", "type": "function",
                            "function": {"name": "lookup", "arguments": json.dumps({"n": i})}}],
        })  # fmt: skip
        out.append({"role": "tool", "tool_call_id": f"call_{i}",
                    "content": json.dumps({"order": i, "log": "x" * result_chars})})  # fmt: skip
        out.append({"role": "assistant", "content": f"Order ORD-{1000 + i} ships Monday."})
    out.append({"role": "user", "content": "And the last one?"})
    return out


def test_json_call_forwards_the_build_and_stores_history_and_reply(env: Env) -> None:
    session = sid()
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    raw = env.client().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=history, extra_headers=hdr(session)
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "seen 2"
    sent = env.upstream.requests[-1]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-upstream-openai"  # never the tenant key
    assert sent.json["messages"] == history
    assert int(raw.headers["x-ctxwarden-input-tokens"]) > 0
    assert int(raw.headers["x-ctxwarden-saved-tokens"]) >= 0
    assert len(raw.headers["x-ctxwarden-build-id"]) == 32
    assert raw.headers["x-ctxwarden-session"] == session

    # the next turn sends the whole history back, reply included: only the suffix is new
    history += [completion.choices[0].message.model_dump(exclude_none=True)]
    history += [{"role": "user", "content": "More?"}]
    again = env.client().chat.completions.create(
        model="gpt-4o", messages=history, extra_headers=hdr(session)
    )
    assert again.choices[0].message.content == "seen 4"
    stored = env.stored(session)
    assert stored == [*history, {"role": "assistant", "content": "seen 4"}]
    status, builds = env.proxy.get(f"/v1/sessions/{session}/builds", env.key)
    assert status == 200
    assert [b["status"] for b in builds["builds"]] == ["complete", "complete"]
    assert builds["builds"][0]["audit"]["input_tokens"] == int(
        raw.headers["x-ctxwarden-input-tokens"]
    )
    status, detail = env.proxy.get(f"/v1/sessions/{session}", env.key)
    assert detail["usage"]["calls"] == 2 and detail["usage"]["cached_input_tokens"] == 16
    assert detail["cost_usd"] > 0


def test_stream_passes_text_and_strips_the_usage_chunk_it_asked_for(env: Env) -> None:
    session = sid()
    history = [{"role": "user", "content": "Stream please"}]
    chunks = list(
        env.client().chat.completions.create(
            model="gpt-4o", messages=history, stream=True, extra_headers=hdr(session)
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "seen1"
    assert all(c.choices for c in chunks)  # no usage chunk: the client did not ask for it
    assert env.upstream.requests[-1].json["stream_options"] == {"include_usage": True}
    assert env.stored(session)[-1] == {"role": "assistant", "content": "seen1"}

    asked = list(
        env.client().chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": "with usage"}],
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=hdr(sid()),
        )
    )
    assert asked[-1].choices == [] and asked[-1].usage is not None
    assert asked[-1].usage.prompt_tokens == 50


def test_streamed_tool_call_deltas_arrive_intact_and_are_stored(env: Env) -> None:
    session = sid()
    args = {"city": "Paris", "days": [1, 2, 3], "note": 'quoted "text"'}
    env.upstream.reply(Reply(events=openai_tool_stream([("call_w", "weather", args)], pieces=5)))
    history: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    stream = env.client().chat.completions.create(
        model="gpt-4o", messages=history, stream=True, extra_headers=hdr(session),
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {}}}],
    )  # fmt: skip
    calls: dict[int, dict[str, str]] = {}
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "args": ""})
            slot["id"] = tc.id or slot["id"]
            slot["name"] = (tc.function.name if tc.function else None) or slot["name"]
            slot["args"] += (tc.function.arguments if tc.function else None) or ""
    assert calls == {0: {"id": "call_w", "name": "weather", "args": json.dumps(args)}}
    assert "tools" in env.upstream.requests[-1].json
    stored = env.stored(session)
    assert stored[-1]["tool_calls"][0]["function"] == {
        "name": "weather",
        "arguments": json.dumps(args),
    }
    # the agent answers the call: its echo of the reply matches what was stored
    history += [
        {"role": "assistant", "content": None, "tool_calls": stored[-1]["tool_calls"]},
        {"role": "tool", "tool_call_id": "call_w", "content": "sunny"},
    ]
    env.client().chat.completions.create(
        model="gpt-4o", messages=history, extra_headers=hdr(session)
    )
    assert env.stored(session)[:-1] == env.stored(session)[:3]
    assert len(env.stored(session)) == 4  # no branch: the echoed call matched


def test_long_history_is_sent_within_budget_and_pair_safe(env: Env) -> None:
    session = sid()
    history = tool_history(30)
    budget = 3000
    raw = env.client().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=history, extra_headers=hdr(session, **{
            "X-Ctxwarden-Max-Input-Tokens": str(budget)}),
        tools=[{"type": "function", "function": {"name": "lookup", "parameters": {}}}],
    )  # fmt: skip
    sent = messages_from_openai(env.upstream.requests[-1].json["messages"])
    assert pairing_problems(sent) == []
    tools = env.upstream.requests[-1].json["tools"]
    counted = TokenCounter.for_model("gpt-4o").count_messages(sent, tools=tools).tokens
    assert counted <= budget
    assert int(raw.headers["x-ctxwarden-input-tokens"]) <= budget
    assert int(raw.headers["x-ctxwarden-saved-tokens"]) > 10_000
    assert sent[-1].text == "And the last one?"
    assert env.stored(session)[: len(history)] == history  # the store keeps everything


def test_budget_below_the_system_prompt_is_a_400_with_the_minimum(env: Env) -> None:
    before = len(env.upstream.requests)
    system = "Rules. " * 400
    with pytest.raises(openai.BadRequestError) as err:
        env.client().chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
            extra_headers=hdr(sid(), **{"X-Ctxwarden-Max-Input-Tokens": "50"}),
        )
    body = err.value.body
    assert isinstance(body, dict) and body["code"] == "context_budget_too_small"
    assert body["minimum_budget"] > 50
    assert len(env.upstream.requests) == before  # nothing was forwarded


def test_a_message_that_is_no_object_is_a_400_naming_it(env: Env) -> None:
    """A ``messages`` item that is no JSON object is refused with its index, wherever it
    stands among objects; nothing is forwarded."""
    before = len(env.upstream.requests)
    url, auth = env.proxy.url + "/v1/chat/completions", {"authorization": f"Bearer {env.key}"}
    user = {"role": "user", "content": "hi"}
    for messages, index in (([user, "hi"], 1), ([7], 0), ([user, user, [user]], 2)):
        r = httpx2.post(url, json={"model": "gpt-4o", "messages": messages}, headers=auth)
        assert r.status_code == 400, r.text
        assert f"message {index}" in r.json()["error"]["message"], r.text
    assert len(env.upstream.requests) == before


def test_keys_missing_unknown_and_revoked_are_401(env: Env) -> None:
    with pytest.raises(openai.AuthenticationError):
        env.client(key="cwk_not-a-key").chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}]
        )
    r = httpx2.post(env.proxy.url + "/v1/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == 401 and "missing API key" in r.json()["error"]["message"]
    temp = add_tenant(env.proxy.db, f"temp-{sid()}")
    ok = env.client(key=temp).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "x"}]
    )
    assert ok.choices[0].message.content == "seen 1"
    listed = cli("tenant", "list", "--db", env.proxy.db).stdout
    assert "acme" in listed and env.key not in listed  # keys are never shown again
    name = next(line.split("\t")[0] for line in listed.splitlines() if temp[:12] in line)
    assert cli("tenant", "revoke", name, "--db", env.proxy.db).returncode == 0
    with pytest.raises(openai.AuthenticationError):
        env.client(key=temp).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}]
        )


def test_tenants_are_isolated(env: Env) -> None:
    session = sid()
    env.client().chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "acme secret"}],
        extra_headers=hdr(session),
    )
    assert env.proxy.get(f"/v1/sessions/{session}", env.other_key)[0] == 404
    assert env.proxy.get(f"/v1/sessions/{session}/messages", env.other_key)[0] == 404
    _, listed = env.proxy.get("/v1/sessions", env.other_key)
    assert session not in {s["id"] for s in listed["sessions"]}
    # the same id used by the other tenant is another session
    env.client(key=env.other_key).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "globex"}], extra_headers=hdr(session)
    )
    assert env.stored(session, env.other_key)[0]["content"] == "globex"
    assert env.stored(session)[0]["content"] == "acme secret"


def test_edited_history_starts_a_branch_and_keeps_the_old_one(env: Env) -> None:
    session = sid()
    history = [{"role": "user", "content": "first"}]
    first = env.client().chat.completions.create(
        model="gpt-4o", messages=history, extra_headers=hdr(session)
    )
    edited = [{"role": "user", "content": "first, edited"},
              first.choices[0].message.model_dump(exclude_none=True),
              {"role": "user", "content": "second"}]  # fmt: skip
    raw = env.client().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=edited, extra_headers=hdr(session)
    )
    branch = raw.headers["x-ctxwarden-session"]
    assert branch == f"{session}~b1"
    assert env.stored(session) == [history[0], {"role": "assistant", "content": "seen 1"}]
    assert env.stored(branch) == [*edited, {"role": "assistant", "content": "seen 3"}]
    # a truncated history (the client dropped its last turns) branches too
    raw = env.client().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=edited[:1], extra_headers=hdr(session)
    )
    assert raw.headers["x-ctxwarden-session"] == f"{session}~b2"


def test_session_id_is_derived_when_the_header_is_missing(env: Env) -> None:
    history = [{"role": "system", "content": f"sys {sid()}"}, {"role": "user", "content": "q"}]
    a = env.client().chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    history += [{"role": "assistant", "content": "seen 2"}, {"role": "user", "content": "q2"}]
    b = env.client().chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    derived = a.headers["x-ctxwarden-session"]
    assert derived.startswith("auto-") and b.headers["x-ctxwarden-session"] == derived
    assert len(env.stored(derived)) == 5


def test_upstream_errors_pass_with_status_and_body(env: Env) -> None:
    env.upstream.reply(Reply(429, openai_error("slow down", "rate_limit_error")))
    with pytest.raises(openai.RateLimitError, match="slow down"):
        env.client().chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}], extra_headers=hdr(sid())
        )
    env.upstream.reply(Reply(503, openai_error("down for maintenance")))
    with pytest.raises(openai.InternalServerError, match="down for maintenance") as err:
        env.client().chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}], stream=True
        )
    assert err.value.status_code == 503


def test_upstream_timeout_is_504_and_the_history_stays_stored(env: Env) -> None:
    session = sid()
    env.upstream.reply(Reply(body=openai_completion("late"), delay=3.0))
    with pytest.raises(openai.APIStatusError) as err:
        env.client().chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}], extra_headers=hdr(session)
        )
    assert err.value.status_code == 504
    assert env.stored(session) == [{"role": "user", "content": "x"}]
    _, builds = env.proxy.get(f"/v1/sessions/{session}/builds", env.key)
    assert builds["builds"][-1]["status"] == "upstream_504"


def test_body_over_the_limit_is_413(env: Env) -> None:
    big = [{"role": "user", "content": "y" * (1_200_000)}]
    with pytest.raises(openai.APIStatusError) as err:
        env.client().chat.completions.create(model="gpt-4o", messages=big)
    assert err.value.status_code == 413


def test_tool_call_json_reply_round_trip(env: Env) -> None:
    session = sid()
    env.upstream.reply(Reply(body=openai_tool_calls([("c1", "lookup", {"id": 7})])))
    out = env.client().chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "find 7"}], extra_headers=hdr(session)
    )
    call = out.choices[0].message.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "c1",
        "lookup",
        {"id": 7},
    )
    assert env.stored(session)[-1]["tool_calls"][0]["id"] == "c1"


def test_a_model_id_with_a_colon_is_looked_up_on_the_openai_route(env: Env) -> None:
    """An Ollama model's id has a colon (``llama3.1:8b``): ``models.retrieve`` of one
    neither side knows is OpenAI's 404, not Gemini's (whose routes are ``POST
    /v1/models/MODEL:METHOD``); the schema test had found it with a generated id."""
    env.upstream.reply(Reply(404, openai_error("no such model", "invalid_request_error")))
    with pytest.raises(openai.NotFoundError) as missing:
        env.client().models.retrieve("acme-llm:latest")
    error = missing.value.response.json()["error"]
    assert error["code"] == "model_not_found" and "acme-llm:latest" in error["message"]
    assert "status" not in error  # (Gemini's shape: {"error": {"code": 404, "status": ...}})


def test_models_retrieve_passes_the_upstreams_model_else_the_registrys(env: Env) -> None:
    """``client.models.retrieve``: the upstream's answer when it has the model (asked with
    the server's key, an OpenRouter-style id with a slash kept whole), else the registry's
    entry; a model neither knows is the SDK's NotFoundError, in OpenAI's error shape."""
    own = {"id": "acme/model-x", "object": "model", "created": 1, "owned_by": "acme"}
    env.upstream.reply(
        Reply(body=own),
        Reply(404, openai_error("no such model", "invalid_request_error")),
        Reply(404, openai_error("no such model", "invalid_request_error")),
    )
    got = env.client().models.retrieve("acme/model-x")
    assert (got.id, got.owned_by) == ("acme/model-x", "acme")
    asked = env.upstream.requests[-1]
    assert asked.method == "GET" and asked.path == "/v1/models/acme/model-x"
    fallback = env.client().models.retrieve("gpt-4o")  # the upstream says 404: the registry
    assert (fallback.id, fallback.object, fallback.owned_by) == ("gpt-4o", "model", "openai")
    with pytest.raises(openai.NotFoundError) as missing:
        env.client().models.retrieve("no-such-model-anywhere")
    error = missing.value.response.json()["error"]
    assert error["code"] == "model_not_found" and "no-such-model-anywhere" in error["message"]
    with pytest.raises(openai.AuthenticationError):
        env.client("not-a-key").models.retrieve("gpt-4o")


def test_a_route_the_proxy_lacks_answers_in_the_providers_error_shape(env: Env) -> None:
    """A route miss (a model id no route matches, a path we do not serve) or a method a
    route does not take is an error body the SDKs can read, not Starlette's ``detail``."""
    auth = {"authorization": f"Bearer {env.key}"}
    for path in ("/v1/models/h%0Ah", "/v1/no-such-route"):
        r = httpx2.get(env.proxy.url + path, headers=auth)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text
    anthropic_shaped = httpx2.get(env.proxy.url + "/v1/messages/nope", headers=auth)
    assert anthropic_shaped.json()["type"] == "error", anthropic_shaped.text
    wrong_method = httpx2.delete(env.proxy.url + "/v1/models", headers=auth)
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "GET"
    assert "error" in wrong_method.json()
