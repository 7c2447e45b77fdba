"""The service edge against a hostile client (issue 41): ``ctxwarden serve`` as a process on
SQLite and PostgreSQL, spoken to over one raw keep-alive connection, so each refusal is
checked to be a clear JSON 4xx in the route's shape, to store nothing, to leave the
session readable and usable, and to leave the connection serving the next request
(except a request head refused: that connection ends, as it must)."""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from llm_servers import (
    Recorded,
    Reply,
    ScriptedServer,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_stream,
)
from service_harness import ProxyServer, add_tenant, cli, module_db, sid

from ctxwarden import Session
from ctxwarden.service.keys import hash_key

__all__ = ["module_db"]

CLAUDE = "claude-sonnet-4-5"


def _answer(request: Recorded) -> Reply:
    stream = bool(request.json.get("stream"))
    if request.path.endswith("/messages"):
        if stream:
            return Reply(events=anthropic_stream(["fi", "ne"], input_tokens=9, output_tokens=1))
        return Reply(body=anthropic_message("fine", input_tokens=9, output_tokens=1))
    if stream:
        return Reply(events=openai_stream(["fi", "ne"], prompt=9, completion=1))
    return Reply(body=openai_completion("fine", prompt=9, completion=1))


@dataclass
class Edge:
    proxy: ProxyServer
    upstream: ScriptedServer
    key: str
    db: str

    def conn(self) -> Conn:
        return Conn(self)


class Conn:
    """One keep-alive connection; every answer must be JSON (or empty for a 204)."""

    def __init__(self, edge: Edge) -> None:
        self.edge = edge
        self.http = http.client.HTTPConnection("127.0.0.1", edge.proxy.port, timeout=60)
        self.sock_id: int | None = None

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        sent = {"authorization": f"Bearer {self.edge.key}", "content-type": "application/json"}
        self.http.request(method, path, data, {**sent, **(headers or {})})
        sock = self.http.sock
        if self.sock_id is None:
            self.sock_id = id(sock)
        assert id(sock) == self.sock_id, "the connection was replaced"
        answer = self.http.getresponse()
        payload = answer.read()
        if answer.status == 204:
            return 204, None
        assert answer.getheader("content-type", "").startswith("application/json"), payload[:200]
        assert not answer.will_close, f"the server ended the connection after {answer.status}"
        return answer.status, json.loads(payload)

    def chat(self, session: str, messages: list[Any], **headers: str) -> tuple[int, Any]:
        body = {"model": "gpt-4o", "messages": messages}
        return self.call(
            "POST",
            "/v1/chat/completions",
            body,
            headers={"x-ctxwarden-session": session, **headers},
        )

    def stored(self, session: str) -> list[dict[str, Any]]:
        status, body = self.call("GET", f"/v1/sessions/{session}/messages?limit=1000")
        assert status == 200, body
        return list(body["messages"])

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture(scope="module")
def edge(module_db: str) -> Iterator[Edge]:
    upstream = ScriptedServer(_answer).start()
    key = add_tenant(module_db, "edge")
    proxy = ProxyServer(
        module_db,
        upstream=upstream.url + "/v1",
        anthropic_upstream=upstream.url,
        extra=("--header-timeout", "2", "--max-body-mb", "16"),
    )
    try:
        yield Edge(proxy, upstream, key, module_db)
    finally:
        proxy.stop()
        upstream.stop()


@pytest.fixture
def conn(edge: Edge) -> Iterator[Conn]:
    c = edge.conn()
    try:
        yield c
    finally:
        c.close()


def _error(body: Any, api: str = "openai") -> dict[str, Any]:
    if api == "anthropic":
        assert body["type"] == "error"
    error: dict[str, Any] = body["error"]
    assert isinstance(error["type"], str) and isinstance(error["message"], str)
    return error


LONE = b'"a \\ud800 b"'  # JSON text with a lone surrogate escape (valid JSON, invalid Unicode)


