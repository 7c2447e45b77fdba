"""One summary decision (issue 35): ``build_context(summarizer="offline")``, a session's
append → ``summarize_sync`` → ``build()``, and ``ctxwarden serve`` with a ``ctxwarden
worker`` (Celery on Redis) send the same context, on LoCoMo questions and on the dev agent
loops.

By default a fixed subset runs (the first questions of each LoCoMo conversation, the first
runs of each agent file); ``-m exhaustive`` runs every question of LoCoMo dev with the
recall and fill targets, and every call of every dev run.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx2
import pytest
from llm_servers import Reply, ScriptedServer, openai_completion, openai_error
from service_harness import PG_SKIP, ProxyServer, add_tenant
from test_replicas import Worker
from test_session_paths import BUDGETS, SUBSET, _check, _runs

from ctxwarden.core.messages import Message
from ctxwarden.store import open_store
from ctxwarden.store.job_log import job_attempts
from ctxwarden_bench.session_path import locomo_paths, sent, session_locomo_path
from ctxwarden_bench.traces import load_locomo

REDIS = os.environ.get("CTXWARDEN_TEST_REDIS")
BUDGET = 4000


@pytest.fixture(scope="module")
def convs(locomo_path: Path) -> list[dict[str, Any]]:
    return load_locomo(locomo_path)


def _assert_same(rows: dict[str, dict[str, Any]], *paths: str) -> None:
    memory = rows["build_context"]
    for name in paths:
        assert rows[name]["same_as_build_context"] == rows[name]["questions"] > 0, rows
        assert rows[name]["answer_recall"] == memory["answer_recall"]
        assert rows[name]["fill"] == memory["fill"]


def test_locomo_questions_through_a_session_are_the_in_memory_contexts(
    convs: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Two questions of each dev conversation: the session's context is the in-memory one,
    summary view and all (it differed on every question before the summary's layout was
    one decision)."""
    store = f"sqlite:///{tmp_path / 'locomo.db'}"
    rows = locomo_paths(convs, BUDGET, paths={"session": session_locomo_path(store)}, questions=2)
    _assert_same(rows, "session")
    assert rows["session"]["fill"] >= 0.85


@pytest.fixture(scope="module")
def every_question(convs: list[dict[str, Any]], tmp_path_factory: Any) -> dict[str, Any]:
    store = f"sqlite:///{tmp_path_factory.mktemp('locomo') / 'locomo.db'}"
    return locomo_paths(convs, BUDGET, paths={"session": session_locomo_path(store)})


@pytest.mark.exhaustive
def test_every_locomo_dev_question_through_a_session(every_question: dict[str, Any]) -> None:
    """Measured: 885 of 885 questions the same context, recall 0.6830, fill 94.3 %
    (relevance recall on by default in a chat, the session reading its look-back; the
    gate not reading the summary's view, the block not repeating it)."""
    _assert_same(every_question, "session")
    assert every_question["session"]["fill"] >= 0.85


@pytest.mark.exhaustive
def test_locomo_dev_recall_asked_cold_reaches_the_target(every_question: dict[str, Any]) -> None:
    """Each question asked cold of the whole transcript, on both paths. Measured: 0.6830
    (fill 94.3 %); 0.541 before relevance recall was on by default for chat-shaped
    conversations, 0.6478 while its gate read the summary's view (issue 39's dev
    target for this figure: 0.66)."""
    assert every_question["session"]["answer_recall"] >= 0.56


# -- the agent loops with the offline summariser ---------------------------------------------


@pytest.mark.parametrize("which", ["tau", "swe"])
def test_dev_agent_loops_with_the_offline_summariser_through_a_session(
    which: str, tmp_path: Path, tau_bench_path: Path
) -> None:
    runs = _runs(which, tau_bench_path)[: SUBSET[which]]
    _check(runs, BUDGETS[which], f"sqlite:///{tmp_path / 'a.db'}", summarizer="offline")


@pytest.mark.exhaustive
@pytest.mark.parametrize("which", ["tau", "swe"])
def test_every_dev_call_with_the_offline_summariser_through_a_session(
    which: str, tmp_path: Path, tau_bench_path: Path
) -> None:
    runs = _runs(which, tau_bench_path)
    _check(runs, BUDGETS[which], f"sqlite:///{tmp_path / 'a.db'}", summarizer="offline")


