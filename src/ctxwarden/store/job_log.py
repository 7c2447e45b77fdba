"""The log of summary-job attempts (migration 005), written by ``ctxwarden worker``.

A job's attempt writes a ``started`` row before it reads the session and ends it with
its outcome (``landed``: a summary was written; ``unchanged``: the trigger no longer
fired, e.g. a redelivered job whose summary an earlier attempt wrote; ``retry`` and
``failed`` with the error). A row that keeps no end is an attempt whose worker died
mid-job: the broker redelivers the job, and the new attempt's start closes it as
``lost`` (in the same transaction), so no attempt stays ``started`` once its job ran
again; a row without an end is one still running, or one whose job was not redelivered
yet. So a failure is kept where an operator can read it, not only in a worker's log, and
a test can see a redelivery happen. Rows are written off the request path, one short
transaction each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ctxwarden.store._sql import sql_store as _sql
from ctxwarden.store.base import SessionStore

__all__ = ["LOST", "JobAttempt", "end_attempt", "job_attempts", "start_attempt"]

LOST = "lost"
"""The outcome of an attempt whose worker stopped before it ended (closed on redelivery)."""
_LOST_WHY = "its worker stopped before the attempt ended; the job was delivered again"
_COLS = "tenant, session_id, job_id, attempt, started_at, ended_at, outcome, error"


@dataclass(frozen=True)
class JobAttempt:
    """One attempt of a summary job; ``outcome`` is ``None`` while it runs (or if its
    worker died)."""

    tenant: str
    session_id: str
    job_id: str
    attempt: int
    started_at: float
    ended_at: float | None
    outcome: str | None
    error: str | None


def start_attempt(
    store: SessionStore, tenant: str, session_id: str, job_id: str, attempt: int
) -> float:
    """Record an attempt's start; returns its key time (pass it to :func:`end_attempt`).
    Earlier attempts of the job left without an end (their worker died) end as ``lost``."""
    started = time.time()
    with _sql(store)._write() as tx:
        tx.execute(
            "UPDATE ctxwarden_summary_jobs SET ended_at = ?, outcome = ?, error = ? "
            "WHERE tenant = ? AND session_id = ? AND job_id = ? AND ended_at IS NULL",
            (started, LOST, _LOST_WHY, tenant, session_id, job_id),
        )
        tx.execute(
            "INSERT INTO ctxwarden_summary_jobs (tenant, session_id, job_id, attempt, "
            "started_at) VALUES (?, ?, ?, ?, ?)",
            (tenant, session_id, job_id, attempt, started),
        )
    return started


def end_attempt(
    store: SessionStore,
    tenant: str,
    session_id: str,
    job_id: str,
    started_at: float,
    outcome: str,
    error: str | None = None,
) -> None:
    """Record how the attempt started at ``started_at`` ended."""
    with _sql(store)._write() as tx:
        tx.execute(
            "UPDATE ctxwarden_summary_jobs SET ended_at = ?, outcome = ?, error = ? "
            "WHERE tenant = ? AND session_id = ? AND job_id = ? AND started_at = ?",
            (time.time(), outcome, error, tenant, session_id, job_id, started_at),
        )


def job_attempts(store: SessionStore, tenant: str, session_id: str) -> list[JobAttempt]:
    """Every attempt recorded for the session, oldest first."""
    with _sql(store)._read() as tx:
        rows = tx.execute(
            f"SELECT {_COLS} FROM ctxwarden_summary_jobs "
            "WHERE tenant = ? AND session_id = ? ORDER BY started_at",
            (tenant, session_id),
        )
    return [
        JobAttempt(
            r[0],
            r[1],
            r[2],
            int(r[3]),
            float(r[4]),
            None if r[5] is None else float(r[5]),
            r[6],
            r[7],
        )
        for r in rows
    ]
