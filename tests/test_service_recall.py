"""The recall tool through ``ctxwarden serve``: the proxy offers it, answers a model's
recall call from the store and asks upstream again; the client (the real ``openai`` and
``anthropic`` SDKs) sees only the final answer, streamed or not, on SQLite and
PostgreSQL."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from llm_servers import (
    Recorded,
    Reply,
    ScriptedServer,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_stream,
    openai_tool_calls,
    openai_tool_stream,
)
from service_harness import ProxyServer, add_tenant, anthropic_rich_stream, module_db, sid

from ctxwarden.service.recall_rounds import MAX_ROUNDS
from ctxwarden.session.recall import RECALL_TOOL_NAME, recall_tool

__all__ = ["module_db"]  # the fixture, re-exported for pytest

HANDLE = re.compile(r"cw:msg:m\d+")
SECRET_LOG = "\n".join(f"line {i}: build step {i} ok, artifact-{i * 7}.tar" for i in range(400))


def _texts(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False)


def _offered(body: dict[str, Any]) -> bool:
    names = [t.get("name") or t.get("function", {}).get("name") for t in body.get("tools", [])]
    return RECALL_TOOL_NAME in names


def _answered(body: dict[str, Any]) -> str | None:
    """The recall result the proxy put in the request (either wire format), if any."""
    for m in body["messages"]:
        if m.get("role") == "tool" and m.get("name") == RECALL_TOOL_NAME:
            return str(m["content"])
        if m.get("role") == "user" and isinstance(m.get("content"), list):
            for block in m["content"]:
                if block.get("type") == "tool_result" and block["tool_use_id"] == "call_r1":
                    content = block["content"]
                    return content if isinstance(content, str) else content[0]["text"]
    return None


def model(request: Recorded) -> Reply:
    """A model that asks for the handle it sees in the context when the recall tool is
    offered and it has no recall result yet, then says how long the recalled text is."""
    body = request.json
    anthropic_wire = request.path.endswith("/messages")
    stream = bool(body.get("stream"))
    got = _answered(body)
    handles = HANDLE.findall(json.dumps(body["messages"]))
    if got is None and _offered(body) and handles:
        handle = handles[-1]
        call = ("call_r1", RECALL_TOOL_NAME, {"handle": handle})
        if anthropic_wire:
            if stream:
                return Reply(events=anthropic_rich_stream(text="", tool=call))
            tool_use = {"type": "tool_use", "id": "call_r1", "name": RECALL_TOOL_NAME,
                        "input": {"handle": handle}}  # fmt: skip
            msg = anthropic_message("", extra_content=[tool_use], stop_reason="tool_use")
            msg["content"] = [tool_use]
            return Reply(body=msg)
        if stream:
            return Reply(events=openai_tool_stream([call]))
        return Reply(body=openai_tool_calls([call]))
    text = f"recalled {len(got)} chars" if got is not None else "no recall"
    pieces = [text[:4], text[4:]]
    if anthropic_wire:
        return (
            Reply(events=anthropic_stream(pieces))
            if stream
            else Reply(body=anthropic_message(text))
        )
    if stream:
        return Reply(events=openai_stream(pieces))
    return Reply(body=openai_completion(text))


@dataclass
class Env:
    proxy: ProxyServer
    upstream: ScriptedServer
    key: str


@pytest.fixture(scope="module")
def env(module_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    policy = Path(tmp_path_factory.mktemp("policy") / "policy.toml")
    policy.write_text("recall_tool = true\n", encoding="utf-8")
    upstream = ScriptedServer(model).start()
    key = add_tenant(module_db, "acme")
    proxy = ProxyServer(
        module_db,
        upstream=upstream.url + "/v1",
        anthropic_upstream=upstream.url,
        extra=("--policy", str(policy)),
    )
    try:
        yield Env(proxy, upstream, key)
    finally:
        proxy.stop()
        upstream.stop()


def _history() -> list[dict[str, Any]]:
    call = {"id": "call_0", "type": "function",
            "function": {"name": "build_log", "arguments": "{}"}}  # fmt: skip
    return [
        {"role": "system", "content": "You are a release agent."},
        {"role": "user", "content": "Fetch the build log."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": SECRET_LOG},
        # answered: the log is cut by the size threshold (a result the model has not
        # answered yet is sent whole while it fits: issue 35)
        {"role": "assistant", "content": "I have the build log."},
        {"role": "user", "content": "Which artifact did step 321 make?"},
    ]


def _anthropic_history() -> tuple[str, list[dict[str, Any]]]:
    return "You are a release agent.", [
        {"role": "user", "content": "Fetch the build log."},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_0", "name": "build_log", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_0", "content": SECRET_LOG}]},
        {"role": "assistant", "content": "I have the build log."},  # answered (see above)
        {"role": "user", "content": "Which artifact did step 321 make?"},
    ]  # fmt: skip


def _check_rounds(env: Env, first: int, session: str) -> None:
    """Upstream saw two requests: the first offered the tool and showed the cut log with
    its handle; the second carried the whole log, byte for byte, as the recall result.
    The stored session holds the client's history and the final reply only, and the
    recall is in the session's builds."""
    sent = env.upstream.requests[first:]
    assert len(sent) == 2
    assert _offered(sent[0].json) and SECRET_LOG not in _texts(sent[0].json)
    assert _answered(sent[1].json) == SECRET_LOG
    status, body = env.proxy.get(f"/v1/sessions/{session}/messages?limit=100", env.key)
    assert status == 200
    stored = body["messages"]
    assert not any(RECALL_TOOL_NAME in json.dumps(m) for m in stored)
    assert stored[-1]["content"] == f"recalled {len(SECRET_LOG)} chars"
    status, builds = env.proxy.get(f"/v1/sessions/{session}/builds", env.key)
    assert status == 200
    assert [b["status"] for b in builds["builds"]].count("recalled") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_openai_client_never_sees_the_recall_round(env: Env, stream: bool) -> None:
    session = sid()
    client = openai.OpenAI(base_url=env.proxy.url + "/v1", api_key=env.key, max_retries=0)
    first = len(env.upstream.requests)
    headers = {"X-Ctxwarden-Session": session, "X-Ctxwarden-Max-Input-Tokens": "9000"}
    with client:
        if stream:
            chunks = client.chat.completions.create(
                model="gpt-4o", messages=_history(), stream=True, extra_headers=headers
            )  # type: ignore[call-overload]
            pieces = [c.choices[0].delta for c in chunks if c.choices]
            text = "".join(d.content or "" for d in pieces)
            assert not any(d.tool_calls for d in pieces)
        else:
            reply = client.chat.completions.create(
                model="gpt-4o", messages=_history(), extra_headers=headers
            )  # type: ignore[call-overload]
            assert not reply.choices[0].message.tool_calls
            text = reply.choices[0].message.content or ""
    assert text == f"recalled {len(SECRET_LOG)} chars"
    _check_rounds(env, first, session)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_client_never_sees_the_recall_round(env: Env, stream: bool) -> None:
    session = sid()
    client = anthropic.Anthropic(base_url=env.proxy.url, api_key=env.key, max_retries=0)
    system, turns = _anthropic_history()
    first = len(env.upstream.requests)
    headers = {"X-Ctxwarden-Session": session, "X-Ctxwarden-Max-Input-Tokens": "9000"}
    with client:
        if stream:
            with client.messages.stream(
                model="claude-haiku-4-5",
                max_tokens=64,
                system=system,
                messages=turns,
                extra_headers=headers,
            ) as events:  # type: ignore[arg-type]
                final = events.get_final_message()
        else:
            final = client.messages.create(
                model="claude-haiku-4-5", max_tokens=64, system=system, messages=turns,
                extra_headers=headers,
            )  # type: ignore[arg-type]  # fmt: skip
    assert [b.type for b in final.content] == ["text"]
    assert final.content[0].text == f"recalled {len(SECRET_LOG)} chars"  # type: ignore[union-attr]
    _check_rounds(env, first, session)


