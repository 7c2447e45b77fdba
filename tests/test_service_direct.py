"""The proxied routes, served past the framework's layers (``service.direct``), answer
exactly as they do through them: the same status, body and content type for every
answer and refusal, and the same request counts."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_servers import Recorded, Reply, ScriptedServer, anthropic_message, openai_error
from starlette.testclient import TestClient

from ctxwarden.service import ServiceConfig, create_app
from ctxwarden.service.keys import hash_key, shown_prefix
from ctxwarden.store import open_store
from ctxwarden.store.service_tables import add_tenant

CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"


def _answer(request: Recorded) -> Reply:
    body = request.json
    if body["messages"][-1].get("content") == "fail upstream":
        return Reply(status=503, body=openai_error("overloaded"))
    if request.path.endswith("/messages"):
        return Reply(body=anthropic_message("ok"))
    return Reply(body={"choices": [{"message": {"role": "assistant", "content": "ok"}}]})


@pytest.fixture
def upstream() -> Iterator[ScriptedServer]:
    server = ScriptedServer(_answer).start()
    try:
        yield server
    finally:
        server.stop()


def _client(tmp_path: Path, name: str, upstream: ScriptedServer, direct: bool) -> TestClient:
    """The app on its own SQLite file with tenant ``t`` (key: the file's name), served
    directly or (``direct=False``) through the framework's stack."""
    db = f"sqlite:///{tmp_path / name}"
    with open_store(db) as store:
        add_tenant(store, "t", key_hash=hash_key(name), key_prefix=shown_prefix(name))
    app = create_app(_config(db, upstream))
    if not direct:
        app.direct = None  # type: ignore[attr-defined]
    return TestClient(app, raise_server_exceptions=False)


def _config(db: str, upstream: ScriptedServer) -> ServiceConfig:
    return ServiceConfig(db=db, upstream=upstream.url + "/v1", max_body_bytes=64 * 1024)


def _both(tmp_path: Path, upstream: ScriptedServer) -> list[tuple[TestClient, str]]:
    return [(_client(tmp_path, f"cwk_{kind}", upstream, kind == "direct"), f"cwk_{kind}")
            for kind in ("direct", "stack")]  # fmt: skip


def _chat(content: str, **more: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": content}], **more}


def _claude(content: str) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 64,
            "messages": [{"role": "user", "content": content}]}  # fmt: skip


def _ruled(content: str) -> dict[str, Any]:
    rules = {"role": "system", "content": "rules " * 200}
    return {"model": "gpt-4o", "messages": [rules, {"role": "user", "content": content}]}


Ask = Callable[[str], tuple[str, bytes, dict[str, str]]]
"""A request for a tenant key: path, body, headers."""


def _asks() -> dict[str, Ask]:
    def post(path: str, body: Any, **headers: str) -> Ask:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return lambda key: (path, raw, {"authorization": f"Bearer {key}", **headers})

    def unauthenticated(path: str, body: Any, **headers: str) -> Ask:
        return lambda key: (path, json.dumps(body).encode(), headers)

    return {
        "answered": post(CHAT, _chat("hello"), **{"x-ctxwarden-session": "s1"}),
        "streamed": post(CHAT, _chat("hello", stream=True)),
        "no key": unauthenticated(CHAT, _chat("hello")),
        "unknown key": unauthenticated(CHAT, _chat("x"), authorization="Bearer cwk_nobody"),
        "not JSON": post(CHAT, b"{not json"),
        "no messages": post(CHAT, {"model": "gpt-4o", "messages": []}),
        "over the body limit": post(CHAT, _chat("x" * 70_000)),
        "budget below the system prompt": post(
            CHAT, _ruled("hi"), **{"x-ctxwarden-max-input-tokens": "10"}
        ),
        "upstream refuses": post(CHAT, _chat("fail upstream")),
        "anthropic without an upstream": post(MESSAGES, _claude("hello")),
        "anthropic without a key": unauthenticated(MESSAGES, _claude("hello")),
    }


def _comparable(response: Any) -> tuple[int, str, Any]:
    kind = response.headers.get("content-type", "")
    if "json" not in kind:
        return response.status_code, kind, response.content
    body = response.json()
    if isinstance(body, dict) and "id" in body and str(body["id"]).startswith("cw"):
        body = {k: v for k, v in body.items() if k != "id"}
    return response.status_code, kind, body


def _counts(client: TestClient) -> dict[str, str]:
    text = client.get("/metrics").text
    line = r'ctxwarden_requests_total\{route="(/v1/[^"]+)",status="(\d+)"\} (\S+)'
    found = re.findall(line, text)
    return {f"{route} {status}": n for route, status, n in found}


def test_every_answer_and_refusal_is_the_same_past_the_stack(
    tmp_path: Path, upstream: ScriptedServer
) -> None:
    clients = _both(tmp_path, upstream)
    asks = _asks()
    with clients[0][0], clients[1][0]:
        for name, ask in asks.items():
            answers = []
            for client, key in clients:
                path, raw, headers = ask(key)
                headers = {"content-type": "application/json", **headers}
                answers.append(client.post(path, content=raw, headers=headers))
            direct, stack = answers
            assert _comparable(direct) == _comparable(stack), name
            for header in ("x-ctxwarden-input-tokens", "x-ctxwarden-saved-tokens"):
                assert direct.headers.get(header) == stack.headers.get(header), (name, header)
        counts = [_counts(client) for client, _ in clients]
    assert counts[0] == counts[1]
    statuses = {k.split()[1] for k in counts[0]}
    assert {"200", "400", "401", "404", "413", "503"} <= statuses


def test_other_methods_on_the_proxied_paths_still_go_through_the_stack(
    tmp_path: Path, upstream: ScriptedServer
) -> None:
    client = _client(tmp_path, "cwk_direct", upstream, direct=True)
    with client:
        wrong = client.get(CHAT, headers={"authorization": "Bearer cwk_direct"})
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
        assert wrong.json()["error"]["message"] == "Method Not Allowed"
        anthropic = client.put(MESSAGES, headers={"x-api-key": "cwk_direct"})
        assert anthropic.status_code == 405 and anthropic.json()["type"] == "error"
        assert _counts(client) == {f"{CHAT} 405": "1.0", f"{MESSAGES} 405": "1.0"}


def test_a_failure_of_the_proxy_itself_is_a_500_and_counted(
    tmp_path: Path,
    upstream: ScriptedServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import ctxwarden.service.openai_proxy as openai_proxy

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(openai_proxy, "forward", broken)
    client = _client(tmp_path, "cwk_direct", upstream, direct=True)
    with client:
        answer = client.post(CHAT, json=_chat("hi"), headers={"authorization": "Bearer cwk_direct"})
        assert answer.status_code == 500
        assert answer.json()["error"]["code"] == "internal_error"  # JSON, the route's shape
        assert _counts(client) == {f"{CHAT} 500": "1.0"}
    # answered, logged with its traceback, and kept from the server (which would end the
    # connection): the failures layer (service/failures.py)
    quiet = TestClient(create_app(_config(f"sqlite:///{tmp_path / 'cwk_direct'}", upstream)))
    with quiet, caplog.at_level("ERROR", logger="ctxwarden.service"):
        got = quiet.post(CHAT, json=_chat("hi"), headers={"authorization": "Bearer cwk_direct"})
        assert got.status_code == 500 and "RuntimeError" in got.json()["error"]["message"]
    assert any(r.exc_info and "a bug" in str(r.exc_info[1]) for r in caplog.records)
