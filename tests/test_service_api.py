"""The session API, tenants' caps, metrics and health of ``ctxwarden serve`` (a real
process), on SQLite and PostgreSQL."""

from __future__ import annotations

import pathlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import openai
import pytest
from llm_servers import Reply, ScriptedServer, openai_completion
from service_harness import ProxyServer, add_tenant, cli, db_url, module_db, sid

from ctxwarden.service.metrics import METRIC_NAMES
from ctxwarden.store import open_store
from ctxwarden.store.service_tables import list_builds

__all__ = ["db_url", "module_db"]


@dataclass
class Env:
    proxy: ProxyServer
    upstream: ScriptedServer
    key: str
    other: str
    http: httpx2.Client

    def call(self, method: str, path: str, key: str | None = None, **kw: Any) -> httpx2.Response:
        headers = {"authorization": f"Bearer {key or self.key}", **kw.pop("headers", {})}
        return self.http.request(method, self.proxy.url + path, headers=headers, **kw)


@pytest.fixture(scope="module")
def env(module_db: str) -> Iterator[Env]:
    upstream = ScriptedServer(
        lambda r: (
            Reply(404, {}) if r.path.endswith("/models") else Reply(body=openai_completion("ok"))
        )
    ).start()
    key = add_tenant(module_db, "acme")
    other = add_tenant(module_db, "globex", "--max-input-tokens", "400")
    proxy = ProxyServer(module_db, upstream=upstream.url + "/v1")
    http = httpx2.Client(timeout=30)
    try:
        yield Env(proxy, upstream, key, other, http)
    finally:
        http.close()
        proxy.stop()
        upstream.stop()


def test_tenant_add_prints_the_key_alone_on_the_last_line(env: Env) -> None:
    done = cli("tenant", "add", f"t-{sid()}", "--db", env.proxy.db)
    assert done.returncode == 0
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"cwk_[A-Za-z0-9_-]{43}", last)
    again = cli("tenant", "add", "acme", "--db", env.proxy.db)
    assert again.returncode == 2 and "exists and is active" in again.stderr
    assert cli("tenant", "revoke", "nobody", "--db", env.proxy.db).returncode == 2


def test_append_page_build_recall_and_delete(env: Env) -> None:
    session = sid()
    history = [{"role": "system", "content": "sys"}]
    history += [{"role": "user" if i % 2 else "assistant", "content": f"m{i}"} for i in range(1, 8)]
    r = env.call("POST", f"/v1/sessions/{session}/messages", json={"messages": history})
    assert r.status_code == 200 and r.json()["seqs"] == list(range(8))
    first = env.call("GET", f"/v1/sessions/{session}/messages?limit=3").json()
    assert first == {"messages": history[:3], "next_offset": 3}
    rest = env.call("GET", f"/v1/sessions/{session}/messages?limit=10&offset=3").json()
    assert rest == {"messages": history[3:], "next_offset": None}

    built = env.call("POST", f"/v1/sessions/{session}/build", json={"model": "gpt-4o"}).json()
    assert built["messages"][0] == {"role": "system", "content": "sys"}
    assert built["audit"]["input_tokens"] > 0

    recalled = env.call("GET", f"/v1/sessions/{session}/recall/m4").json()
    assert recalled == {"handle": "m4", "seq": 4, "message": history[4]}
    assert env.call("GET", f"/v1/sessions/{session}/recall/m99").status_code == 404

    shown = env.call("GET", f"/v1/sessions/{session}").json()
    assert shown["messages"] == 8 and shown["summary"] is None and "ledger" in shown
    listed = env.call("GET", "/v1/sessions").json()["sessions"]
    assert session in {s["id"] for s in listed}

    assert env.call("DELETE", f"/v1/sessions/{session}", key=env.other).status_code == 404
    assert env.call("DELETE", f"/v1/sessions/{session}").status_code == 204
    assert env.call("GET", f"/v1/sessions/{session}").status_code == 404


def test_bad_requests_are_clear(env: Env) -> None:
    bad = env.call("POST", f"/v1/sessions/{sid()}/messages", json={"messages": [{"role": "x"}]})
    assert bad.status_code == 400 and "role" in bad.json()["error"]["message"]
    empty = env.call("POST", f"/v1/sessions/{sid()}/messages", json={"messages": []})
    assert empty.status_code == 400  # a body the route's model refuses: 400, as OpenAI's API
    assert empty.json()["error"]["type"] == "invalid_request_error"
    assert "messages" in empty.json()["error"]["message"]
    junk = env.call("POST", "/v1/chat/completions", content=b"{not json")
    assert junk.status_code == 400 and "not JSON" in junk.json()["error"]["message"]
    header = env.call(
        "POST", "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]},
        headers={"x-ctxwarden-session": "bad id!"},
    )  # fmt: skip
    assert header.status_code == 400 and "X-Ctxwarden-Session" in header.json()["error"]["message"]


