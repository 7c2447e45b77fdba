"""Streams under stress: a client leaving mid-stream, the server SIGKILLed mid-stream,
and a bounded loopback load of concurrent streaming clients (0 errors, 0 lost or
duplicated stored messages), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from typing import Any

import httpx2
import openai
from llm_servers import Recorded, Reply, ScriptedServer, openai_stream
from service_harness import ProxyServer, add_tenant, db_url, sid

from ctxwarden import open_store

__all__ = ["db_url"]


def slow_stream(words: int = 30, every: float = 0.15) -> Reply:
    return Reply(events=openai_stream([f"w{i} " for i in range(words)]), frame_delay=every)


def wait_for(check: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def builds(proxy: ProxyServer, key: str, session: str) -> list[dict[str, Any]]:
    status, body = proxy.get(f"/v1/sessions/{session}/builds", key)
    return list(body["builds"]) if status == 200 else []


def test_client_leaving_mid_stream_cancels_upstream_and_stores_the_partial(db_url: str) -> None:
    upstream = ScriptedServer().start()
    key = add_tenant(db_url, "acme")
    proxy = ProxyServer(db_url, upstream=upstream.url + "/v1")
    try:
        session = sid()
        upstream.reply(slow_stream())
        body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "go"}]}
        headers = {"authorization": f"Bearer {key}", "x-ctxwarden-session": session}
        with httpx2.stream(
            "POST", proxy.url + "/v1/chat/completions", json=body, headers=headers
        ) as r:
            seen = b""
            for chunk in r.iter_bytes():
                seen += chunk
                if b"w2 " in seen:
                    break  # hang up after three words
        final = wait_for(
            lambda: [b for b in builds(proxy, key, session) if b["status"] != "forwarded"]
        )
        assert final[-1]["status"] == "client_disconnected"
        wait_for(lambda: upstream.aborted)  # the proxy closed its upstream call
        _, page = proxy.get(f"/v1/sessions/{session}/messages?meta=true", key)
        last = page["messages"][-1]
        assert last["role"] == "assistant" and last["content"].startswith("w0 w1 w2")
        assert last["ctxwarden"]["meta"]["partial"] is True
        assert "w29" not in last["content"]
    finally:
        proxy.stop()
        upstream.stop()


def _sqlite_path(url: str) -> str | None:
    return url[len("sqlite:///") :] if url.startswith("sqlite:///") else None


def test_sigkill_mid_stream_leaves_the_store_consistent(db_url: str) -> None:
    upstream = ScriptedServer().start()
    key = add_tenant(db_url, "acme")
    proxy = ProxyServer(db_url, upstream=upstream.url + "/v1")
    session = sid()
    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": "long answer"}]
    got_bytes = threading.Event()
    errors: list[BaseException] = []

    def stream() -> None:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0)
        try:
            for _ in client.chat.completions.create(
                model="gpt-4o", messages=history, stream=True,
                extra_headers={"X-Ctxwarden-Session": session},
            ):  # fmt: skip
                got_bytes.set()
        except BaseException as exc:  # the server died under it
            errors.append(exc)
        finally:
            client.close()

    upstream.reply(slow_stream(words=40, every=0.1))
    worker = threading.Thread(target=stream)
    worker.start()
    try:
        assert got_bytes.wait(10)
        proxy.kill()
        worker.join(10)
        assert errors, "the client should see the connection die"
        path = _sqlite_path(db_url)
        if path is not None:
            with sqlite3.connect(path) as conn:
                assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        with open_store(db_url) as store:
            stored = [m.message for m in store.iter_messages("acme", session)]
            assert [m.role for m in stored] == ["system", "user"]  # no half-written reply
        # a restarted server continues the same session: the history matches its head
        upstream.reply(Reply(events=openai_stream(["done"])))
        proxy = ProxyServer(db_url, upstream=upstream.url + "/v1")
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0)
        with client:
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4o", messages=history, stream=True,
                extra_headers={"X-Ctxwarden-Session": session},
            )  # fmt: skip
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        assert text == "done" and raw.headers["x-ctxwarden-session"] == session
        with open_store(db_url) as store:
            stored = [m.message for m in store.iter_messages("acme", session)]
        assert [(m.role, m.text) for m in stored] == [
            ("system", "sys"), ("user", "long answer"), ("assistant", "done"),
        ]  # fmt: skip
        statuses = [b["status"] for b in builds(proxy, key, session)]
        assert statuses == ["forwarded", "complete"]  # the killed call's row says so
    finally:
        proxy.stop()
        upstream.stop()


def echo_stream(request: Recorded) -> Reply:
    n = len(request.json["messages"])
    return Reply(events=openai_stream([f"reply to {n}", " messages"], prompt=n, completion=3))


async def _agent(client: openai.AsyncOpenAI, session: str, turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": f"agent {session}"}]
    for turn in range(turns):
        history.append({"role": "user", "content": f"{session} turn {turn}"})
        stream = await client.chat.completions.create(
            model="gpt-4o", messages=history, stream=True,
            extra_headers={"X-Ctxwarden-Session": session},
        )  # fmt: skip
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == f"reply to {len(history)} messages"
        history.append({"role": "assistant", "content": text})
    return history


def test_concurrent_streaming_clients_lose_nothing(db_url: str) -> None:
    clients, turns = 48, 4
    upstream = ScriptedServer(echo_stream).start()
    key = add_tenant(db_url, "acme")
    proxy = ProxyServer(db_url, upstream=upstream.url + "/v1")

    async def run() -> list[Any]:
        http = httpx2.AsyncClient(limits=httpx2.Limits(max_connections=clients), timeout=60)
        client = openai.AsyncOpenAI(
            base_url=proxy.url + "/v1", api_key=key, max_retries=0, http_client=http
        )
        sessions = [sid() for _ in range(clients)]
        try:
            done = await asyncio.wait_for(
                asyncio.gather(
                    *(_agent(client, s, turns) for s in sessions), return_exceptions=True
                ),
                timeout=120,
            )
        finally:
            await client.close()
        return list(zip(sessions, done, strict=True))

    try:
        results = asyncio.run(run())
        errors = [r for _, r in results if isinstance(r, BaseException)]
        assert errors == []
        with open_store(db_url) as store:
            for session, history in results:
                stored = [
                    {"role": m.message.role, "content": m.message.text}
                    for m in store.iter_messages("acme", session)
                ]
                assert stored == history  # every message once, in order, no branch
        assert len(upstream.requests) == clients * turns
    finally:
        proxy.stop()
        upstream.stop()