def test_a_lone_surrogate_is_refused_everywhere_and_poisons_nothing(conn: Conn) -> None:
    session = sid()
    first = [{"role": "user", "content": "hello"}]
    assert conn.chat(session, first)[0] == 200
    before = conn.stored(session)
    history = [*first, {"role": "assistant", "content": "fine"}]
    bad = (
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"},'
        b' {"role": "assistant", "content": "fine"}, {"role": "user", "content": [{"type":'
        b' "text", "text": ' + LONE + b"}]}]}"
    )
    status, body = conn.call(
        "POST", "/v1/chat/completions", raw=bad, headers={"x-ctxwarden-session": session}
    )
    error = _error(body)
    assert (status, error["code"]) == (400, "invalid_unicode")
    assert error["param"] == "messages[2].content[0].text"  # the message and the field
    assert conn.stored(session) == before  # nothing of the refused call was stored
    # the session, read and used on the same connection
    assert conn.chat(session, [*history, {"role": "user", "content": "next"}])[0] == 200
    assert [m["content"] for m in conn.stored(session)] == ["hello", "fine", "next", "fine"]
    built = conn.call("POST", f"/v1/sessions/{session}/build", {"model": "gpt-4o"})
    assert built[0] == 200

    raw = (
        b'{"model": "' + CLAUDE.encode() + b'", "max_tokens": 5, "messages": '
        b'[{"role": "user", "content": ' + LONE + b"}]}"
    )
    status, body = conn.call(
        "POST", "/v1/messages", raw=raw, headers={"x-ctxwarden-session": sid()}
    )
    error = _error(body, "anthropic")
    assert (status, error["code"], error["param"]) == (
        400,
        "invalid_unicode",
        "messages[0].content",
    )

    api = sid()
    raw = b'{"messages": [{"role": "user", "content": ' + LONE + b"}]}"
    status, body = conn.call("POST", f"/v1/sessions/{api}/messages", raw=raw)
    assert (status, _error(body)["param"]) == (400, "messages[0].content")
    assert conn.call("GET", f"/v1/sessions/{api}")[0] == 404  # not created
    assert conn.call("GET", "/healthz")[0] == 200


def test_deep_nesting_is_refused_by_a_limit_on_every_route(conn: Conn) -> None:
    deep = b"[" * 10_000 + b"]" * 10_000
    for path, body in (
        ("/v1/chat/completions", b'{"model": "gpt-4o", "messages": [{"role": "user", "content": '),
        (
            "/v1/messages",
            b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": ',
        ),
        (f"/v1/sessions/{sid()}/messages", b'{"messages": [{"role": "user", "content": '),
    ):
        status, answer = conn.call("POST", path, raw=body + deep + b"}]}")
        api = "anthropic" if path == "/v1/messages" else "openai"
        assert (status, _error(answer, api)["code"]) == (400, "nesting_too_deep"), path
    # nested within the parse limit, in a message: the message's own limit names it
    medium = b"[" * 300 + b"]" * 300
    body = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": ' + medium + b"}]}"
    status, answer = conn.call("POST", "/v1/chat/completions", raw=body)
    assert status == 400 and "message 0" in _error(answer)["message"]
    assert conn.chat(sid(), [{"role": "user", "content": "after"}])[0] == 200


def test_nan_and_broken_json_are_clear_400s(conn: Conn) -> None:
    nan = b'{"model": "gpt-4o", "temperature": NaN, "messages": [{"role": "user", "content": "x"}]}'
    status, body = conn.call("POST", "/v1/chat/completions", raw=nan)
    assert (status, _error(body)["code"]) == (400, "invalid_json")
    status, body = conn.call("POST", f"/v1/sessions/{sid()}/messages", raw=b'{"messages": [')
    assert (status, _error(body)["type"]) == (400, "invalid_request_error")
    assert conn.call("GET", "/v1/sessions")[0] == 200


