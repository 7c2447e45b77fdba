"""Faults as an automated test (issue 41): ``ctxwarden serve`` killed with SIGKILL while
clients are mid-call, restarted on the same store, and the clients retrying what failed
(or what they gave up waiting for: every third call times out on the client's side);
with a broker, the summary worker killed and restarted too. Afterwards every stored
session is compared with what its client sent: nothing lost, nothing twice, nothing out
of order, no branch (a retry whose reply was stored gets that reply back:
:mod:`ctxwarden.service.replay`). Bounded: 4 clients of 14 turns, 2 server kills (and 2
worker kills), on loopback, in about a minute per store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from llm_servers import Recorded, Reply, ScriptedServer, openai_completion
from service_harness import CLI, ProxyServer, add_tenant, db_url

__all__ = ["db_url"]

CLIENTS, TURNS, KILLS = 4, 14, 2
REDIS = os.environ.get("CTXWARDEN_TEST_REDIS")


def _slow_answer(request: Recorded) -> Reply:
    """Answers after 60 ms (so a kill lands mid-call), naming the last user message."""
    time.sleep(0.06)
    last = [m for m in request.json["messages"] if m.get("role") == "user"][-1]
    return Reply(body=openai_completion(f"re: {last['content']}", prompt=20, completion=3))


class Served:
    """The server of the moment: its URL changes when it is started again."""

    def __init__(self, db: str, upstream: str, extra: tuple[str, ...], env: dict[str, str]):
        self.args = (db, upstream, extra, env)
        self.lock = threading.Lock()
        self.proxy = self._start()

    def _start(self) -> ProxyServer:
        db, upstream, extra, env = self.args
        return ProxyServer(db, upstream=upstream, extra=extra, env=env)

    @property
    def url(self) -> str:
        with self.lock:
            return self.proxy.url

    def kill_and_restart(self) -> None:
        with self.lock:
            self.proxy.kill()  # SIGKILL: no shutdown, whatever was mid-call
        fresh = self._start()
        with self.lock:
            self.proxy = fresh


class Agent(threading.Thread):
    """One client session: each turn posts the whole history and retries the same
    request until it is answered (connection refused or reset, a 5xx, a timeout)."""

    def __init__(self, served: Served, key: str, index: int) -> None:
        super().__init__(daemon=True)
        self.served, self.key = served, key
        self.session = f"fault-{index}-{uuid.uuid4().hex[:6]}"
        self.history: list[dict[str, Any]] = [
            {"role": "system", "content": f"You are agent {index}."},
        ]
        self.retries = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx2.Client(timeout=10) as http:
                for turn in range(TURNS):
                    self.history.append({"role": "user", "content": f"{self.session} turn {turn}"})
                    # every third turn the client gives up before upstream answers (60 ms)
                    # and sends the same request again: the stored reply comes back
                    reply = self._call(http, impatient=turn % 3 == 1)
                    self.history.append({"role": "assistant", "content": reply})
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _call(self, http: httpx2.Client, *, impatient: bool = False) -> str:
        body = json.dumps({"model": "gpt-4o", "messages": self.history})
        headers = {
            "authorization": f"Bearer {self.key}",
            "content-type": "application/json",
            "x-ctxwarden-session": self.session,
        }
        deadline = time.monotonic() + 60
        timeout = 0.02 if impatient else 10.0
        attempt = 0
        while True:
            if attempt:  # marked as the SDKs mark their own retries
                headers["x-stainless-retry-count"] = str(attempt)
            try:
                got = http.post(
                    self.served.url + "/v1/chat/completions",
                    content=body,
                    headers=headers,
                    timeout=timeout,
                )
                timeout = 10.0
                if got.status_code == 200:
                    return str(got.json()["choices"][0]["message"]["content"])
                assert got.status_code >= 500, got.text  # only a failure of ours is retried
            except httpx2.TransportError:  # (a timeout too)
                timeout = 10.0
            assert time.monotonic() < deadline, "the call was never answered"
            self.retries += 1
            attempt += 1
            time.sleep(0.1)


class Worker:
    """``ctxwarden worker`` (offline summaries) as a process."""

    def __init__(self, db: str, broker: str, queue: str, log: Path) -> None:
        self.out = log.open("ab")
        start = log.stat().st_size
        self.proc = subprocess.Popen(
            [CLI, "worker", "--db", db, "--broker", broker, "--queue", queue,
             "--summarizer", "offline", "--concurrency", "2"],
            stdout=self.out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while b" ready." not in log.read_bytes()[start:]:
            assert self.proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.out.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.out.close()


@pytest.fixture
def upstream() -> Iterator[ScriptedServer]:
    server = ScriptedServer(_slow_answer).start()
    try:
        yield server
    finally:
        server.stop()


def test_kill_9_mid_run_loses_nothing(
    db_url: str, upstream: ScriptedServer, tmp_path: Path
) -> None:
    key = add_tenant(db_url, "faults")
    extra: tuple[str, ...] = ()
    env: dict[str, str] = {}
    worker: Worker | None = None
    log = tmp_path / "worker.log"
    log.touch()
    jobs = REDIS is not None and db_url.startswith("postgresql")
    if jobs:  # summaries as jobs: the worker is killed too
        assert REDIS is not None
        policy = tmp_path / "policy.toml"
        policy.write_text("[summary]\nmax_messages = 10\nkeep_recent = 4\n")
        queue = f"ctxw-fault-{uuid.uuid4().hex[:8]}"
        extra = ("--policy", str(policy), "--broker", REDIS)
        env = {"CTXWARDEN_JOB_QUEUE": queue}
        worker = Worker(db_url, REDIS, queue, log)
    served = Served(db_url, upstream.url + "/v1", extra, env)
    agents = [Agent(served, key, i) for i in range(CLIENTS)]
    started = time.monotonic()
    try:
        for agent in agents:
            agent.start()
        for _ in range(KILLS):
            time.sleep(1.0)  # calls in flight: a kill lands mid-call
            served.kill_and_restart()
            if worker is not None:
                worker.kill()
                worker = Worker(db_url, REDIS or "", env["CTXWARDEN_JOB_QUEUE"], log)
        for agent in agents:
            agent.join(timeout=120)
    finally:
        served.proxy.stop()
        if worker is not None:
            worker.stop()
    assert [a.error for a in agents] == [None] * CLIENTS
    assert time.monotonic() - started < 120
    assert sum(a.retries for a in agents) > 0  # the kills did land mid-call

    from ctxwarden import Session
    from ctxwarden.store import open_store

    with open_store(db_url) as store:
        names = [s.session_id for s in store.list_sessions("faults")]
        for agent in agents:
            with Session(store, agent.session, tenant="faults") as session:
                stored = [{"role": m["role"], "content": m["content"]} for m in session.export()]
            assert stored == agent.history  # 0 lost, 0 twice, in order
            assert not [n for n in names if n.startswith(agent.session + "~")]  # no fork
        if jobs:  # the worker did run summary jobs through the kills
            from ctxwarden.store.job_log import job_attempts

            assert any(job_attempts(store, "faults", a.session) for a in agents)
    if jobs:
        said = log.read_text()
        assert "Task exception was never retrieved" not in said
