"""The OpenAI-compatible client, through the real ``openai`` SDK against a local server."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from typing import Any

import pytest
from llm_servers import (
    Reply,
    ScriptedServer,
    openai_completion,
    openai_error,
    openai_stream,
    scripted_server,
)

from ctxwarden.core.errors import (
    ConfigError,
    MissingDependencyError,
    ProviderError,
    ProviderTimeout,
)
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.llm import ChatModel, OpenAICompatible, RetryPolicy, StreamingChatModel
from ctxwarden.llm.base import complete_sync

__all__ = ["scripted_server"]  # the fixture, re-exported so pytest finds it here

FAST = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02)
MESSAGES = [Message.system("You summarise.", id="s"), Message.user("Summarise this.", id="u")]


def client(server: ScriptedServer, **kw: Any) -> OpenAICompatible:
    kw.setdefault("retry", FAST)
    kw.setdefault("timeout", 5.0)
    return OpenAICompatible("gpt-4o-mini", base_url=server.url + "/v1", api_key="sk-test", **kw)


async def test_success_maps_text_and_usage_with_cached_tokens(
    scripted_server: ScriptedServer,
) -> None:
    scripted_server.reply(
        Reply(body=openai_completion("a summary", prompt=120, completion=7, cached=100))
    )
    model = client(scripted_server)
    assert isinstance(model, ChatModel) and isinstance(model, StreamingChatModel)

    done = await model.complete(MESSAGES, max_tokens=64, temperature=0.0)

    assert done.text == "a summary"
    assert done.finish_reason == "stop"
    assert done.usage == Usage(input_tokens=120, output_tokens=7, cached_input_tokens=100)
    assert done.usage.uncached_input_tokens == 20
    (request,) = scripted_server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["x-stainless-retry-count"] == "0"  # SDK retries are off; ours run
    body = request.json
    assert body["messages"] == [
        {"role": "system", "content": "You summarise."},
        {"role": "user", "content": "Summarise this."},
    ]
    assert body["max_tokens"] == 64  # a non-OpenAI URL gets the widely supported field
    assert body["temperature"] == 0.0
    assert "response_format" not in body and "prompt_cache_key" not in body


async def test_json_mode_prompt_cache_key_and_extra_body_are_sent(
    scripted_server: ScriptedServer,
) -> None:
    scripted_server.reply(Reply(body=openai_completion('{"budget": "$500"}')))
    model = client(scripted_server, prompt_cache_key="session-42", extra_body={"top_k": 5})

    done = await model.complete(MESSAGES, json_mode=True)

    assert done.text == '{"budget": "$500"}'
    body = scripted_server.requests[0].json
    assert body["response_format"] == {"type": "json_object"}
    assert body["prompt_cache_key"] == "session-42"
    assert body["top_k"] == 5
    # OpenAI rejects json_object unless a message says "JSON": a hint is appended last,
    # so the cached prefix (system + history) is unchanged.
    assert body["messages"][:2] == [
        {"role": "system", "content": "You summarise."},
        {"role": "user", "content": "Summarise this."},
    ]
    assert body["messages"][-1]["role"] == "system" and "JSON" in body["messages"][-1]["content"]


async def test_json_hint_not_added_when_a_message_mentions_json(
    scripted_server: ScriptedServer,
) -> None:
    scripted_server.reply(Reply(body=openai_completion("{}")))
    await client(scripted_server).complete([Message.user("Return JSON: the facts")], json_mode=True)
    assert len(scripted_server.requests[0].json["messages"]) == 1


async def test_official_endpoint_uses_max_completion_tokens(
    scripted_server: ScriptedServer,
) -> None:
    model = client(scripted_server)
    official = OpenAICompatible(
        "gpt-4o-mini", api_key="sk-test", base_url="https://api.openai.com/v1"
    )
    assert model.max_tokens_field == "max_tokens"
    assert official.max_tokens_field == "max_completion_tokens"


async def test_429_then_success_honours_retry_after(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(
        Reply(429, openai_error("slow down", "rate_limit"), headers={"retry-after": "0.3"}),
        Reply(body=openai_completion("second time lucky")),
    )
    started = time.monotonic()
    done = await client(scripted_server).complete(MESSAGES)
    elapsed = time.monotonic() - started

    assert done.text == "second time lucky"
    assert len(scripted_server.requests) == 2
    assert elapsed >= 0.3  # the server's Retry-After, not the 10 ms backoff


async def test_retry_after_ms_header_is_read(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(
        Reply(429, openai_error("slow down"), headers={"retry-after-ms": "200"}),
        Reply(body=openai_completion("ok")),
    )
    started = time.monotonic()
    await client(scripted_server).complete(MESSAGES)
    assert time.monotonic() - started >= 0.2


async def test_retry_after_beyond_the_cap_gives_up_at_once(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(
        Reply(429, openai_error("come back in an hour"), headers={"retry-after": "3600"})
    )
    model = client(scripted_server, retry=RetryPolicy(max_attempts=4, max_retry_after=5))

    with pytest.raises(ProviderError, match="Retry-After") as info:
        await model.complete(MESSAGES)

    assert info.value.status == 429
    assert len(scripted_server.requests) == 1


async def test_500_every_time_raises_provider_error_after_max_attempts(
    scripted_server: ScriptedServer,
) -> None:
    scripted_server.reply(*[Reply(500, openai_error("boom")) for _ in range(3)])

    with pytest.raises(ProviderError, match="after 3 attempts") as info:
        await client(scripted_server).complete(MESSAGES)

    assert info.value.status == 500
    assert info.value.provider == "openai"
    assert not isinstance(info.value, ProviderTimeout)
    assert len(scripted_server.requests) == 3


async def test_400_is_not_retried(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(Reply(400, openai_error("bad model", "invalid_request_error")))

    with pytest.raises(ProviderError, match="bad model") as info:
        await client(scripted_server).complete(MESSAGES)

    assert info.value.status == 400
    assert len(scripted_server.requests) == 1


async def test_slow_server_raises_provider_timeout(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(*[Reply(body=openai_completion("late"), delay=3.0) for _ in range(2)])
    model = client(
        scripted_server,
        timeout=0.2,
        deadline=1.5,
        retry=RetryPolicy(max_attempts=2, base_delay=0.01),
    )

    started = time.monotonic()
    with pytest.raises(ProviderTimeout, match="timed out"):
        await model.complete(MESSAGES)

    assert time.monotonic() - started < 2.0
    assert len(scripted_server.requests) == 2  # timeouts are retried within the deadline


async def test_timeout_bounds_the_whole_call_with_its_retries(
    scripted_server: ScriptedServer,
) -> None:
    """``timeout=0.3`` with four attempts gives up after 0.3 s, not after 4 x 0.3 s."""
    scripted_server.reply(*[Reply(body=openai_completion("late"), delay=3.0) for _ in range(4)])
    model = client(scripted_server, timeout=0.3, retry=RetryPolicy(max_attempts=4, base_delay=0.01))

    started = time.monotonic()
    with pytest.raises(ProviderTimeout):
        await model.complete(MESSAGES)

    assert time.monotonic() - started < 0.9
    assert len(scripted_server.requests) == 1


async def test_deadline_stops_retrying_a_failing_server(scripted_server: ScriptedServer) -> None:
    """A server answering 503 at once is retried until the next wait would pass the deadline."""
    scripted_server.reply(
        *[Reply(status=503, body={"error": {"message": "busy"}}) for _ in range(6)]
    )
    model = client(
        scripted_server,
        timeout=5.0,
        deadline=0.5,
        retry=RetryPolicy(max_attempts=6, base_delay=0.2, jitter=0.0),
    )
    started = time.monotonic()
    with pytest.raises(ProviderError, match="deadline"):
        await model.complete(MESSAGES)
    assert time.monotonic() - started < 0.8
    assert 2 <= len(scripted_server.requests) < 6


async def test_timeout_then_success(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(
        Reply(body=openai_completion("late"), delay=3.0), Reply(body=openai_completion("fast"))
    )
    done = await client(scripted_server, timeout=0.2, deadline=3.0).complete(MESSAGES)
    assert done.text == "fast"


async def test_malformed_json_body_is_a_provider_error(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(Reply(body='{"id": "chatcmpl-1", "choices": [ oops'))

    with pytest.raises(ProviderError, match="not valid JSON"):
        await client(scripted_server).complete(MESSAGES)

    assert len(scripted_server.requests) == 1


async def test_json_without_choices_is_a_provider_error(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(Reply(body={"id": "x", "object": "chat.completion"}))
    with pytest.raises(ProviderError, match="no choices"):
        await client(scripted_server).complete(MESSAGES)


async def test_missing_usage_counts_zero(scripted_server: ScriptedServer) -> None:
    body = openai_completion("ok")
    del body["usage"]
    scripted_server.reply(Reply(body=body))
    done = await client(scripted_server).complete(MESSAGES)
    assert done.usage == Usage()


async def test_stream_reassembles_text_and_records_usage(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(
        Reply(
            events=openai_stream(
                ["The ", "budget ", "is $500."], prompt=50, completion=6, cached=32
            )
        )
    )
    stream = client(scripted_server).stream(MESSAGES)

    deltas = [d async for d in stream]

    assert deltas == ["The ", "budget ", "is $500."]
    done = stream.completion
    assert done.text == "The budget is $500."
    assert done.finish_reason == "stop"
    assert done.usage == Usage(input_tokens=50, output_tokens=6, cached_input_tokens=32)
    body = scripted_server.requests[0].json
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


async def test_stream_open_is_retried_on_429(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(
        Reply(429, openai_error("slow down")), Reply(events=openai_stream(["hi"]))
    )
    stream = client(scripted_server).stream(MESSAGES)
    assert [d async for d in stream] == ["hi"]
    assert len(scripted_server.requests) == 2


async def test_stream_completion_before_the_end_is_an_error(
    scripted_server: ScriptedServer,
) -> None:
    scripted_server.reply(Reply(events=openai_stream(["a", "b"])))
    stream = client(scripted_server).stream(MESSAGES)
    assert await stream.__anext__() == "a"
    with pytest.raises(Exception, match="not finished"):
        _ = stream.completion
    await stream.aclose()


async def test_ollama_preset_uses_its_key_and_the_given_base_url(
    scripted_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    scripted_server.reply(Reply(body=openai_completion("local")))
    model = OpenAICompatible.ollama("qwen3:8b", base_url=scripted_server.url + "/v1", retry=FAST)

    done = await model.complete(MESSAGES)

    assert done.text == "local"
    assert model.name == "ollama:qwen3:8b"
    request = scripted_server.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer ollama"
    assert request.json["model"] == "qwen3:8b"


def test_preset_default_base_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", "or-key")
    assert OpenAICompatible.ollama("m").base_url == "http://localhost:11434/v1"
    assert OpenAICompatible.openrouter("m").base_url == "https://openrouter.ai/api/v1"
    assert OpenAICompatible.vllm("m").base_url == "http://localhost:8000/v1"
    assert OpenAICompatible.lmstudio("m").base_url == "http://localhost:1234/v1"


async def test_openrouter_preset_reads_its_own_key(
    scripted_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", "or-secret")
    monkeypatch.setenv("OPENAI_API_KEY", "not-this-one")
    scripted_server.reply(Reply(body=openai_completion("routed")))
    model = OpenAICompatible.openrouter(
        "meta-llama/llama-3.1-8b-instruct", base_url=scripted_server.url + "/api/v1", retry=FAST
    )

    await model.complete(MESSAGES)

    request = scripted_server.requests[0]
    assert request.path == "/api/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer or-secret"
    assert request.json["model"] == "meta-llama/llama-3.1-8b-instruct"


def test_missing_openrouter_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENROUTER_API_KEY"):
        OpenAICompatible.openrouter("m")


def test_missing_openai_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAICompatible("gpt-4o-mini")


async def test_env_vars_supply_key_and_base_url(
    scripted_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", scripted_server.url + "/v1")
    scripted_server.reply(Reply(body=openai_completion("from env")))

    done = await OpenAICompatible("gpt-4o-mini", retry=FAST).complete(MESSAGES)

    assert done.text == "from env"
    assert scripted_server.requests[0].headers["authorization"] == "Bearer sk-env"


def test_complete_sync_runs_without_a_loop_and_twice(scripted_server: ScriptedServer) -> None:
    scripted_server.reply(
        Reply(body=openai_completion("one")), Reply(body=openai_completion("two"))
    )
    model = client(scripted_server)
    # each call runs in its own event loop; the client must not reuse the old loop's pool
    assert complete_sync(model, MESSAGES).text == "one"
    assert complete_sync(model, MESSAGES).text == "two"


async def test_complete_sync_inside_a_running_loop_is_refused(
    scripted_server: ScriptedServer,
) -> None:
    from ctxwarden.core.errors import UsageError

    with pytest.raises(UsageError, match="await"):
        complete_sync(client(scripted_server), MESSAGES)
    await asyncio.sleep(0)


def test_missing_sdk_raises_missing_dependency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # makes `import openai` fail
    with pytest.raises(MissingDependencyError, match=r"ctxwarden\[openai\]"):
        OpenAICompatible("gpt-4o-mini", api_key="k")


async def test_connection_refused_is_retried_then_a_provider_error() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAICompatible(
        "gpt-4o-mini", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", retry=FAST
    )
    with pytest.raises(ProviderError, match=r"connection failed.*after 3 attempts") as info:
        await model.complete(MESSAGES)
    assert info.value.status is None
    assert not isinstance(info.value, ProviderTimeout)