def test_a_text_reply_streams_through_without_a_round(env: Env) -> None:
    session = sid()
    first = len(env.upstream.requests)
    client = openai.OpenAI(base_url=env.proxy.url + "/v1", api_key=env.key, max_retries=0)
    history = [{"role": "user", "content": "hello"}]
    with client:
        chunks = client.chat.completions.create(
            model="gpt-4o", messages=history, stream=True,
            extra_headers={"X-Ctxwarden-Session": session},
        )  # type: ignore[call-overload]  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "no recall"
    sent = env.upstream.requests[first:]
    assert len(sent) == 1 and _offered(sent[0].json)


def test_the_session_api_recalls_by_handle_and_audits(env: Env) -> None:
    session = sid()
    client = openai.OpenAI(base_url=env.proxy.url + "/v1", api_key=env.key, max_retries=0)
    with client:
        client.chat.completions.create(
            model="gpt-4o", messages=_history(), extra_headers={"X-Ctxwarden-Session": session}
        )  # type: ignore[call-overload]
    status, body = env.proxy.get(f"/v1/sessions/{session}/recall/cw:msg:m3", env.key)
    assert status == 200 and body["seq"] == 3 and body["message"]["content"] == SECRET_LOG
    status, body = env.proxy.get(f"/v1/sessions/{session}/recall/m3", env.key)
    assert status == 200 and body["message"]["content"] == SECRET_LOG
    status, body = env.proxy.get(f"/v1/sessions/{session}/recall/cw:msg:m77", env.key)
    assert status == 404 and "no message with id 'm77'" in json.dumps(body)
    status, builds = env.proxy.get(f"/v1/sessions/{session}/builds", env.key)
    statuses = [b["status"] for b in builds["builds"]]
    assert statuses.count("recalled") == 3  # the model's recall through the proxy, and two here