def test_the_body_cap_holds_on_the_session_api(conn: Conn, edge: Edge) -> None:
    session = sid()
    big = {"messages": [{"role": "user", "content": "x" * (40 * 1024 * 1024)}]}
    status, body = conn.call("POST", f"/v1/sessions/{session}/messages", big)
    assert status == 413 and "over" in _error(body)["message"]
    assert conn.call("GET", f"/v1/sessions/{session}")[0] == 404  # nothing stored
    # a body without a length (chunked) is counted as it arrives
    sock = socket.create_connection(("127.0.0.1", edge.proxy.port), timeout=30)
    try:
        head = (
            f"POST /v1/sessions/{session}/messages HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {edge.key}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        ).encode()
        sock.sendall(head)
        chunk = b"x" * (1024 * 1024)
        for _ in range(20):
            try:
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            except OSError:
                break
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
    finally:
        sock.close()
    assert (
        conn.call(
            "POST",
            f"/v1/sessions/{session}/messages",
            {"messages": [{"role": "user", "content": "ok"}]},
        )[0]
        == 200
    )


def test_a_call_the_budget_cannot_hold_stores_nothing(conn: Conn) -> None:
    session = sid()
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert conn.chat(session, first)[0] == 200
    before = conn.stored(session)
    huge = [
        *first,
        {"role": "assistant", "content": "fine"},
        {"role": "user", "content": "word " * 400_000},
    ]
    for api in ("openai", "anthropic"):
        if api == "openai":
            status, body = conn.chat(session, huge, **{"x-ctxwarden-max-input-tokens": "5000"})
        else:
            turns = [{"role": m["role"], "content": m["content"]} for m in huge[1:]]
            status, body = conn.call(
                "POST", "/v1/messages",
                {"model": CLAUDE, "max_tokens": 5, "system": "be brief", "messages": turns},
                headers={"x-ctxwarden-session": session, "x-ctxwarden-max-input-tokens": "5000"},
            )  # fmt: skip
        error = _error(body, api)
        assert (status, error["code"]) == (400, "context_budget_too_small"), body
        assert error["minimum_budget"] > 5000
    assert conn.stored(session) == before  # refused: nothing of it stored
    follow = [*first, {"role": "assistant", "content": "fine"}, {"role": "user", "content": "ok"}]
    assert conn.chat(session, follow)[0] == 200
    assert [m["content"] for m in conn.stored(session)][-2:] == ["ok", "fine"]


def test_a_call_whose_tools_the_budget_cannot_hold_stores_nothing(conn: Conn) -> None:
    """The system prompt and the newest message fit; with the request's tools they do not:
    refused before anything is stored, as the build would refuse it after."""
    session = sid()
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert conn.chat(session, first)[0] == 200
    before = conn.stored(session)
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": "word " * 200,
                                          "parameters": {"type": "object", "properties": {}}}}
        for i in range(30)
    ]  # fmt: skip
    turns = [*first, {"role": "assistant", "content": "fine"}, {"role": "user", "content": "go"}]
    status, body = conn.call(
        "POST", "/v1/chat/completions", {"model": "gpt-4o", "messages": turns, "tools": tools},
        headers={"x-ctxwarden-session": session, "x-ctxwarden-max-input-tokens": "2000"},
    )  # fmt: skip
    error = _error(body)
    assert (status, error["code"]) == (400, "context_budget_too_small"), body
    assert error["minimum_budget"] > 2000
    assert conn.stored(session) == before  # nothing of the refused call
    assert conn.chat(session, turns)[0] == 200  # the same turn without the tools goes on
    assert [m["content"] for m in conn.stored(session)][-2:] == ["go", "fine"]


def test_a_call_that_fits_only_without_the_stored_system_prompt_stores_nothing(
    conn: Conn,
) -> None:
    """The system prompt was stored by the session's first call; a later call's newest
    message fits the budget alone but not beside that prompt: refused before its new
    messages are stored."""
    session = sid()
    system = {"role": "system", "content": "rule " * 1500}
    first = [system, {"role": "user", "content": "hi"}]
    assert conn.chat(session, first, **{"x-ctxwarden-max-input-tokens": "8000"})[0] == 200
    before = conn.stored(session)
    turns = [
        *first,
        {"role": "assistant", "content": "fine"},
        {"role": "user", "content": "word " * 2500},
    ]
    status, body = conn.chat(session, turns, **{"x-ctxwarden-max-input-tokens": "3000"})
    error = _error(body)
    assert (status, error["code"]) == (400, "context_budget_too_small"), body
    assert error["minimum_budget"] > 4000  # the stored prompt counted
    assert conn.stored(session) == before  # nothing of the refused call
    assert conn.chat(session, turns, **{"x-ctxwarden-max-input-tokens": "8000"})[0] == 200


