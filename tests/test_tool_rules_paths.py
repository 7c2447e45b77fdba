"""A tool rule applies the same on every path (issue 40, item 1): ``build_context`` in an
agent loop, a stored :class:`~ctxwarden.Session` (SQLite and PostgreSQL), and ``ctxwarden
serve`` driven by the openai SDK (the rule from ``serve --policy`` and from ``tenant add
--policy``), on the tau-bench dev runs at 8,000 tokens: ``[tools.get_reservation_details]
mask = false`` sends every result of that tool unmasked, while the default masks some."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import openai
import pytest
from llm_servers import Reply, ScriptedServer, openai_completion
from service_harness import PG_DSN, PG_SKIP, ProxyServer, add_tenant, drop_schema, module_db, pg_url

from ctxwarden import Policy
from ctxwarden.core.messages import Message
from ctxwarden.formats.openai import message_to_openai, messages_from_openai
from ctxwarden.steps.tool_rules import result_tool
from ctxwarden_bench.session_path import SessionBuilder, engine_path, model_calls, sent
from ctxwarden_bench.traces import load_tau_bench

__all__ = ["module_db"]  # the fixture, re-exported for pytest

TOOL = "get_reservation_details"
RULE = f"[tools.{TOOL}]\nmask = false\n"
BUDGET = 8000
# dev runs 2 and 3: at 8,000 tokens the default masks results of the tool in both
RUNS = slice(2, 4)


def masked_of_tool(messages: Sequence[Message]) -> tuple[int, int]:
    """(results of the tool sent, how many of them masked)."""
    ms = list(messages)
    mine = [m for i, m in enumerate(ms) if m.role == "tool" and result_tool(ms, i) == TOOL]
    placeholder = f"[tool result masked to save context: {TOOL},"
    return len(mine), sum(m.text.startswith(placeholder) for m in mine)


@pytest.fixture(scope="module")
def runs(tau_bench_path: Path) -> list[list[Message]]:
    return load_tau_bench(tau_bench_path)[RUNS]


def test_build_context_default_masks_some_and_the_rule_none(runs: list[list[Message]]) -> None:
    for policy, none_masked in ((Policy(), False), (Policy.from_toml(RULE), True)):
        reference = engine_path(policy=policy)
        masked = results = 0
        for run in runs:
            for k in model_calls(run):
                n, hidden = masked_of_tool(reference(run[:k], BUDGET).messages)
                results, masked = results + n, masked + hidden
        assert results > 0
        assert (masked == 0) if none_masked else (masked > 0)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'rules.db'}"
        return
    if not PG_DSN:
        pytest.skip(PG_SKIP)
    schema = f"ctxw_rules_{uuid.uuid4().hex[:10]}"
    yield pg_url(schema)
    drop_schema(schema)


# every other kind of rule at once, at a budget where the window moves past pinned results
# (the session reads the blocks a rule pins before its tail: session.tool_pins)
EVERY_KIND = (
    '[tools."*"]\nkeep_last = 1\nclear_inputs = true\n'
    "[tools.get_user_details]\npin = true\n"
    '[tools.search_direct_flight]\ntruncate = "json"\n[tools.list_all_airports]\ntruncate = false\n'
)


@pytest.mark.parametrize(("rule", "budget"), [(RULE, BUDGET), (EVERY_KIND, 3000)])
def test_a_session_sends_what_build_context_sends_under_the_rule(
    runs: list[list[Message]], store_url: str, tau_bench_path: Path, rule: str, budget: int
) -> None:
    policy = Policy.from_toml(rule)
    reference = engine_path(policy=policy)
    calls = results = 0
    every = load_tau_bench(tau_bench_path)[:4] if rule == EVERY_KIND else runs
    with SessionBuilder(store_url, policy=policy) as session:
        for run in every:
            for k in model_calls(run):
                want = reference(run[:k], budget)
                got = session.build(run[:k], budget)
                assert sent(got.messages) == sent(want.messages), f"call {k}"
                n, hidden = masked_of_tool(got.messages)
                assert rule != RULE or hidden == 0, f"call {k}"
                calls, results = calls + 1, results + n
    assert calls == sum(len(model_calls(r)) for r in every) and results > 0


def test_the_pins_a_session_reads_are_kept_where_the_default_drops_them(
    tau_bench_path: Path, tmp_path: Path
) -> None:
    """The case the session's extra read is for: at 3,000 tokens the window leaves
    the user's details behind; pinned by rule they stay, on both paths."""
    run = load_tau_bench(tau_bench_path)[0]
    policy = Policy.from_toml("[tools.get_user_details]\npin = true\n")
    last = model_calls(run)[-1]
    default, ruled = engine_path(), engine_path(policy=policy)  # agent loops, previous chained
    with SessionBuilder(f"sqlite:///{tmp_path / 'pins.db'}", policy=policy) as session:
        for k in model_calls(run):
            got, want, plain = (
                session.build(run[:k], 3000),
                ruled(run[:k], 3000),
                default(run[:k], 3000),
            )
            assert sent(got.messages) == sent(want.messages), f"call {k}"
    assert k == last

    def details(messages: Sequence[Message]) -> int:
        ms = list(messages)
        return sum(result_tool(ms, i) == "get_user_details" for i in range(len(ms)))

    assert details(want.messages) > details(plain.messages) == 0


