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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_harness import PG_SKIP
from test_session_paths import BUDGETS, SUBSET, _check, _runs

from ctxwarden_bench.served_path import SERVED_ROW, ServedPath
from ctxwarden_bench.session_path import locomo_paths, session_locomo_path
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


def test_a_build_the_upstream_never_answered_leaves_no_ledger_block_behind(
    convs: list[dict[str, Any]], tmp_path: Path
) -> None:
    """What ``serve`` + a worker do with one question: a build finds the summary due, the
    upstream refuses the call (``forget_sent``), the worker folds, the call again. A
    compaction keeps the ledger block it sent (issue 37), but a refused call sent nothing
    the provider cached: the second build is the in-memory one, not that block plus the
    new values in a second block (what the served row sent before ``forgotten`` cleared
    the ledger blocks too)."""
    from ctxwarden import build_context
    from ctxwarden.core.messages import Message
    from ctxwarden.session import Session
    from ctxwarden_bench.session_path import sent
    from ctxwarden_bench.traces import locomo_transcript

    conv = convs[0]
    qa = next(q for q in conv["qa"] if q.get("category") in (1, 2, 3, 4) and "answer" in q)
    history = [*locomo_transcript(conv), Message.user(str(qa["question"]))]
    messages = [m.with_id(f"m{i}") for i, m in enumerate(history)]
    want = sent(build_context(messages, "gpt-4o", BUDGET, summarizer="offline").messages)
    with Session(f"sqlite:///{tmp_path / 's.db'}", "q", model="gpt-4o") as s:
        s.append(messages)
        first = s.build("gpt-4o", max_input_tokens=BUDGET)
        assert first.audit.summary_due is not None
        s.forget_sent()  # the upstream refused the call
        s.summarize_sync("offline", max_input_tokens=BUDGET)
        assert sent(s.build("gpt-4o", max_input_tokens=BUDGET).messages) == want


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


def _service(pg_schema_url: str | None) -> tuple[str, str]:
    """(broker, store) for ``serve --broker`` + ``worker``, or skip saying what is missing."""
    if not pg_schema_url:
        pytest.skip(PG_SKIP)
    if not REDIS:
        pytest.skip("set CTXWARDEN_TEST_REDIS to a Redis URL to run the summary jobs")
    return REDIS, pg_schema_url


@pytest.fixture
def served(pg_schema_url: str | None) -> Iterator[ServedPath]:
    """The bench's path through ``ctxwarden serve`` + ``ctxwarden worker`` (the same
    implementation ``ctxwarden bench --broker`` reports), on a PostgreSQL schema of its own."""
    broker, db = _service(pg_schema_url)
    with ServedPath(broker, db) as served:
        yield served


@pytest.mark.postgres
def test_locomo_questions_through_serve_and_a_worker_are_the_in_memory_contexts(
    convs: list[dict[str, Any]], served: ServedPath, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path / 'locomo.db'}"
    paths = {"session": session_locomo_path(store), SERVED_ROW: served.path}
    rows = locomo_paths(convs[:2], BUDGET, paths=paths, questions=2)
    _assert_same(rows, "session", SERVED_ROW)


@pytest.mark.postgres
def test_the_bench_report_with_a_broker_has_a_serve_and_worker_row_equal_to_in_memory(
    convs: list[dict[str, Any]], pg_schema_url: str | None
) -> None:
    """``ctxwarden bench --broker`` (the report's LoCoMo paths, here 1 conversation x 2
    questions): the ``serve + worker`` row is there, sent the in-memory context on every
    question, and the Markdown report prints it."""
    from ctxwarden_bench.report import _locomo_paths, _paths_lines

    broker, db = _service(pg_schema_url)
    paths = _locomo_paths(convs[:1], None, broker=broker, served_db=db, questions=2)
    rows = paths["rows"]
    assert rows[SERVED_ROW]["questions"] == 2 and not paths["not_run"]
    _assert_same(rows, "session", SERVED_ROW)
    shown = "\n".join(_paths_lines(paths))
    assert f"| {SERVED_ROW} | 2 of 2 |" in shown, shown


@pytest.mark.exhaustive
@pytest.mark.postgres
def test_every_locomo_dev_question_through_serve_and_a_worker(
    convs: list[dict[str, Any]], served: ServedPath, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path / 'locomo.db'}"
    paths = {"session": session_locomo_path(store), SERVED_ROW: served.path}
    rows = locomo_paths(convs, BUDGET, paths=paths)
    _assert_same(rows, "session", SERVED_ROW)
    assert rows[SERVED_ROW]["fill"] >= 0.85  # (recall: as the session's, above)