def test_tenant_input_cap_bounds_every_build(env: Env) -> None:
    client = openai.OpenAI(base_url=env.proxy.url + "/v1", api_key=env.other, max_retries=0)
    history = [{"role": "user", "content": f"question {i} " + "word " * 80} for i in range(12)]
    with client:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=history, extra_headers={"X-Ctxwarden-Max-Input-Tokens": "9000"}
        )
    assert int(raw.headers["x-ctxwarden-input-tokens"]) <= 400  # the cap wins over the ask


def test_spend_cap_answers_429_once_reached(env: Env) -> None:
    name = f"cheap-{sid()}"
    key = add_tenant(env.proxy.db, name, "--spend-cap", "0.01")
    env.upstream.reply(Reply(body=openai_completion("pricey", prompt=200_000, completion=50_000)))
    client = openai.OpenAI(base_url=env.proxy.url + "/v1", api_key=key, max_retries=0)
    with client:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.RateLimitError) as err:
            client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "y"}]
            )
        assert err.value.body["code"] == "spend_cap_reached"  # type: ignore[index]
        assert err.value.body["spend_cap_usd"] == 0.01  # type: ignore[index]
        reset = cli(
            "tenant", "caps", name, "--db", env.proxy.db, "--spend-cap", "5", "--reset-spend"
        )
        assert reset.returncode == 0
        ok = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "z"}]
        )
        assert ok.choices[0].message.content == "ok"


def test_metrics_health_and_models(env: Env) -> None:
    client = openai.OpenAI(base_url=env.proxy.url + "/v1", api_key=env.key, max_retries=0)
    with client:
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "count me"}]
        )
    text = env.http.get(env.proxy.url + "/metrics").text
    for name in METRIC_NAMES:
        assert f"# TYPE {name}" in text or f"# TYPE {name.removesuffix('_total')}" in text, name
    assert re.search(
        r'ctxwarden_requests_total\{route="/v1/chat/completions",status="200"\} [1-9]', text
    )
    assert re.search(r'ctxwarden_input_tokens_total\{api="openai"\} [1-9]', text)
    assert re.search(r'ctxwarden_build_seconds_count\{api="openai"\} [1-9]', text)
    assert env.http.get(env.proxy.url + "/healthz").json() == {"status": "ok"}
    ready = env.http.get(env.proxy.url + "/readyz").json()
    assert ready == {"status": "ready", "upstreams": ["openai"]}
    models = env.call("GET", "/v1/models").json()  # the upstream has no /models: the registry
    assert "gpt-4o" in {m["id"] for m in models["data"]}


def test_openapi_schema_lists_the_routes(env: Env) -> None:
    schema = env.http.get(env.proxy.url + "/openapi.json").json()
    paths = set(schema["paths"])
    assert {
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/models",
        "/v1/sessions",
        "/v1/sessions/{session_id}",
        "/v1/sessions/{session_id}/messages",
        "/v1/sessions/{session_id}/build",
        "/v1/sessions/{session_id}/builds",
        "/v1/sessions/{session_id}/recall/{handle}",
    } <= paths


def _summarising_proxy(
    db_url: str, tmp_path: pathlib.Path, summary_toml: str
) -> tuple[ScriptedServer, ProxyServer, str]:
    """A proxy with the offline summariser and a ``[summary]`` policy, its upstream, a key."""
    policy = tmp_path / "policy.toml"
    policy.write_text("[summary]\n" + summary_toml)
    upstream = ScriptedServer(lambda r: Reply(body=openai_completion("noted"))).start()
    key = add_tenant(db_url, "acme")
    proxy = ProxyServer(
        db_url,
        upstream=upstream.url + "/v1",
        extra=("--summarizer", "offline", "--policy", str(policy)),
    )
    return upstream, proxy, key


