"""Fuzzing the service edge (issue 41), bounded: ``ctxwarden serve`` as a process on SQLite
and PostgreSQL, fed generated requests.

- **The session API**, by schemathesis from the server's own OpenAPI schema (ids and
  bodies as the schema allows: any text, so NUL, ``/``, surrogates and huge values too).
- **Both proxy routes**, by hypothesis: bodies of random JSON (text with lone surrogates
  and NUL, nesting, sizes, every JSON type where a message or field is expected), sent
  as JSON text the way a client would write it (surrogates as ``\\ud800`` escapes), and
  raw mutations of a valid body (cut short, ``NaN``, nested deep).

The invariant, after every request: the answer is a success or a JSON error in the
route's shape (never a 5xx, never plain text), and the session the request named stays
readable through the session API. Example counts are fixed and small (the suite runs in
well under three minutes on both stores); the database of examples is off, so a run is
what its seed gives.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llm_servers import Recorded, Reply, ScriptedServer, anthropic_message, openai_completion
from service_harness import ProxyServer, add_tenant, module_db

schemathesis = pytest.importorskip("schemathesis")

__all__ = ["module_db"]

BUDGET_SECONDS = 75.0  # per store: both stores together stay under the 3 minutes
SESSION = "fuzzed"


def _answer(request: Recorded) -> Reply:
    if request.path.endswith("/messages"):
        return Reply(body=anthropic_message("fine", input_tokens=9, output_tokens=1))
    return Reply(body=openai_completion("fine", prompt=9, completion=1))


@dataclass
class Fuzzed:
    proxy: ProxyServer
    key: str
    http: httpx2.Client
    started: float

    def post(self, path: str, raw: bytes, session: str = SESSION) -> httpx2.Response:
        headers = {
            "authorization": f"Bearer {self.key}",
            "content-type": "application/json",
            "x-ctxwarden-session": session,
        }
        return self.http.post(self.proxy.url + path, content=raw, headers=headers)

    def readable(self, session: str) -> None:
        got = self.http.get(
            f"{self.proxy.url}/v1/sessions/{session}/messages?limit=1000",
            headers={"authorization": f"Bearer {self.key}"},
        )
        assert got.status_code in (200, 404), got.text[:300]
        got.json()

    def over_time(self) -> bool:
        return time.monotonic() - self.started > BUDGET_SECONDS


@pytest.fixture(scope="module")
def fuzzed(module_db: str) -> Iterator[Fuzzed]:
    upstream = ScriptedServer(_answer).start()
    key = add_tenant(module_db, "fuzz")
    proxy = ProxyServer(module_db, upstream=upstream.url + "/v1", anthropic_upstream=upstream.url)
    http = httpx2.Client(timeout=30)
    try:
        yield Fuzzed(proxy, key, http, time.monotonic())
    finally:
        http.close()
        proxy.stop()
        upstream.stop()


def _check(answer: httpx2.Response, api: str) -> None:
    """A success, or a JSON error in the route's shape: never a 5xx, never plain text."""
    assert answer.status_code < 500, answer.text[:500]
    if answer.status_code == 204:
        return
    assert answer.headers.get("content-type", "").startswith("application/json"), answer.text[:200]
    body = answer.json()
    if answer.status_code >= 400:
        error = body["error"]
        assert isinstance(error["message"], str) and error["message"]
        if api == "anthropic":
            assert body["type"] == "error"


# -- generated bodies --------------------------------------------------------------------------

ODD = st.sampled_from(["\ud800", "\udfff", "\x00", "\ud83d\ude00", "\u2028", "\ufeff", "é"])
TEXT = st.lists(st.one_of(st.text(max_size=8), ODD), max_size=6).map("".join)
LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), TEXT)
VALUE = st.recursive(
    LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)
ROLE = st.one_of(st.sampled_from(["user", "assistant", "system", "tool", "developer"]), TEXT)
PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
    st.dictionaries(TEXT, VALUE, max_size=3),
    VALUE,
)
CONTENT = st.one_of(TEXT, st.lists(PART, max_size=3), VALUE)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": ROLE, "content": CONTENT}),
    st.fixed_dictionaries(
        {"role": ROLE, "content": CONTENT}, optional={"name": VALUE, "tool_calls": VALUE}
    ),
    VALUE,
)
BODY = st.fixed_dictionaries(
    {"model": st.one_of(st.sampled_from(["gpt-4o", "claude-sonnet-4-5"]), TEXT, VALUE),
     "messages": st.one_of(st.lists(MESSAGE, max_size=5), VALUE)},
    optional={"max_tokens": st.one_of(st.integers(1, 50), VALUE), "system": VALUE,
              "stream": st.booleans(), "tools": VALUE, "extra": VALUE},
)  # fmt: skip


def _mutate(raw: bytes, how: int) -> bytes:
    """A raw mutation of a valid body: cut short, NaN, nested past the limit, not UTF-8."""
    if how == 0:
        return raw[: len(raw) // 2]
    if how == 1:
        return raw[:-1] + b', "temperature": NaN}'
    if how == 2:
        return raw[:-1] + b', "x": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    if how == 3:
        return raw.replace(b"e", b"\xff", 1)
    return raw


def _run(fuzzed: Fuzzed, path: str, api: str, body: Any, how: int) -> None:
    if fuzzed.over_time():
        return  # bounded: the budget is spent
    raw = _mutate(json.dumps(body).encode(), how)  # surrogates go as escapes, as JS writes them
    _check(fuzzed.post(path, raw), api)
    fuzzed.readable(SESSION)


FUZZ = settings(
    max_examples=80,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@FUZZ
@given(body=BODY, how=st.integers(0, 5))
def test_chat_completions_answers_every_body_as_json(fuzzed: Fuzzed, body: Any, how: int) -> None:
    _run(fuzzed, "/v1/chat/completions", "openai", body, how)


@FUZZ
@given(body=BODY, how=st.integers(0, 5))
def test_messages_answers_every_body_as_json(fuzzed: Fuzzed, body: Any, how: int) -> None:
    _run(fuzzed, "/v1/messages", "anthropic", body, how)


def test_the_session_api_under_its_own_schema(fuzzed: Fuzzed) -> None:
    """schemathesis cases for every session-API operation (ids included), each answer
    JSON and below 500, and every session it named readable after."""
    api = schemathesis.openapi.from_url(fuzzed.proxy.url + "/openapi.json")
    operations = [
        r.ok() for r in api.get_all_operations() if r.ok().path.startswith("/v1/sessions")
    ]
    assert len(operations) >= 7
    failures: list[str] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        def check(case: Any) -> None:
            if fuzzed.over_time():
                return
            answer = case.call(headers={"Authorization": f"Bearer {fuzzed.key}"})
            assert answer.status_code < 500, answer.text[:500]
            if answer.status_code != 204:
                kind = answer.headers.get("content-type") or [""]
                kind = kind if isinstance(kind, str) else kind[0]
                assert kind.startswith("application/json"), answer.text[:200]
                answer.json()
            session = (case.path_parameters or {}).get("session_id")
            if isinstance(session, str) and session and "\x00" not in session:
                got = fuzzed.http.get(
                    f"{fuzzed.proxy.url}/v1/sessions/{session}/messages",
                    headers={"authorization": f"Bearer {fuzzed.key}"},
                )
                assert got.status_code < 500, got.text[:300]

        try:
            check()
        except Exception as exc:
            failures.append(f"{operation.label}: {str(exc)[:800]}")
    assert failures == [], "\n".join(failures)