def _ask(
    clients: tuple[Any, Any],
    api: str,
    stream: bool,
    turns: list[Any],
    session: str,
    retry: int = 0,
) -> tuple[str, str | None]:
    """One call through the real SDK of ``api``: the reply's text and whether it was
    replayed (``x-ctxwarden-replayed``); ``retry``: the retry count the SDKs send when
    they send a request again (``x-stainless-retry-count``)."""
    oai, ant = clients
    head = {"x-ctxwarden-session": session}
    if retry:
        head["x-stainless-retry-count"] = str(retry)
    if api == "openai":
        raw = oai.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=turns, stream=stream, extra_headers=head
        )
        got = raw.parse()
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in got if c.choices)
        else:
            text = got.choices[0].message.content or ""
        return text, raw.headers.get("x-ctxwarden-replayed")
    if stream:
        with ant.messages.stream(
            model=CLAUDE, max_tokens=9, messages=turns, extra_headers=head
        ) as s:
            return "".join(s.text_stream), s.response.headers.get("x-ctxwarden-replayed")
    raw = ant.messages.with_raw_response.create(
        model=CLAUDE, max_tokens=9, messages=turns, extra_headers=head
    )
    return raw.parse().content[0].text, raw.headers.get("x-ctxwarden-replayed")


def test_a_retried_call_gets_the_stored_reply_and_forks_nothing(edge: Edge) -> None:
    """A client that timed out sends the same request again: the stored reply comes back
    (JSON or streamed, read by the real SDKs), upstream is not called again, and the
    session holds the exchange once, on no branch."""
    import anthropic
    import openai

    oai = openai.OpenAI(base_url=edge.proxy.url + "/v1", api_key=edge.key, max_retries=0)
    ant = anthropic.Anthropic(base_url=edge.proxy.url, api_key=edge.key, max_retries=0)
    for api in ("openai", "anthropic"):
        for stream in (False, True):
            session = sid()
            turns: list[Any] = [{"role": "user", "content": "what is 2+2?"}]
            calls = len(edge.upstream.requests)
            assert _ask((oai, ant), api, stream, turns, session) == ("fine", None)
            # the same request again, as the SDK's own retry sends it
            again = _ask((oai, ant), api, stream, turns, session, retry=1)
            assert again == ("fine", "1"), (api, stream)
            assert len(edge.upstream.requests) == calls + 1  # upstream was called once
            with Conn(edge) as c:
                assert [m["content"] for m in c.stored(session)] == ["what is 2+2?", "fine"]
                listed = c.call("GET", "/v1/sessions")[1]["sessions"]
                assert not [x for x in listed if x["id"].startswith(session + "~")]  # no fork
            # the conversation goes on from there as usual
            turns += [{"role": "assistant", "content": "fine"}, {"role": "user", "content": "3+3?"}]
            assert _ask((oai, ant), api, stream, turns, session) == ("fine", None)
    oai.close()
    ant.close()


def test_session_ids_follow_one_grammar(conn: Conn, edge: Edge) -> None:
    msg = [{"role": "user", "content": "x"}]
    for bad in ("a/b/c", "..", ".hidden", "x" * 201, "tab\tbed", "branch~b7"):
        status, body = conn.chat(sid(), msg, **{"x-ctxwarden-session": bad})
        assert (status, _error(body)["code"]) == (400, "invalid_session_id"), bad
        quoted = urllib.parse.quote(bad, safe="")
        status, body = conn.call("POST", f"/v1/sessions/{quoted}/messages", {"messages": msg})
        assert status == 400 and "session id" in _error(body)["message"], bad
    for bad in ("a%00b", "x" * 2000):  # NUL, far too long: never storable, on any route
        for method, path in (
            ("POST", f"/v1/sessions/{bad}/messages"),
            ("GET", f"/v1/sessions/{bad}/messages"),
            ("GET", f"/v1/sessions/{bad}"),
            ("DELETE", f"/v1/sessions/{bad}"),
        ):
            status, body = conn.call(method, path, {"messages": msg} if method == "POST" else None)
            assert status == 400 and "session id" in _error(body)["message"], (method, path[:40])
    # a good id works on the proxy, the API and the page alike
    good = "team_1:agent@run-2.5"
    assert conn.chat(good, msg)[0] == 200
    assert conn.stored(good)[0]["content"] == "x"