def _orders(count: int, *, first: int, note: str = "") -> list[dict[str, Any]]:
    """A chat stating ``count`` orders (ORD-<first>..., each with ``note``), then asking
    for a summary."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You help with orders."}]
    for i in range(count):
        said = f"Order ORD-{first + i} costs {100 + i} EUR." + (f" {note}" if note else "")
        history += [
            {"role": "user", "content": said},
            {"role": "assistant", "content": f"Noted ORD-{first + i}."},
        ]
    history.append({"role": "user", "content": "Summarise my orders."})
    return history


def _stored_summary(proxy: ProxyServer, session: str, key: str) -> str | None:
    """The session's summary once the background cycle wrote it (waits up to 20 s)."""
    deadline = time.monotonic() + 20
    detail: dict[str, Any] = {}
    while time.monotonic() < deadline:
        _, detail = proxy.get(f"/v1/sessions/{session}", key)
        if detail["summary"]:
            break
        time.sleep(0.1)
    return detail["summary"]  # type: ignore[no-any-return]


def test_summaries_run_after_calls_and_reach_the_next_build(
    db_url: str, tmp_path: pathlib.Path
) -> None:
    upstream, proxy, key = _summarising_proxy(
        db_url, tmp_path, "max_messages = 6\nkeep_recent = 2\n"
    )
    session = sid()
    history = _orders(5, first=700)
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0)
    try:
        with client:
            headers = {"X-Ctxwarden-Session": session}
            client.chat.completions.create(model="gpt-4o", messages=history, extra_headers=headers)
            summary = _stored_summary(proxy, session, key)
            assert summary and "ORD-700" in summary
            history += [
                {"role": "assistant", "content": "noted"},
                {"role": "user", "content": "ok"},
            ]
            client.chat.completions.create(model="gpt-4o", messages=history, extra_headers=headers)
        sent = upstream.requests[-1].json["messages"]
        assert any("ORD-700" in str(m["content"]) for m in sent if m["role"] == "system")
        assert len(sent) < len(history)
        _, text = proxy.get("/metrics")
        assert re.search(r"ctxwarden_summaries_run_total [1-9]", text)
        assert re.search(r"ctxwarden_summaries_failed_total 0", text)
    finally:
        proxy.stop()
        upstream.stop()


def test_the_summary_cycle_measures_the_fill_against_the_calls_budget(
    db_url: str, tmp_path: pathlib.Path
) -> None:
    # only a fill-ratio trigger: 60% of a 1,000-token budget is due, 60% of gpt-4o's window is not
    upstream, proxy, key = _summarising_proxy(
        db_url, tmp_path, "max_messages = 1000\nfill_ratio = 0.6\nkeep_recent = 2\n"
    )
    session = sid()
    note = " ".join(f"line {j} of the order notes." for j in range(12))
    history = _orders(12, first=800, note=note)
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0)
    try:
        with client:
            headers = {"X-Ctxwarden-Session": session, "X-Ctxwarden-Max-Input-Tokens": "1000"}
            client.chat.completions.create(model="gpt-4o", messages=history, extra_headers=headers)
            summary = _stored_summary(proxy, session, key)
            assert summary and "ORD-800" in summary
    finally:
        proxy.stop()
        upstream.stop()


def test_serve_bounds_the_build_log_as_told(module_db: str) -> None:
    """``--keep-builds`` / ``--keep-contexts``: the proxy's sessions keep that many newest
    build audits, that many of them with their built messages."""
    upstream = ScriptedServer(lambda r: Reply(body=openai_completion("ok"))).start()
    key = add_tenant(module_db, "bounded-log")
    proxy = ProxyServer(
        module_db,
        upstream=upstream.url + "/v1",
        extra=("--keep-builds", "3", "--keep-contexts", "1"),
    )
    try:
        history: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
        with httpx2.Client(timeout=30) as http:
            for turn in range(5):
                history.append({"role": "user", "content": f"question {turn}"})
                r = http.post(
                    proxy.url + "/v1/chat/completions",
                    json={"model": "gpt-4o", "messages": history},
                    headers={"authorization": f"Bearer {key}", "x-ctxwarden-session": "kept"},
                )
                assert r.status_code == 200, r.text
                history.append(r.json()["choices"][0]["message"])
        status, page = proxy.get("/v1/sessions/kept/builds?limit=50", key)
        assert status == 200, page
        assert [b["turn"] for b in page["builds"]] == [3, 4, 5]
        with open_store(module_db) as store:
            rows = list_builds(store, "bounded-log", "kept", limit=50)
        assert [b.has_context for b in rows] == [False, False, True]
    finally:
        proxy.stop()
        upstream.stop()