# -- ctxwarden serve, the openai SDK as the client ------------------------------------------------


def _reply(m: Message) -> dict[str, Any]:
    body = openai_completion("", finish_reason="tool_calls" if m.tool_calls else "stop")
    body["choices"][0]["message"] = message_to_openai(m)
    return body


def _wire(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``"content": null`` left out (a call without text is either on the wire)."""
    return [{k: v for k, v in m.items() if not (k == "content" and v is None)} for m in messages]


def _through_serve(
    proxy: ProxyServer, upstream: ScriptedServer, key: str, runs: list[list[Message]],
    policy: Policy, budget: int = BUDGET,
) -> tuple[int, int, int]:  # fmt: skip
    """Each run as an openai SDK client of the proxy; every upstream body against
    build_context's under ``policy``. Returns (calls, results of the tool, masked)."""
    reference = engine_path(policy=policy)
    calls = results = masked = 0
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0)
    try:
        for run in runs:
            headers = {"X-Ctxwarden-Session": f"run-{uuid.uuid4().hex[:10]}",
                       "X-Ctxwarden-Max-Input-Tokens": str(budget)}  # fmt: skip
            for k in model_calls(run):
                before = run[:k]
                upstream.reply(Reply(body=_reply(run[k])))
                client.chat.completions.create(
                    model="gpt-4o", messages=sent(before), extra_headers=headers
                )  # type: ignore[call-overload]
                body = upstream.requests[-1].json["messages"]
                assert _wire(body) == _wire(reference(before, budget).to_openai()), f"call {k}"
                n, hidden = masked_of_tool(messages_from_openai(body))
                calls, results, masked = calls + 1, results + n, masked + hidden
    finally:
        client.close()
    return calls, results, masked


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedServer]:
    server = ScriptedServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rule_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "policy.toml"
    path.write_text(RULE, encoding="utf-8")
    return path


def test_serve_policy_applies_the_rule(
    module_db: str, upstream: ScriptedServer, rule_file: Path, runs: list[list[Message]]
) -> None:
    key = add_tenant(module_db, f"served-{uuid.uuid4().hex[:6]}")
    proxy = ProxyServer(
        module_db, upstream=upstream.url + "/v1", extra=("--policy", str(rule_file))
    )
    try:
        calls, results, masked = _through_serve(proxy, upstream, key, runs, Policy.from_toml(RULE))
    finally:
        proxy.stop()
    assert calls == sum(len(model_calls(r)) for r in runs) and results > 0
    assert masked == 0


def test_serve_applies_every_kind_of_rule_as_build_context(
    module_db: str, upstream: ScriptedServer, tmp_path: Path, tau_bench_path: Path
) -> None:
    path = tmp_path / "every.toml"
    path.write_text(EVERY_KIND, encoding="utf-8")
    key = add_tenant(module_db, f"every-{uuid.uuid4().hex[:6]}", "--policy", str(path))
    proxy = ProxyServer(module_db, upstream=upstream.url + "/v1")
    runs = load_tau_bench(tau_bench_path)[:2]
    try:
        calls, _, _ = _through_serve(
            proxy, upstream, key, runs, Policy.from_toml(EVERY_KIND), budget=3000
        )
    finally:
        proxy.stop()
    assert calls == sum(len(model_calls(r)) for r in runs)


def test_tenant_add_policy_applies_the_rule_and_the_default_tenant_masks(
    module_db: str, upstream: ScriptedServer, rule_file: Path, runs: list[list[Message]]
) -> None:
    ruled = add_tenant(module_db, f"ruled-{uuid.uuid4().hex[:6]}", "--policy", str(rule_file))
    plain = add_tenant(module_db, f"plain-{uuid.uuid4().hex[:6]}")
    proxy = ProxyServer(module_db, upstream=upstream.url + "/v1")
    try:
        calls, results, masked = _through_serve(
            proxy, upstream, ruled, runs, Policy.from_toml(RULE)
        )
        assert calls > 0 and results > 0 and masked == 0
        calls, results, masked = _through_serve(proxy, upstream, plain, runs, Policy())
        assert calls > 0 and masked > 0  # the default masks some on the same calls
    finally:
        proxy.stop()


def test_a_bad_rule_is_refused_before_serving(tmp_path: Path, module_db: str) -> None:
    from service_harness import cli

    bad = tmp_path / "bad.toml"
    bad.write_text(f"[tools.{TOOL}]\nmask_after = 2\n", encoding="utf-8")
    done = cli("tenant", "add", "badrule", "--db", module_db, "--policy", str(bad))
    assert done.returncode != 0 and "mask_after" in done.stderr
    assert f"tools.{TOOL}" in done.stderr