def test_ids_stored_before_the_rule_stay_readable_and_deletable(conn: Conn, edge: Edge) -> None:
    old = f"legacy/{sid()}/run"  # the proxy took "/" before the rule
    with Session(edge.db, old, tenant="edge") as s:
        s.append([{"role": "user", "content": "kept"}])
    assert conn.stored(old) == [{"role": "user", "content": "kept"}]
    assert conn.call("GET", f"/v1/sessions/{old}")[1]["id"] == old
    assert (
        conn.call(
            "POST",
            f"/v1/sessions/{old}/messages",
            {"messages": [{"role": "assistant", "content": "more"}]},
        )[0]
        == 200
    )
    assert conn.call("DELETE", f"/v1/sessions/{old}")[0] == 204
    assert conn.call("GET", f"/v1/sessions/{old}")[0] == 400  # gone, and not a valid new id


def test_a_session_holding_a_lone_surrogate_from_before_stays_readable(
    conn: Conn, edge: Edge
) -> None:
    session = sid()
    with Session(edge.db, session, tenant="edge") as s:  # as an older version stored it
        s.append(
            [
                {"role": "user", "content": "cut \ud83d emoji"},
                {"role": "assistant", "content": "ok"},
            ]
        )
    assert [m["content"] for m in conn.stored(session)] == ["cut \ufffd emoji", "ok"]
    assert conn.call("GET", f"/v1/sessions/{session}")[0] == 200
    status, built = conn.call("POST", f"/v1/sessions/{session}/build", {"model": "gpt-4o"})
    assert status == 200 and built["messages"][0]["content"] == "cut \ufffd emoji"
    # and usable through the proxy: a clean call on it is forwarded (the old text as the
    # escape it was sent as), nothing is lost
    edge.upstream.requests.clear()
    history = [{"role": "user", "content": "fresh start"}]
    assert conn.chat(session, history)[0] == 200
    assert conn.stored(session)[0]["content"] == "cut \ufffd emoji"