def _metric(env: Env, name: str, **labels: str) -> float:
    text = httpx2.get(env.proxy.url + "/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    found = re.search(rf"^{name}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _recall_call(handle: str, **usage: int) -> Reply:
    return Reply(
        body=openai_tool_calls([("call_r1", RECALL_TOOL_NAME, {"handle": handle})], **usage)
    )


def test_rounds_count_in_the_session_usage_the_spend_cap_and_the_metrics(env: Env) -> None:
    """The proxy's own rounds are billed upstream: their usage is the session's and the
    tenant's (a spend cap answers 429 on the next call), and each is metered."""
    name = f"capped-{sid()}"
    key = add_tenant(env.proxy.db, name, "--spend-cap", "0.01")
    session = sid()
    before = {o: _metric(env, "ctxwarden_recall_rounds_total", api="openai", outcome=o)
              for o in ("answered", "unknown_handle", "limit")}  # fmt: skip
    tokens = _metric(env, "ctxwarden_recalled_tokens_total", api="openai")
    # a pricey round (gpt-4o: ~$1), a cheap final answer ($0.0001)
    env.upstream.reply(
        _recall_call("cw:msg:m3", prompt=200_000, completion=50_000),
        Reply(body=openai_completion("done")),
    )
    client = openai.OpenAI(base_url=env.proxy.url + "/v1", api_key=key, max_retries=0)
    headers = {"X-Ctxwarden-Session": session, "X-Ctxwarden-Max-Input-Tokens": "9000"}
    with client:
        reply = client.chat.completions.create(
            model="gpt-4o", messages=_history(), extra_headers=headers
        )  # type: ignore[call-overload]
        assert reply.choices[0].message.content == "done"
        _, detail = env.proxy.get(f"/v1/sessions/{session}", key)
        assert detail["usage"]["calls"] == 2
        assert detail["usage"]["input_tokens"] == 200_010
        assert detail["usage"]["output_tokens"] == 50_005
        assert detail["cost_usd"] > 0.9  # gpt-4o: $2.50/M in, $10/M out
        with pytest.raises(openai.RateLimitError) as err:
            client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "again"}]
            )
        assert err.value.body["code"] == "spend_cap_reached"  # type: ignore[index]
    assert _metric(env, "ctxwarden_recall_rounds_total", api="openai", outcome="answered") == (
        before["answered"] + 1
    )
    assert _metric(env, "ctxwarden_recalled_tokens_total", api="openai") > tokens + 1000

    # a handle the store does not have, then rounds until they run out
    env.upstream.reply(
        _recall_call("cw:msg:m99"),
        *[_recall_call("cw:msg:m3") for _ in range(MAX_ROUNDS - 1)],
        Reply(body=openai_completion("gave up")),
    )
    first = len(env.upstream.requests)
    with openai.OpenAI(base_url=env.proxy.url + "/v1", api_key=env.key, max_retries=0) as ok:
        reply = ok.chat.completions.create(
            model="gpt-4o", messages=_history(), extra_headers={"X-Ctxwarden-Session": sid()}
        )  # type: ignore[call-overload]
    assert reply.choices[0].message.content == "gave up"
    sent = env.upstream.requests[first:]
    assert [_offered(r.json) for r in sent] == [True] * MAX_ROUNDS + [False]
    assert "no message with id 'm99'" in json.dumps(sent[1].json["messages"])
    for outcome, grew in (("unknown_handle", 1), ("answered", 1 + MAX_ROUNDS - 1), ("limit", 1)):
        now = _metric(env, "ctxwarden_recall_rounds_total", api="openai", outcome=outcome)
        assert now == before[outcome] + grew, outcome


