"""The MCP server (``ctxwarden mcp`` over stdio, ``/mcp`` on the service) through the
``mcp`` SDK's own client: the tools are listed, a result the proxy masked comes back byte
for byte, the dropped history is searched by words, and a wrong key is refused. The
session is written the way users write it: the real ``openai`` SDK through ``ctxwarden
serve`` against a scripted upstream, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
import openai
import pytest
from agent_history import coding_history, file_text
from llm_servers import Reply, ScriptedServer, openai_completion
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from service_harness import CLI, ProxyServer, add_tenant, module_db, sid

__all__ = ["module_db"]  # the fixture, re-exported for pytest

HANDLE = re.compile(r"cw:msg:m\d+")
DECOY_M3 = {"role": "tool", "tool_call_id": "call_0", "content": "a short file — “m3” of another"}
TOOLS = {"ctxwarden_recall", "ctxwarden_search"}


@dataclass
class Env:
    db: str
    proxy: ProxyServer
    upstream: ScriptedServer
    key: str
    other_key: str  # another tenant's
    session: str
    handle: str  # the masked result's, as the upstream saw it
    original: str  # what the handle stands for
    decoy: str  # a later session of the same tenant with another m3, shown whole


def _send(proxy: ProxyServer, key: str, session: str, messages: list[Any]) -> None:
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0)
    with client:
        client.chat.completions.create(
            model="gpt-4o", messages=messages, extra_headers={"X-Ctxwarden-Session": session}
        )


@pytest.fixture(scope="module")
def env(module_db: str) -> Iterator[Env]:
    upstream = ScriptedServer(lambda _: Reply(body=openai_completion("done"))).start()
    key = add_tenant(module_db, "acme")
    other_key = add_tenant(module_db, "globex")
    proxy = ProxyServer(module_db, upstream=upstream.url + "/v1")
    try:
        session = sid()
        _send(proxy, key, session, coding_history())
        seen = json.dumps(upstream.requests[-1].json["messages"], ensure_ascii=False)
        assert "[tool result masked" in seen and file_text(0) not in seen
        handle = HANDLE.findall(seen)[0]
        assert handle == "cw:msg:m3"  # the first read_file result (system m0, task m1, call m2)
        # a later, shorter session of the same tenant whose m3 (another file) is shown
        # whole: a handle with no session named goes to the session whose context shows it
        decoy = sid()
        _send(proxy, key, decoy, [*coding_history("Another task", reads=1)[:3], DECOY_M3,
                                  {"role": "user", "content": "Go on."}])  # fmt: skip
        yield Env(module_db, proxy, upstream, key, other_key, session, handle, file_text(0), decoy)
    finally:
        proxy.stop()
        upstream.stop()


async def _check_tools(client: ClientSession, env: Env) -> None:
    """The tools are listed; the masked result comes back whole; search finds it."""
    await client.initialize()
    listed = await client.list_tools()
    assert {t.name for t in listed.tools} == TOOLS
    got = await client.call_tool("ctxwarden_recall", {"handle": env.handle})
    assert not got.is_error
    assert [c.type for c in got.content] == ["text"]
    assert got.content[0].text == env.original  # type: ignore[union-attr]
    assert got.content[0].text.encode() == env.original.encode()  # type: ignore[union-attr]
    named = await client.call_tool(
        "ctxwarden_recall", {"handle": env.handle, "session": env.session}
    )
    assert named.content[0].text == env.original  # type: ignore[union-attr]
    other = await client.call_tool("ctxwarden_recall", {"handle": "m3", "session": env.decoy})
    assert other.is_error  # not a handle
    other = await client.call_tool(
        "ctxwarden_recall", {"handle": "cw:msg:m3", "session": env.decoy}
    )
    assert other.content[0].text == DECOY_M3["content"]  # type: ignore[union-attr]
    found = await client.call_tool(
        "ctxwarden_search", {"words": "zebra0 mod0", "session": env.session}
    )
    assert not found.is_error
    hits = json.loads(found.content[0].text)["hits"]  # type: ignore[union-attr]
    assert hits and hits[0]["handle"] == env.handle
    assert (hits[0]["role"], hits[0]["name"]) == ("tool", "read_file")
    shown = await client.call_tool(
        "ctxwarden_search", {"words": "failing parser", "session": env.session}
    )  # the task (m1) is in the context whole: not dropped history
    assert json.loads(shown.content[0].text)["hits"] == []  # type: ignore[union-attr]
    missing = await client.call_tool("ctxwarden_recall", {"handle": "cw:msg:m999"})
    assert missing.is_error
    assert "m999" in missing.content[0].text  # type: ignore[union-attr]


def _stdio(env: Env, tenant: str) -> StdioServerParameters:
    keep = {k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "CTXWARDEN_"))}
    return StdioServerParameters(
        command=CLI, args=["mcp", "--db", env.db, "--tenant", tenant], env=keep
    )


async def test_stdio(env: Env) -> None:
    async with (
        stdio_client(_stdio(env, "acme"), errlog=sys.stderr) as (read, write),
        ClientSession(read, write) as client,
    ):
        await _check_tools(client, env)


async def test_stdio_reads_only_its_tenant(env: Env) -> None:
    async with (
        stdio_client(_stdio(env, "globex"), errlog=sys.stderr) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        got = await client.call_tool("ctxwarden_recall", {"handle": env.handle})
        assert got.is_error and env.original not in str(got.content)


@asynccontextmanager
async def _http(
    env: Env, key: str, more: dict[str, str] | None = None
) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {key}", **(more or {})}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(env.proxy.url + "/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as client,
    ):
        yield client


async def test_http(env: Env) -> None:
    async with _http(env, env.key) as client:
        await _check_tools(client, env)


async def test_http_session_header_is_the_hint(env: Env) -> None:
    async with _http(env, env.key, {"X-Ctxwarden-Session": env.decoy}) as client:
        await client.initialize()
        got = await client.call_tool("ctxwarden_recall", {"handle": env.handle})
        assert got.content[0].text == DECOY_M3["content"]  # type: ignore[union-attr]


async def test_http_reads_only_the_keys_tenant(env: Env) -> None:
    async with _http(env, env.other_key) as client:
        await client.initialize()
        got = await client.call_tool("ctxwarden_recall", {"handle": env.handle})
        assert got.is_error and env.original not in str(got.content)


async def test_http_refuses_a_wrong_key(env: Env) -> None:
    """The SDK's client fails at ``initialize``; the answer it got is a 401 with the
    service's authentication error (checked without the SDK, which does not show it)."""
    with pytest.raises(ExceptionGroup) as refused:
        async with _http(env, "cwk_not-a-key") as client:
            await client.initialize()
    assert refused.group_contains(MCPError, depth=None)
    for headers in ({}, {"Authorization": "Bearer cwk_not-a-key"}):
        answer = httpx2.post(
            env.proxy.url + "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={**headers, "Accept": "application/json, text/event-stream"},
        )
        assert answer.status_code == 401
        error = answer.json()["error"]
        assert error["type"] == "authentication_error"
        assert ("missing API key" if not headers else "invalid or revoked") in error["message"]
