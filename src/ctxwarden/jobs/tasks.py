"""The summary job: one session's three-step summary cycle, run by a Celery worker.

The job carries what the service knew when it enqueued it (tenant, session, the model
the session is built for, the tenant policy's summary trigger and the input window
the trigger's fill ratio is measured against), so a worker needs no copy of the
service's policies. It runs :meth:`ctxwarden.Session.summarize`: a short read
transaction, the model call with no connection held, a short write guarded by the
session's version. Messages stored meanwhile lie after what the cycle folded and wait
for the next one.

Each attempt is logged (:mod:`ctxwarden.store.job_log`). A failure of the model or
the store is retried with exponential backoff (Celery's ``autoretry_for``); the last
failure is logged as ``failed`` and nothing stored is touched. The session's pending
mark (:mod:`ctxwarden.jobs.pending`) is cleared when the job ends, so the next due
build enqueues again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from ctxwarden.errors import ConfigError, StoreError, SummarizationError
from ctxwarden.jobs.app import app
from ctxwarden.jobs.metrics import observe
from ctxwarden.jobs.pending import clear_pending
from ctxwarden.jobs.settings import JobSettings
from ctxwarden.telemetry import continued

__all__ = ["MAX_RETRIES", "WorkerResources", "resources", "summarize"]

log = logging.getLogger("ctxwarden.jobs")

MAX_RETRIES = 5
"""Retries of a failing job (backoff 2, 4, 8, 16, 32 s with jitter, capped at 120 s)."""


@dataclass
class WorkerResources:
    """What every job of one worker process shares: the store's pool and the summariser."""

    store: Any
    summarizer: Any
    extractor: Any
    settings: JobSettings


_RESOURCES: WorkerResources | None = None
_LOCK = threading.Lock()


def resources() -> WorkerResources:
    """This process's store and summariser, opened on first use from ``CTXWARDEN_DB``
    and ``CTXWARDEN_SUMMARIZER`` (``ctxwarden worker`` sets both from its options)."""
    global _RESOURCES
    with _LOCK:
        if _RESOURCES is None:
            from ctxwarden.memory.cycle import resolve_summarizer
            from ctxwarden.store import open_store

            db = os.environ.get("CTXWARDEN_DB")
            spec = os.environ.get("CTXWARDEN_SUMMARIZER")
            if not db or not spec:
                raise ConfigError(
                    "a summary worker needs CTXWARDEN_DB and CTXWARDEN_SUMMARIZER "
                    "(or run: ctxwarden worker --db URL --broker URL --summarizer SPEC)"
                )
            summarizer, extractor, _ = resolve_summarizer(spec)
            _RESOURCES = WorkerResources(
                open_store(db), summarizer, extractor, JobSettings.from_env()
            )
        return _RESOURCES


@app.task(  # type: ignore[untyped-decorator]
    name="ctxwarden.summarize",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(SummarizationError, StoreError),
    retry_backoff=2,
    retry_backoff_max=120,
    retry_jitter=True,
    max_retries=MAX_RETRIES,
)
def summarize(
    self: Any,
    tenant: str,
    session_id: str,
    model: str,
    trigger: dict[str, Any],
    window: int | None,
) -> str:
    """Run one summary cycle for the session; returns ``landed`` or ``unchanged``."""
    from ctxwarden import Session
    from ctxwarden.memory.summaries import SummaryTrigger
    from ctxwarden.store.job_log import end_attempt, start_attempt

    res = resources()
    job_id = str(self.request.id or "eager")
    retries = int(self.request.retries or 0)
    started = start_attempt(res.store, tenant, session_id, job_id, retries + 1)
    try:
        session = Session(res.store, session_id, tenant=tenant, model=model)
        with continued(_headers(self.request)):  # the call that enqueued it: same trace
            written = asyncio.run(
                session.summarize(
                    res.summarizer,
                    res.extractor,
                    trigger=SummaryTrigger(**trigger),
                    window=window,
                )
            )
    except (SummarizationError, StoreError) as exc:
        final = retries >= MAX_RETRIES
        log.warning("summary job %s of %s/%s failed: %s", job_id, tenant, session_id, exc)
        outcome = "failed" if final else "retry"
        _end(end_attempt, res, tenant, session_id, job_id, started, outcome, exc)
        if final:
            clear_pending(res.settings, tenant, session_id)
        raise
    except BaseException as exc:
        _end(end_attempt, res, tenant, session_id, job_id, started, "failed", exc)
        clear_pending(res.settings, tenant, session_id)
        raise
    outcome = "unchanged" if written is None else ("landed" if written.folded else "facts")
    _end(end_attempt, res, tenant, session_id, job_id, started, outcome, None)
    clear_pending(res.settings, tenant, session_id)
    log.info("summary job %s of %s/%s: %s", job_id, tenant, session_id, outcome)
    return outcome


def _headers(request: Any) -> dict[str, Any]:
    """The trace headers the enqueuing call added (Celery puts a message's own headers on
    the request, or under ``headers`` in older protocol paths)."""
    nested = getattr(request, "headers", None) or {}
    return {name: getattr(request, name, None) or nested.get(name)
            for name in ("traceparent", "tracestate")}  # fmt: skip


def _end(
    end_attempt: Any,
    res: WorkerResources,
    tenant: str,
    session_id: str,
    job_id: str,
    started: float,
    outcome: str,
    exc: BaseException | None,
) -> None:
    """Log the attempt's end; a store that fails here must not hide the job's own error."""
    observe(outcome, time.time() - started)
    try:
        error = None if exc is None else str(exc)
        end_attempt(res.store, tenant, session_id, job_id, started, outcome, error)
    except StoreError as failed:
        log.warning("could not log the end of job %s: %s", job_id, failed)