def _client_tools(shape: str) -> list[dict[str, Any]]:
    """The client's own recall tool: a framework on the library, through the proxy."""
    return [recall_tool(shape)]  # type: ignore[arg-type]


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_offered_recall_tool_is_the_clients(env: Env, stream: bool) -> None:
    """The client offers ctxwarden_recall itself: upstream gets one definition, not
    two, and the model's call reaches the client, which answers it (here through the
    session API) in its next request."""
    session = sid()
    client = openai.OpenAI(base_url=env.proxy.url + "/v1", api_key=env.key, max_retries=0)
    headers = {"X-Ctxwarden-Session": session, "X-Ctxwarden-Max-Input-Tokens": "9000"}
    history = _history()
    first = len(env.upstream.requests)
    kw: dict[str, Any] = dict(
        model="gpt-4o", tools=_client_tools("openai"), extra_headers=headers
    )  # fmt: skip
    with client:
        if stream:
            chunks = client.chat.completions.create(messages=history, stream=True, **kw)
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            calls = [tc for d in deltas for tc in d.tool_calls or ()]
            assert calls[0].function and calls[0].function.name == RECALL_TOOL_NAME
            call_id = str(calls[0].id)
            args = "".join((tc.function.arguments or "") for tc in calls if tc.function)
        else:
            reply = client.chat.completions.create(messages=history, **kw)
            [tool_call] = reply.choices[0].message.tool_calls or []
            assert tool_call.function.name == RECALL_TOOL_NAME  # type: ignore[union-attr]
            call_id, args = tool_call.id, tool_call.function.arguments  # type: ignore[union-attr]
        sent = env.upstream.requests[first:]
        assert len(sent) == 1  # the proxy did not answer it
        names = [t["function"]["name"] for t in sent[0].json["tools"]]
        assert names == [RECALL_TOOL_NAME]
        handle = json.loads(args)["handle"]
        status, found = env.proxy.get(f"/v1/sessions/{session}/recall/{handle}", env.key)
        assert status == 200 and found["message"]["content"] == SECRET_LOG
        call = {"id": call_id, "type": "function",
                "function": {"name": RECALL_TOOL_NAME, "arguments": args}}  # fmt: skip
        history += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "name": RECALL_TOOL_NAME,
             "content": found["message"]["content"]},
        ]  # fmt: skip
        raw = client.chat.completions.with_raw_response.create(messages=history, **kw)
    assert raw.headers["x-ctxwarden-session"] == session  # the echo matched: no branch
    assert raw.parse().choices[0].message.content == f"recalled {len(SECRET_LOG)} chars"
    stored = env.proxy.get(f"/v1/sessions/{session}/messages?limit=100", env.key)[1]["messages"]
    assert [m["role"] for m in stored[-3:]] == ["assistant", "tool", "assistant"]
    assert stored[-3]["tool_calls"][0]["function"]["name"] == RECALL_TOOL_NAME