def _read_answer(sock: socket.socket) -> bytes:
    """One HTTP answer with a Content-Length body, read off ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {data[:80]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _next_request_served(sock: socket.socket, key: str) -> None:
    """The connection that carried a refused request serves the next one."""
    sock.sendall(
        b"GET /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + key.encode()
        + b"\r\n\r\n"
    )
    answer = _read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_a_huge_or_slow_request_head_is_refused(edge: Edge) -> None:
    pid = edge.proxy.proc.pid

    def rss() -> int:
        with open(f"/proc/{pid}/status") as f:
            line = next(x for x in f if x.startswith("VmRSS:"))
        return int(line.split()[1]) * 1024

    before = rss()
    with socket.create_connection(("127.0.0.1", edge.proxy.port), timeout=30) as sock:
        # a 64 MB header on a request with a body: answered 431 at once, the rest read
        # past (nothing of it kept), the body after it too
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n")
        sock.sendall(b"X-Junk: ")
        chunk = b"y" * (1024 * 1024)
        for _ in range(64):
            sock.sendall(chunk)
        sock.sendall(b"\r\n\r\n{}{}\n")
        answer = _read_answer(sock)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
        assert b'"request_head_refused"' in answer and b"connection: close" not in answer
        _next_request_served(sock, edge.key)
    assert rss() - before < 16 * 1024 * 1024

    many = "".join(f"X-H{i}: v\r\n" for i in range(200))
    with socket.create_connection(("127.0.0.1", edge.proxy.port), timeout=30) as s:
        s.sendall(
            f"POST /healthz HTTP/1.1\r\nHost: x\r\n{many}Content-Length: 3\r\n\r\nabc".encode()
        )
        assert _read_answer(s).startswith(b"HTTP/1.1 431")
        _next_request_served(s, edge.key)

    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", edge.proxy.port), timeout=30) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and the end of the head late
        answer = _read_answer(s)
        assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 10
        s.sendall(b"X-Late: 1\r\n\r\n")
        _next_request_served(s, edge.key)

    with socket.create_connection(("127.0.0.1", edge.proxy.port), timeout=30) as s:
        # a refused head whose body's end cannot be known (chunked) ends the connection
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        s.sendall(b"Transfer-Encoding: chunked\r\nX-Junk: " + b"y" * (128 * 1024) + b"\r\n\r\n")
        answer = _read_answer(s)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
        s.settimeout(10)
        assert s.recv(65536) == b""  # closed

    with Conn(edge) as fresh:  # the server serves new connections as before
        assert fresh.call("GET", "/v1/sessions")[0] == 200


def test_a_forged_or_old_page_cookie_is_a_401(conn: Conn, edge: Edge) -> None:
    page = http.client.HTTPConnection("127.0.0.1", edge.proxy.port, timeout=30)
    try:

        def get(cookie: str | None) -> int:
            page.request(
                "GET", "/ui/", headers={"cookie": f"ctxwarden_ui={cookie}"} if cookie else {}
            )
            answer = page.getresponse()
            answer.read()
            return answer.status

        def sign_in() -> str:
            page.request(
                "POST", "/ui/login", f"key={edge.key}",
                {"content-type": "application/x-www-form-urlencoded"},
            )  # fmt: skip
            answer = page.getresponse()
            answer.read()
            assert answer.status == 303
            cookie = answer.getheader("set-cookie") or ""
            return cookie.split(";")[0].split("=", 1)[1]

        assert get(hash_key(edge.key)) == 401  # the stored hash signs no one in
        assert get("v1.ZWRnZQ.9999999999.forged") == 401
        assert get("v1.ZWRnZQ.1.forged") == 401  # expired
        cookie = sign_in()
        assert edge.key not in cookie and hash_key(edge.key) not in cookie
        assert get(cookie) == 200
        done = cli("tenant", "rotate-page-secret", "--db", edge.db)
        assert done.returncode == 0, done.stderr
        assert get(cookie) == 401  # signed before the rotation
        assert get(sign_in()) == 200
    finally:
        page.close()


def test_the_same_request_without_a_retry_mark_is_a_new_call(edge: Edge) -> None:
    """An evaluation sampling one prompt twice, or an agent run again from its start,
    sends the same request with no retry mark: upstream answers it anew (a branch holds
    it), never the stored reply."""
    import openai

    oai = openai.OpenAI(base_url=edge.proxy.url + "/v1", api_key=edge.key, max_retries=0)
    session = sid()
    turns: list[Any] = [{"role": "user", "content": "tell me a joke"}]
    calls = len(edge.upstream.requests)
    assert _ask((oai, None), "openai", False, turns, session) == ("fine", None)
    assert _ask((oai, None), "openai", False, turns, session) == ("fine", None)
    assert len(edge.upstream.requests) == calls + 2  # upstream called both times


@pytest.mark.parametrize("step", [1, 2, 3, 7, 4096])
def test_the_rest_of_a_refused_request_is_read_past_in_any_pieces(step: int) -> None:
    """Whatever the reads' sizes, the rest of a refused request ends where its head's blank
    line and its Content-Length say, and what follows (the next request) is given back."""
    from ctxwarden.service.http_limits import RestOfRequest

    rest = b"X-Junk: " + b"y" * 1000 + b"\r\nContent-Length: 4\r\n\r\nbody" + b"GET / HTTP/1.1\r\n"
    skipper, after = RestOfRequest(None, b"Host: x\r"), None
    for at in range(0, len(rest), step):
        after = skipper.feed(rest[at : at + step])
        if after is not None:
            after += rest[at + step :]
            break
    assert after == b"GET / HTTP/1.1\r\n" and not skipper.chunked
    # a blank line whose first half was read before the refusal
    assert RestOfRequest(0, b"abc\r\n").feed(b"\r\nNEXT") == b"NEXT"
    # a length the parser already saw; a chunked body cannot be read past
    assert RestOfRequest(3, b"").feed(b"X: y\r\n\r\nabcNEXT") == b"NEXT"
    chunked = RestOfRequest(None, b"")
    assert chunked.feed(b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc") == b""
    assert chunked.chunked
