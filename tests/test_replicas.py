"""Stateless replicas on PostgreSQL, summaries as Celery jobs on Redis (issue 14).

The topology runs as processes on this machine: ``ctxwarden serve`` on several ports
against one PostgreSQL schema, a real ``ctxwarden worker`` (Celery) on the machine's
Redis (its own queue name, so nothing else's worker takes our jobs), and a local
upstream (:mod:`ctxwarden_bench.scale_upstream`: a tool-using agent, and a summariser
whose summary answers take 2 s). The Redis-down test starts a Redis of its own on a free
port, since it stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2
import pytest
from service_harness import (
    CLI,
    PG_SKIP,
    ProxyServer,
    add_tenant,
    free_port,
)

from ctxwarden import Session
from ctxwarden.store import open_store
from ctxwarden.store.job_log import job_attempts
from ctxwarden_bench.scale_upstream import ScaleUpstream, first_turn, next_turn, what_it_says

pytestmark = pytest.mark.postgres

REDIS = os.environ.get("CTXWARDEN_TEST_REDIS")
BUDGET = "2500"  # tokens per build: the window moves, the ledger and eviction work


@pytest.fixture
def pg(pg_schema_url: str | None) -> str:
    if not pg_schema_url:
        pytest.skip(PG_SKIP)
    return pg_schema_url


@pytest.fixture
def upstream() -> Iterator[ScaleUpstream]:
    server = ScaleUpstream(summary_delay=2.0).start()
    try:
        yield server
    finally:
        server.stop()


def _policy(tmp_path: Path, max_messages: int, keep_recent: int) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(f"[summary]\nmax_messages = {max_messages}\nkeep_recent = {keep_recent}\n")
    return str(path)


class Worker:
    """``ctxwarden worker`` as a process; ready once Celery logs that it is."""

    def __init__(
        self,
        db: str,
        broker: str,
        queue: str,
        upstream: str,
        log: Path,
        *args: str,
        **env: str,
    ) -> None:
        self.log = log
        self._out = log.open("ab")
        self.proc = subprocess.Popen(
            [CLI, "worker", "--db", db, "--broker", broker, "--queue", queue,
             "--summarizer", "openai:gpt-4o-mini", "--concurrency", "2", *args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OPENAI_BASE_URL": upstream, "OPENAI_API_KEY": "sk-local", **env},
        )  # fmt: skip
        start = self.log.stat().st_size if self.log.exists() else 0
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited: {self.log.read_text()[-2000:]}")
            if b" ready." in self.log.read_bytes()[start:]:
                return
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"worker not ready: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._out.close()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._out.close()


class Client:
    """One agent session driven through the proxies: each turn goes to the next URL in
    ``urls`` (a client alternating replicas). Bodies are posted as JSON over ``httpx2``
    (the ``openai`` SDK spends tens of ms preparing a 600-message body itself, which
    would swamp what is measured here)."""

    def __init__(self, urls: list[str], key: str, tag: str = "A") -> None:
        self.urls = urls
        self.http = httpx2.Client(timeout=30, headers={"Authorization": f"Bearer {key}"})
        self.session = f"agent-{uuid.uuid4().hex[:8]}"
        self.tag = f"(agent {tag})"  # tells its requests apart at the upstream
        self.history = first_turn(f"You are a support agent {self.tag}. Look orders up first.")
        self.sent: list[dict[str, Any]] = []
        self.reply: dict[str, Any] = {}
        self.latencies: list[float] = []
        self.turns = 0

    def turn(self) -> None:
        url = self.urls[self.turns % len(self.urls)]
        body = json.dumps({"model": "gpt-4o", "messages": self.history})
        headers = {
            "content-type": "application/json",
            "X-Ctxwarden-Session": self.session,
            "X-Ctxwarden-Max-Input-Tokens": BUDGET,
        }
        started = time.perf_counter()
        got = self.http.post(url + "/v1/chat/completions", content=body, headers=headers)
        self.latencies.append(time.perf_counter() - started)
        assert got.status_code == 200, got.text
        msg = got.json()["choices"][0]["message"]
        reply = {k: msg[k] for k in ("role", "content", "tool_calls") if k in msg}
        self.sent, self.reply = self.history, reply
        self.history = next_turn(self.history, reply)
        self.turns += 1

    def close(self) -> None:
        self.http.close()


def _check_stored(db: str, tenant: str, client: Client) -> Any:
    """The stored session holds exactly what the client sent plus the last reply: no
    message lost, none twice, none out of order, no branch."""
    with open_store(db) as store:
        sessions = [s.session_id for s in store.list_sessions(tenant)]
        session = Session(store, client.session, tenant=tenant)
        stored = [what_it_says(m) for m in session.export()]
        record = session.record
    assert not [s for s in sessions if s.startswith(client.session + "~")], sessions
    expected = [what_it_says(m) for m in [*client.sent, client.reply]]
    lost = len([m for m in expected if m not in stored])
    assert (lost, len(stored)) == (0, len(expected))
    assert stored == expected
    return record


def _turns(client: Client, n: int) -> None:
    for _ in range(n):
        client.turn()


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[18]


def _wait_jobs(
    db: str,
    tenant: str,
    session_id: str,
    done: Callable[[list[Any]], bool] = lambda found: all(a.outcome for a in found),
    timeout: float = 40.0,
) -> list[Any]:
    """The session's job attempts once ``done`` says so (default: none is running), or
    at the timeout."""
    deadline = time.monotonic() + timeout
    with open_store(db) as store:
        while True:
            attempts = job_attempts(store, tenant, session_id)
            if (attempts and done(attempts)) or time.monotonic() > deadline:
                return attempts
            time.sleep(0.2)


def test_two_replicas_and_a_worker_serve_300_turns_as_one_replica_does(
    pg: str, upstream: ScaleUpstream, tmp_path: Path
) -> None:
    if not REDIS:
        pytest.skip("set CTXWARDEN_TEST_REDIS to a Redis URL to run the summary jobs")
    queue = f"ctxw-test-{uuid.uuid4().hex[:8]}"
    policy = _policy(tmp_path, max_messages=60, keep_recent=16)
    key = add_tenant(pg, "acme")
    jobs = ("--policy", policy, "--broker", REDIS)
    env = {"CTXWARDEN_JOB_QUEUE": queue}
    with ThreadPoolExecutor(5) as pool:  # start them at once
        plain_f = [
            pool.submit(ProxyServer, pg, upstream=upstream.url, extra=("--policy", policy))
            for _ in "ab"
        ]
        queued_f = [
            pool.submit(ProxyServer, pg, upstream=upstream.url, extra=jobs, env=env) for _ in "cd"
        ]
        worker_f = pool.submit(Worker, pg, REDIS, queue, upstream.url, tmp_path / "worker.log")
        plain, queued = [f.result() for f in plain_f], [f.result() for f in queued_f]
        worker = worker_f.result()
    # the same agent, side by side: on two replicas without summaries, on one replica
    # (the reference), and on two replicas with summaries as jobs
    alternating = Client([p.url for p in plain], key, "A")
    single = Client([plain[0].url], key, "B")
    summarised = Client([p.url for p in queued], key, "C")
    clients = (alternating, single, summarised)
    try:
        with ThreadPoolExecutor(3) as pool:
            for done in [pool.submit(_turns, c, 300) for c in clients]:
                done.result()
        attempts = _wait_jobs(pg, "acme", summarised.session)
    finally:
        for client in clients:
            client.close()
        worker.stop()
        for proxy in (*plain, *queued):
            proxy.stop()
    contexts = {c.tag: [x for x in upstream.contexts if c.tag in x] for c in clients}
    assert [len(v) for v in contexts.values()] == [300, 300, 300]
    reference = [x.replace(single.tag, alternating.tag) for x in contexts[single.tag]]
    differ = [t for t in range(300) if contexts[alternating.tag][t] != reference[t]]
    assert differ == [], f"contexts differ from the single replica's at turns {differ[:10]}"
    last = json.loads(contexts[alternating.tag][-1])
    assert len(last) < len(alternating.sent) / 4  # the builds did cut: windows, ledger
    assert any("Values from earlier messages" in str(m.get("content")) for m in last)
    for client in clients:
        _check_stored(pg, "acme", client)
    record = _check_stored(pg, "acme", summarised)
    assert record.summary and "ORD-" in record.summary
    # each job's summary lands once: one version per written attempt, never two per job
    written = [a for a in attempts if a.outcome in ("landed", "facts")]
    assert record.version == len(written) >= 1
    per_job = [a.job_id for a in written]
    assert len(per_job) == len(set(per_job))
    # summaries never ran on the request path: at most 1.5x the p95 without them
    p95_off, p95_on = _p95(alternating.latencies), _p95(summarised.latencies)
    print(f"p95 without summaries {p95_off * 1000:.1f} ms, with {p95_on * 1000:.1f} ms")
    assert upstream.counts["summary"] >= 1
    assert p95_on <= 1.5 * p95_off, (p95_on, p95_off)


def test_a_worker_killed_mid_job_leaves_the_job_to_be_redelivered(
    pg: str, upstream: ScaleUpstream, tmp_path: Path
) -> None:
    if not REDIS:
        pytest.skip("set CTXWARDEN_TEST_REDIS to a Redis URL to run the summary jobs")
    queue = f"ctxw-test-{uuid.uuid4().hex[:8]}"
    policy = _policy(tmp_path, max_messages=12, keep_recent=4)
    key = add_tenant(pg, "acme")
    env = {"CTXWARDEN_JOB_QUEUE": queue}
    proxy = ProxyServer(
        pg, upstream=upstream.url, extra=("--policy", policy, "--broker", REDIS), env=env
    )
    log = tmp_path / "worker.log"
    visibility = {"CTXWARDEN_JOB_VISIBILITY": "4"}
    worker = Worker(pg, REDIS, queue, upstream.url, log, **visibility)
    client = Client([proxy.url], key)
    try:
        deadline = time.monotonic() + 30
        while upstream.counts["summary"] == 0:  # the job is now waiting on the 2 s answer
            assert time.monotonic() < deadline, "no summary job started"
            client.turn()
            time.sleep(0.05)
        worker.kill()
        for _ in range(6):  # calls go on meanwhile; the pending job is not enqueued again
            client.turn()
        with open_store(pg) as store:
            assert Session(store, client.session, tenant="acme").record.version == 0
        port = free_port()
        worker = Worker(
            pg, REDIS, queue, upstream.url, log, "--metrics-port", str(port), **visibility
        )
        landed = _wait_jobs(
            pg,
            "acme",
            client.session,
            lambda found: any(a.outcome not in (None, "lost") for a in found),
            timeout=60,
        )
        time.sleep(1.0)  # a second landing, were there one, would be logged by now
        attempts = _wait_jobs(pg, "acme", client.session, lambda found: True)
        assert landed
        metrics = httpx2.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        client.close()
        worker.stop()
        proxy.stop()
    record = _check_stored(pg, "acme", client)
    first = attempts[0]
    assert first.outcome == "lost" and first.ended_at is not None  # its worker died mid-job:
    assert first.error and "delivered again" in first.error  # closed when the job came back
    said = log.read_text()  # the restarted worker shut its clients down cleanly
    assert "Task exception was never retrieved" not in said and "Event loop is closed" not in said
    again = [a for a in attempts if a.job_id == first.job_id and a.outcome not in (None, "lost")]
    # it lands once; under load the 4 s visibility may hand it out again, and that late
    # attempt finds the summary already written
    outcomes = [a.outcome for a in again]
    assert outcomes[0] == "landed" and set(outcomes[1:]) <= {"unchanged"}, attempts
    assert len({a.job_id for a in attempts}) == 1, attempts  # deduplicated while pending
    assert record.version == 1 and record.summary and "ORD-" in record.summary
    assert 'ctxwarden_summary_job_attempts_total{outcome="landed"} 1.0' in metrics


def test_requests_keep_succeeding_when_redis_stops(
    pg: str, upstream: ScaleUpstream, tmp_path: Path
) -> None:
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    redis_proc = subprocess.Popen(
        [server, "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    broker = f"redis://127.0.0.1:{port}/0"
    policy = _policy(tmp_path, max_messages=8, keep_recent=4)
    key = add_tenant(pg, "acme")
    proxy = ProxyServer(pg, upstream=upstream.url, extra=("--policy", policy, "--broker", broker))
    client = Client([proxy.url], key)
    try:
        for _ in range(10):
            client.turn()
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
        for _ in range(20):
            client.turn()  # raises on any error status
        metrics = httpx2.get(proxy.url + "/metrics").text
        builds = httpx2.get(
            f"{proxy.url}/v1/sessions/{client.session}/builds?limit=100",
            headers={"Authorization": f"Bearer {key}"},
        ).json()
    finally:
        client.close()
        proxy.stop()
        if redis_proc.poll() is None:
            redis_proc.kill()
    _check_stored(pg, "acme", client)
    found = re.search(r'ctxwarden_summary_jobs_total\{outcome="deferred"\} (\d+)', metrics)
    assert found and int(float(found.group(1))) >= 1, metrics
    assert re.search(r'ctxwarden_summary_jobs_total\{outcome="enqueued"\} 1\.0', metrics)
    warned = [w for b in builds["builds"] for w in b["audit"]["warnings"] if "deferred" in w]
    assert warned and "job broker is unreachable" in warned[0], json.dumps(builds)[:2000]


class Relay:
    """A TCP relay to PostgreSQL on a port of its own: stopping it is PostgreSQL going
    away for the processes that connect through it (the shared server stays up)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self.start()

    def start(self) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(64)
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            with self._lock:
                self._socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept() blocked in its thread
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def test_postgres_down_answers_503_and_loses_nothing(
    pg: str, upstream: ScaleUpstream, tmp_path: Path
) -> None:
    parts = urlsplit(pg)
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432))
    via_relay = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{relay.port}"))
    key = add_tenant(pg, "acme")
    proxy = ProxyServer(via_relay, upstream=upstream.url)
    client = Client([proxy.url], key)
    try:
        for _ in range(6):
            client.turn()
        relay.stop()
        body = json.dumps({"model": "gpt-4o", "messages": client.history})
        headers = {"content-type": "application/json", "X-Ctxwarden-Session": client.session}
        for _ in range(2):  # a broken pooled connection, then no connection at all
            started = time.monotonic()
            got = client.http.post(
                proxy.url + "/v1/chat/completions", content=body, headers=headers
            )
            assert got.status_code == 503, got.text
            error = got.json()["error"]
            assert error["code"] == "store_unavailable"
            assert "session store is unavailable" in error["message"]
            assert time.monotonic() - started < 15
        assert httpx2.get(proxy.url + "/readyz", timeout=30).status_code == 503
        relay.start()
        # the pool reconnects in the background (with backoff): a client retries on 503
        deadline = time.monotonic() + 60
        while httpx2.get(proxy.url + "/readyz", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "the store did not come back within 60 s"
            time.sleep(0.5)
        for _ in range(4):  # the same turn again, then on
            client.turn()
        metrics = httpx2.get(proxy.url + "/metrics").text
    finally:
        client.close()
        proxy.stop()
        relay.stop()
    assert re.search(r"ctxwarden_store_unavailable_total [2-9]", metrics)
    _check_stored(pg, "acme", client)


def test_concurrent_turns_of_one_session_on_two_replicas_never_interleave(
    pg: str, upstream: ScaleUpstream
) -> None:
    key = add_tenant(pg, "acme")
    with ThreadPoolExecutor(2) as pool:
        proxies = list(pool.map(lambda _: ProxyServer(pg, upstream=upstream.url), "ab"))
    client = Client([p.url for p in proxies], key)
    sent: list[list[dict[str, Any]]] = []
    statuses: list[int] = []
    try:
        for _ in range(4):
            client.turn()
        for r in range(8):  # two different next turns of the same session, at once
            forks = [
                [*client.history, {"role": "user", "content": f"Also ORD-{r}{side}, please."}]
                for side in "xy"
            ]

            def post(i: int, forks: list[list[dict[str, Any]]] = forks) -> int:
                body = json.dumps({"model": "gpt-4o", "messages": forks[i]})
                headers = {
                    "content-type": "application/json",
                    "X-Ctxwarden-Session": client.session,
                }
                url = proxies[i].url + "/v1/chat/completions"
                return client.http.post(url, content=body, headers=headers).status_code

            with ThreadPoolExecutor(2) as pool:
                statuses += list(pool.map(post, (0, 1)))
            sent += forks
    finally:
        client.close()
        for proxy in proxies:
            proxy.stop()
    # each pair: both served (one on a branch), or one answered 409 after its retries
    assert set(statuses) <= {200, 409} and statuses.count(200) >= 8, statuses
    with open_store(pg) as store:
        stored = {
            s.session_id: [
                what_it_says(m) for m in Session(store, s.session_id, tenant="acme").export()
            ]
            for s in store.list_sessions("acme")
        }
    asks = [what_it_says(f[-1]) for f in sent]
    for session_id, messages in stored.items():
        # a stored history is one client's history: at most one of each pair of asks
        mine = [a for a in asks if a in messages]
        pairs = {a[1].split()[1][:-1].rstrip("xy") for a in mine}
        assert len(pairs) == len(mine), (session_id, mine)
        for m in messages:  # and every message in it was sent or received in that order
            assert messages.count(m) == 1 or m[0] == "assistant", (session_id, m)
