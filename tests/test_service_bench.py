"""``python -m ctxwarden_bench.proxy`` runs end to end on a tiny load (its figures are
for the machine, not for a test) and checks its stored sessions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ctxwarden_bench.proxy import anthropic_bodies, conversation, history_at


def test_conversation_is_the_documented_size() -> None:
    base = conversation(200)
    assert len(base) == 200 and base[0]["role"] == "system"
    size = len(json.dumps({"model": "gpt-4o", "messages": base}))
    assert 300_000 < size < 360_000
    assert len(history_at(base, 3)) == 206
    first, fourth = anthropic_bodies(base, 4)[::3]
    assert fourth["messages"][: len(first["messages"])] == first["messages"]  # grown, as sent
    assert [t["role"] for t in fourth["messages"][-3:]] == ["user", "assistant", "user"]


@pytest.mark.parametrize(("api", "paired"), [("openai", "3"), ("anthropic", "1")])
def test_bench_runs_and_checks_the_store(tmp_path: Path, api: str, paired: str) -> None:
    """Both ways of running a case: direct and proxied calls in turn, or one after the other."""
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, "-m", "ctxwarden_bench.proxy", "--clients", "3", "--steps", "2",
         "--messages", "20", "--kinds", "httpx,sdk", "--api", api, "--json", str(out),
         "--paired-up-to", paired],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["problems"] == []
    assert len(figures["reference_ms"]) == 2 and all(ms > 0 for ms in figures["reference_ms"])
    assert "machine before: reference loop" in done.stdout
    cases = {(c["target"], c["client"], c["mode"]) for c in figures["cases"]}
    assert ("proxy", "sdk", "stream") in cases and ("direct", "httpx", "json") in cases
    assert all(c["errors"] == 0 and c["requests"] == 6 for c in figures["cases"])
    for c in figures["cases"]:  # each call's latency, from which the percentiles come
        assert len(c["latencies_ms"]) == 6 and min(c["latencies_ms"]) > 0
        assert abs(max(c["latencies_ms"]) - c["p99_ms"]) < 0.001  # of six calls, the slowest
    assert all(c["seconds"] > 0 for c in figures["cases"]) and len(figures["cases"]) == 8
    assert all(c["cpu_seconds"] is not None for c in figures["cases"] if c["target"] == "proxy")
    assert "stored sessions checked: 12; problems: 0" in done.stdout
    # the run judges issue 13's targets on its own cases (their figures are the machine's)
    targets = {t["target"]: t for t in figures["targets"]}
    assert targets["no stored message lost or duplicated"]["met"] is True
    assert targets["0 errors at 3 concurrent streams"]["met"] is True
    assert "httpx json" in targets["p50 added <= 5 ms at 3 clients"]["figures"]
    assert len(targets) == 5 and "issue 13's targets" in done.stdout


def test_the_prepared_requests_are_kept_out_of_collections() -> None:
    """The bench's own full collections walked its prepared requests mid-call (see
    :func:`prepared`): they are frozen, every request's turns among them."""
    import gc

    from ctxwarden_bench.proxy import conversation, prepared

    before = gc.get_freeze_count()
    try:
        histories, bodies = prepared(conversation(20), 3, "anthropic")
        assert len(histories) == 3 and len(bodies[False]) == len(bodies[True]) == 3
        turns = sum(len(h["messages"]) for h in histories)
        assert gc.get_freeze_count() - before >= len(histories) + turns
    finally:
        gc.unfreeze()


def test_the_reference_loop_is_timed_as_timeit_times_it() -> None:
    import timeit

    from ctxwarden_bench.machine_speed import REFERENCE_LOOP, reference_ms

    ours = reference_ms(repeat=3, number=5)
    theirs = min(timeit.Timer(REFERENCE_LOOP).repeat(repeat=3, number=5)) / 5 * 1000
    assert ours > 0 and 0.25 < ours / theirs < 4  # the same loop, a noisy machine
    with pytest.raises(ValueError, match="at least 1"):
        reference_ms(repeat=0)


def test_a_database_given_with_db_serves_run_after_run(tmp_path: Path) -> None:
    """Each run's sessions go to a tenant of its own: a second run on the same database
    is not refused for the first one's tenant, and checks only its own sessions."""
    db = f"sqlite:///{tmp_path / 'kept.db'}"
    args = ["--db", db, "--clients", "2", "--steps", "1", "--messages", "10",
            "--kinds", "httpx", "--modes", "json"]  # fmt: skip
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "ctxwarden_bench.proxy", *args],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "stored sessions checked: 2; problems: 0" in done.stdout
    from ctxwarden.store import open_store
    from ctxwarden.store.service_tables import list_tenants

    with open_store(db) as store:
        assert len([t for t in list_tenants(store) if t.tenant.startswith("bench-")]) == 2
    bad = subprocess.run([sys.executable, "-m", "ctxwarden_bench.proxy", "--db", "nonsense://x"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--db: unknown store URL 'nonsense://x'" in bad.stderr


def test_the_bench_collects_before_a_case_and_not_during_it() -> None:
    """Its own full collections landed inside proxied calls (~40 ms with the anthropic
    SDK) and read as the proxy's p99: off for a case, back on after, even on failure."""
    import gc

    from ctxwarden_bench.proxy import _collector_off

    collections: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            collections.append(info["generation"])

    assert gc.isenabled()
    gc.callbacks.append(seen)
    try:
        with _collector_off():
            assert not gc.isenabled()
            assert 2 in collections  # a full collection just before the case
    finally:
        gc.callbacks.remove(seen)
    assert gc.isenabled()
    with pytest.raises(RuntimeError), _collector_off():
        raise RuntimeError("a case failed")
    assert gc.isenabled()


def test_bench_runs_the_responses_route_beside_chat(tmp_path: Path) -> None:
    """``--kinds responses``: the openai SDK's ``responses.create`` through
    ``/v1/responses``, with the chat route's cases in the same run, its stored sessions
    checked as the conversation it sent."""
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, "-m", "ctxwarden_bench.proxy", "--clients", "2", "--steps", "2",
         "--messages", "20", "--kinds", "sdk,responses,responses-httpx", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["problems"] == []
    clients = {(c["target"], c["client"], c["mode"]) for c in figures["cases"]}
    assert {("proxy", "responses", "stream"), ("direct", "responses", "json")} <= clients
    # pre-built /v1/responses bodies, JSON and streamed, beside the SDK's
    assert {
        ("proxy", "responses-httpx", "stream"),
        ("direct", "responses-httpx", "json"),
    } <= clients
    assert all(c["errors"] == 0 and c["requests"] == 4 for c in figures["cases"])
    assert "stored sessions checked: 12; problems: 0" in done.stdout
    targets = {t["target"]: t for t in figures["targets"]}
    judged = targets["p50 added <= 5 ms at 2 clients"]
    assert "responses json " in judged["figures"] and "sdk json " in judged["figures"]
    assert "responses-httpx stream " in judged["figures"]
    # requests per second are judged on the pre-built bodies: here the Responses ones
    rate = next(t for name, t in targets.items() if name.startswith(">= 150 requests/s"))
    assert rate["met"] is not None and "responses-httpx json x2" in rate["figures"]