# -- ctxwarden serve + ctxwarden worker -----------------------------------------------------------


class Served:
    """``serve --broker --summarizer offline`` and ``worker --summarizer offline`` on one
    PostgreSQL schema and the machine's Redis (a queue of their own)."""

    def __init__(self, db: str, tmp: Path) -> None:
        queue = f"ctxw-paths-{uuid.uuid4().hex[:8]}"
        self.db = db
        self.upstream = ScriptedServer().start()
        self.key = add_tenant(db, "acme")
        env = {"CTXWARDEN_JOB_QUEUE": queue}
        jobs = ("--broker", str(REDIS), "--summarizer", "offline")
        self.proxy = ProxyServer(db, upstream=self.upstream.url + "/v1", extra=jobs, env=env)
        self.worker = Worker(db, str(REDIS), queue, self.upstream.url, tmp / "worker.log",
                             "--summarizer", "offline")  # fmt: skip

    def close(self) -> None:
        self.worker.stop()
        self.proxy.stop()
        self.upstream.stop()

    def call(self, session: str, messages: Sequence[Message]) -> int:
        headers = {
            "Authorization": f"Bearer {self.key}",
            "X-Ctxwarden-Session": session,
            "X-Ctxwarden-Max-Input-Tokens": str(BUDGET),
        }
        r = httpx2.post(
            self.proxy.url + "/v1/chat/completions",
            json={"model": "gpt-4o", "messages": sent(messages)},
            headers=headers,
            timeout=60,
        )
        return r.status_code

    def wait_jobs(self, session: str, timeout: float = 60.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        with open_store(self.db) as store:
            while True:
                found = job_attempts(store, "acme", session)
                if (found and all(a.outcome for a in found)) or time.monotonic() > deadline:
                    return found
                time.sleep(0.2)

    def path(self, messages: Sequence[Message], budget: int) -> list[dict[str, Any]]:
        """One question as a client of the proxy: the first call finds the summary due
        and enqueues it (the upstream refuses that call, so no reply is stored and the
        history stays the question's); once the worker has folded, the same call again
        sends the context the upstream receives."""
        assert budget == BUDGET
        session = f"q-{uuid.uuid4().hex[:10]}"
        self.upstream.reply(Reply(status=400, body=openai_error("refused", "invalid_request")))
        assert self.call(session, messages) == 400
        attempts = self.wait_jobs(session)
        assert attempts and attempts[-1].outcome == "landed", attempts
        self.upstream.reply(Reply(body=openai_completion("ok")))
        assert self.call(session, messages) == 200
        return list(self.upstream.requests[-1].json["messages"])


@pytest.fixture
def served(pg_schema_url: str | None, tmp_path: Path) -> Iterator[Served]:
    if not pg_schema_url:
        pytest.skip(PG_SKIP)
    if not REDIS:
        pytest.skip("set CTXWARDEN_TEST_REDIS to a Redis URL to run the summary jobs")
    served = Served(pg_schema_url, tmp_path)
    try:
        yield served
    finally:
        served.close()


@pytest.mark.postgres
def test_locomo_questions_through_serve_and_a_worker_are_the_in_memory_contexts(
    convs: list[dict[str, Any]], served: Served, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path / 'locomo.db'}"
    paths = {"session": session_locomo_path(store), "serve + worker": served.path}
    rows = locomo_paths(convs[:2], BUDGET, paths=paths, questions=2)
    _assert_same(rows, "session", "serve + worker")


@pytest.mark.exhaustive
@pytest.mark.postgres
def test_every_locomo_dev_question_through_serve_and_a_worker(
    convs: list[dict[str, Any]], served: Served, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path / 'locomo.db'}"
    paths = {"session": session_locomo_path(store), "serve + worker": served.path}
    rows = locomo_paths(convs, BUDGET, paths=paths)
    _assert_same(rows, "session", "serve + worker")
    assert rows["serve + worker"]["fill"] >= 0.85  # (recall: as the session's, above)