def test_a_client_offered_recall_tool_passes_through_anthropic(env: Env) -> None:
    session = sid()
    system, turns = _anthropic_history()
    first = len(env.upstream.requests)
    with anthropic.Anthropic(base_url=env.proxy.url, api_key=env.key, max_retries=0) as client:
        final = client.messages.create(
            model="claude-haiku-4-5", max_tokens=64, system=system, messages=turns,
            tools=_client_tools("anthropic"),
            extra_headers={"X-Ctxwarden-Session": session, "X-Ctxwarden-Max-Input-Tokens": "9000"},
        )  # type: ignore[arg-type]  # fmt: skip
    assert [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].name == RECALL_TOOL_NAME  # type: ignore[union-attr]
    sent = env.upstream.requests[first:]
    assert len(sent) == 1 and [t["name"] for t in sent[0].json["tools"]] == [RECALL_TOOL_NAME]


@pytest.mark.parametrize("stream", [False, True])
def test_a_round_sends_the_models_thinking_back_with_its_recall_call(
    env: Env, stream: bool
) -> None:
    """With extended thinking, the assistant turn before the recall result the proxy
    adds must carry its thinking block unchanged, as in any tool-use loop."""
    thinking = {"type": "thinking", "thinking": "I need the whole log.", "signature": "sig-abc"}
    call = ("call_r1", RECALL_TOOL_NAME, {"handle": "cw:msg:m3"})
    if stream:
        events = anthropic_rich_stream(text="", tool=call, thinking=thinking["thinking"])
        first_reply = Reply(events=[e for e in events if '"text"' not in e])  # no text block
    else:
        use = {"type": "tool_use", "id": call[0], "name": call[1], "input": call[2]}
        body = anthropic_message("", stop_reason="tool_use")
        body["content"] = [thinking, use]
        first_reply = Reply(body=body)
    env.upstream.reply(first_reply)
    system, turns = _anthropic_history()
    first = len(env.upstream.requests)
    headers = {"X-Ctxwarden-Session": sid(), "X-Ctxwarden-Max-Input-Tokens": "9000"}
    kw: dict[str, Any] = dict(
        model="claude-haiku-4-5", max_tokens=2048, system=system, messages=turns,
        thinking={"type": "enabled", "budget_tokens": 1024}, extra_headers=headers,
    )  # fmt: skip
    with anthropic.Anthropic(base_url=env.proxy.url, api_key=env.key, max_retries=0) as client:
        if stream:
            with client.messages.stream(**kw) as events:
                final = events.get_final_message()
        else:
            final = client.messages.create(**kw)
    assert final.content[-1].text == f"recalled {len(SECRET_LOG)} chars"  # type: ignore[union-attr]
    again = env.upstream.requests[first:][1].json["messages"]
    turn = next(t for t in reversed(again) if t["role"] == "assistant")
    assert turn["content"][0] == thinking
    assert [b["type"] for b in turn["content"]] == ["thinking", "tool_use"]
