"""The Anthropic client, through the real ``anthropic`` SDK against a local server."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest
from llm_servers import (
    Reply,
    ScriptedServer,
    anthropic_error,
    anthropic_message,
    anthropic_stream,
    scripted_server,
)

from ctxwarden.core.errors import (
    ConfigError,
    MissingDependencyError,
    ProviderError,
    ProviderTimeout,
)
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.registry.usage import Usage
from ctxwarden.llm import AnthropicModel, ChatModel, RetryPolicy, StreamingChatModel
from ctxwarden.llm.anthropic_client import assistant_message, extract_json_object

__all__ = ["scripted_server"]  # the fixture, re-exported so pytest finds it here

FAST = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02)
HISTORY = [
    Message.system("You are a support agent.", id="sys"),
    Message.system("Known facts: budget $500.", id="facts"),
    Message.user("I need a size L jacket.", id="u1"),
    Message.assistant("Checking stock.", (ToolCall("c1", "stock", '{"size": "L"}'),), id="a1"),
    Message.tool('{"in_stock": true}', "c1", name="stock", id="t1"),
    Message.user("Great, order it.", id="u2"),
]


def client(server: ScriptedServer, **kw: Any) -> AnthropicModel:
    kw.setdefault("retry", FAST)
    kw.setdefault("timeout", 5.0)
    return AnthropicModel("claude-haiku-4-5", base_url=server.url, api_key="sk-ant-test", **kw)


def sent_key(headers: dict[str, str]) -> str | None:
    """The API key as the SDK sent it (``x-api-key`` in 0.x SDKs, a bearer token in 2.x)."""
    bearer = headers.get("authorization", "").removeprefix("Bearer ")
    return headers.get("x-api-key") or bearer or None


def cache_marked(body: dict[str, Any]) -> list[str]:
    """Where cache_control landed: 'system[i]' or 'messages[i][j]:type'."""
    marks = [f"system[{i}]" for i, b in enumerate(body.get("system", [])) if "cache_control" in b]
    for i, turn in enumerate(body["messages"]):
        for j, block in enumerate(turn["content"]):
            if "cache_control" in block:
                marks.append(f"messages[{i}][{j}]:{block['type']}")
    return marks


async def test_success_maps_usage_with_cache_read_and_write(
    scripted_server: ScriptedServer,
) -> None:
    scripted_server.reply(
        Reply(
            body=anthropic_message(
                "Ordered.", input_tokens=40, output_tokens=9, cache_read=1000, cache_write=200
            )
        )
    )
    model = client(scripted_server)
    assert isinstance(model, ChatModel) and isinstance(model, StreamingChatModel)

    done = await model.complete(HISTORY, max_tokens=300, temperature=0.2)

    assert done.text == "Ordered."
    assert done.finish_reason == "end_turn"
    # Anthropic's input_tokens excludes cache reads and writes; Usage counts all input
    assert done.usage == Usage(
        input_tokens=1240, output_tokens=9, cached_input_tokens=1000, cache_write_tokens=200
    )
    (request,) = scripted_server.requests
    assert request.path == "/v1/messages"
    assert sent_key(request.headers) == "sk-ant-test"
    assert "anthropic-beta" not in request.headers
    body = request.json
    assert body["model"] == "claude-haiku-4-5"
    assert body["max_tokens"] == 300
    assert body["temperature"] == 0.2
    assert [b["text"] for b in body["system"]] == [
        "You are a support agent.",
        "Known facts: budget $500.",
    ]
    assert [t["role"] for t in body["messages"]] == ["user", "assistant", "user"]
    assert cache_marked(body) == []
    assert "context_management" not in body


async def test_default_max_tokens_is_sent(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(Reply(body=anthropic_message()))
    await client(scripted_server, max_tokens=512).complete(HISTORY)
    assert scripted_server.requests[0].json["max_tokens"] == 512


async def test_cache_breakpoints_put_cache_control_on_those_blocks(
    scripted_server: ScriptedServer,
) -> None:
    scripted_server.reply(Reply(body=anthropic_message()))

    await client(scripted_server).complete(HISTORY, cache_breakpoints={"facts", "t1"})

    body = scripted_server.requests[0].json
    # the second system block and the tool result closing the cached prefix, nothing else
    assert cache_marked(body) == ["system[1]", "messages[2][0]:tool_result"]
    assert body["system"][1]["cache_control"] == {"type": "ephemeral"}


async def test_more_than_four_breakpoints_is_refused_before_any_request(
    scripted_server: ScriptedServer,
) -> None:
    with pytest.raises(ValueError, match="at most 4"):
        await client(scripted_server).complete(
            HISTORY, cache_breakpoints={"sys", "facts", "u1", "a1", "u2"}
        )
    assert scripted_server.requests == []


async def test_json_mode_instructs_via_system_and_strips_prose(
    scripted_server: ScriptedServer,
) -> None:
    wrapped = 'Here are the facts:\n```json\n{"size": "L", "budget": "$500"}\n```\nAnything else?'
    scripted_server.reply(Reply(body=anthropic_message(wrapped)))

    done = await client(scripted_server).complete(
        HISTORY, json_mode=True, cache_breakpoints={"facts"}
    )

    assert done.text == '{"size": "L", "budget": "$500"}'
    body = scripted_server.requests[0].json
    # the JSON instruction is appended after the caller's system blocks (cache prefix intact),
    # and no assistant prefill is sent (current models reject it)
    assert len(body["system"]) == 3 and "JSON" in body["system"][2]["text"]
    assert cache_marked(body) == ["system[1]"]
    assert body["messages"][-1]["role"] == "user"


def test_extract_json_object() -> None:
    assert extract_json_object('sure! {"a": {"b": 1}} hope that helps') == '{"a": {"b": 1}}'
    assert extract_json_object("no json here") == "no json here"


async def test_compaction_beta_is_passed_through(scripted_server: ScriptedServer) -> None:
    compaction_block = {"type": "compaction", "content": "Summary of earlier turns."}
    body = anthropic_message(
        "Continuing.",
        input_tokens=3000,
        output_tokens=20,
        extra_content=[compaction_block],
        iterations=[
            {
                "type": "compaction",
                "input_tokens": 160_000,
                "output_tokens": 1500,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            },
            {"type": "message", "input_tokens": 3000, "output_tokens": 20},
        ],
    )
    scripted_server.reply(Reply(body=body))
    model = client(
        scripted_server,
        compaction=True,
        compaction_trigger=100_000,
        compaction_instructions="Keep every order number.",
        betas=["extended-cache-ttl-2025-04-11"],
    )

    done = await model.complete(HISTORY)

    request = scripted_server.requests[0]
    assert request.headers["anthropic-beta"] == "extended-cache-ttl-2025-04-11,compact-2026-01-12"
    assert request.json["context_management"] == {
        "edits": [
            {
                "type": "compact_20260112",
                "trigger": {"type": "input_tokens", "value": 100_000},
                "instructions": "Keep every order number.",
            }
        ]
    }
    assert done.text == "Continuing."
    # compaction's own tokens are billed but absent from the top-level usage: added here
    assert done.usage == Usage(input_tokens=163_000, output_tokens=1520)
    assert done.raw.content[0].type == "compaction"


async def test_context_edits_add_the_context_management_beta(
    scripted_server: ScriptedServer,
) -> None:
    scripted_server.reply(Reply(body=anthropic_message()))
    edit = {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": 3}}

    await client(scripted_server, context_edits=[edit]).complete(HISTORY)

    request = scripted_server.requests[0]
    assert request.headers["anthropic-beta"] == "context-management-2025-06-27"
    assert request.json["context_management"] == {"edits": [edit]}


def test_compaction_trigger_below_the_api_minimum_is_refused() -> None:
    with pytest.raises(ConfigError, match="50,000"):
        AnthropicModel("claude-haiku-4-5", api_key="k", compaction=True, compaction_trigger=10_000)


async def test_429_then_success_honours_retry_after(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(
        Reply(
            429, anthropic_error("slow down", "rate_limit_error"), headers={"retry-after": "0.3"}
        ),
        Reply(body=anthropic_message("after the wait")),
    )
    started = time.monotonic()
    done = await client(scripted_server).complete(HISTORY)

    assert done.text == "after the wait"
    assert time.monotonic() - started >= 0.3
    assert len(scripted_server.requests) == 2


async def test_overloaded_529_is_retried_then_reported(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(
        *[Reply(529, anthropic_error("Overloaded", "overloaded_error")) for _ in range(3)]
    )

    with pytest.raises(ProviderError, match="after 3 attempts") as info:
        await client(scripted_server).complete(HISTORY)

    assert info.value.status == 529
    assert info.value.provider == "anthropic"
    assert len(scripted_server.requests) == 3


async def test_500_repeatedly_raises_provider_error(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(*[Reply(500, anthropic_error("boom")) for _ in range(3)])
    with pytest.raises(ProviderError) as info:
        await client(scripted_server).complete(HISTORY)
    assert info.value.status == 500
    assert len(scripted_server.requests) == 3


async def test_slow_server_raises_provider_timeout(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(*[Reply(body=anthropic_message(), delay=3.0) for _ in range(2)])
    model = client(
        scripted_server,
        timeout=0.2,
        deadline=1.5,
        retry=RetryPolicy(max_attempts=2, base_delay=0.01),
    )

    started = time.monotonic()
    with pytest.raises(ProviderTimeout):
        await model.complete(HISTORY)

    assert time.monotonic() - started < 2.0
    assert len(scripted_server.requests) == 2


async def test_malformed_json_body_is_a_provider_error(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(Reply(body='{"type": "message", "content": [ oops'))
    with pytest.raises(ProviderError, match="not valid JSON"):
        await client(scripted_server).complete(HISTORY)
    assert len(scripted_server.requests) == 1


async def test_stream_reassembles_text_and_records_usage(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(
        Reply(
            events=anthropic_stream(
                ["Your ", "jacket ", "is ordered."],
                input_tokens=30,
                output_tokens=8,
                cache_read=500,
                cache_write=100,
            )
        )
    )
    stream = client(scripted_server).stream(HISTORY, cache_breakpoints={"facts"})

    deltas = [d async for d in stream]

    assert deltas == ["Your ", "jacket ", "is ordered."]
    done = stream.completion
    assert done.text == "Your jacket is ordered."
    assert done.finish_reason == "end_turn"
    assert done.usage == Usage(
        input_tokens=630, output_tokens=8, cached_input_tokens=500, cache_write_tokens=100
    )
    body = scripted_server.requests[0].json
    assert body["stream"] is True
    assert cache_marked(body) == ["system[1]"]


def test_missing_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicModel("claude-haiku-4-5")


async def test_key_and_base_url_from_the_environment(
    scripted_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", scripted_server.url)
    scripted_server.reply(Reply(body=anthropic_message("from env")))

    done = await AnthropicModel("claude-haiku-4-5", retry=FAST).complete(HISTORY)

    assert done.text == "from env"
    assert sent_key(scripted_server.requests[0].headers) == "sk-ant-env"


def test_missing_sdk_raises_missing_dependency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)
    with pytest.raises(MissingDependencyError, match=r"ctxwarden\[anthropic\]"):
        AnthropicModel("claude-haiku-4-5", api_key="k")


async def test_compaction_block_round_trips_into_the_next_request(
    scripted_server: ScriptedServer,
) -> None:
    block = {
        "type": "compaction",
        "content": "Customer wants a size L jacket; budget $500.",
        "encrypted_content": "opaque-xyz",
    }
    scripted_server.reply(
        Reply(body=anthropic_message("Noted.", extra_content=[block], stop_reason="compaction")),
        Reply(body=anthropic_message("Ordered.")),
    )
    model = client(scripted_server, compaction=True, pause_after_compaction=True)

    first = await model.complete(HISTORY)
    reply = assistant_message(first, id="a2")
    await model.complete([*HISTORY, reply, Message.user("Order it now.", id="u3")])

    assert first.finish_reason == "compaction"
    edit = scripted_server.requests[0].json["context_management"]["edits"][0]
    assert edit == {"type": "compact_20260112", "pause_after_compaction": True}
    sent = scripted_server.requests[1].json["messages"]
    assert sent[-2] == {"role": "assistant", "content": [block, {"type": "text", "text": "Noted."}]}
