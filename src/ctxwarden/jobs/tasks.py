"""The summary job: one session's three-step summary cycle, run by a Celery worker.

The job carries what the service knew when it enqueued it (tenant, session, the model
the session is built for, the tenant policy's summary trigger and the input window
the trigger's fill ratio is measured against), so a worker needs no copy of the
service's policies. It runs :meth:`ctxwarden.Session.summarize`: a short read
transaction, the model call with no connection held, a short write guarded by the
session's version. Messages stored meanwhile lie after what the cycle folded and wait
for the next one.

Every job of a worker process runs on one event loop, in a thread of its own
(:class:`JobLoop`): the summariser's HTTP client belongs to the loop that opened its
connections, so a loop per job (``asyncio.run``) left each job's client to be collected
after its loop had closed ("Task exception was never retrieved ... Event loop is
closed"). At the worker's shutdown the clients are closed on that loop, then the loop.

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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from celery.signals import worker_shutdown

from ctxwarden.core.errors import ConfigError, ProviderError, StoreError, SummarizationError
from ctxwarden.jobs.app import app
from ctxwarden.jobs.metrics import observe
from ctxwarden.jobs.pending import clear_pending
from ctxwarden.jobs.settings import JobSettings
from ctxwarden.telemetry import continued

__all__ = [
    "MAX_RETRIES",
    "JobLoop",
    "WorkerResources",
    "embed",
    "embed_pending_id",
    "job_loop",
    "resources",
    "shutdown",
    "summarize",
]

T = TypeVar("T")

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
    spec: str = ""  # as CTXWARDEN_SUMMARIZER gives it
    embedders: dict[str, Any] = field(default_factory=dict)  # embeddings clients, by spec

    def embedder(self, spec: str) -> Any:
        """The process's client for an embeddings spec (made on first use)."""
        from ctxwarden.llm.embeddings import Embedder

        with _LOCK:
            found = self.embedders.get(spec)
            if found is None:
                found = self.embedders[spec] = Embedder(spec)
            return found


_RESOURCES: WorkerResources | None = None
_LOCK = threading.Lock()


class JobLoop:
    """One event loop for the jobs of this process, run in a daemon thread; jobs (in
    Celery's threads) hand it their coroutine and wait (see the module docstring)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="ctxwarden-jobs-loop", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self, closers: list[Callable[[], Coroutine[Any, Any, Any]]]) -> None:
        """Run each ``closer`` on the loop (each within 5 s), then stop and close it."""
        for closer in closers:
            try:
                asyncio.run_coroutine_threadsafe(closer(), self.loop).result(timeout=5)
            except Exception as exc:  # a client that fails to close must not stop the rest
                log.warning("closing a summariser client failed: %s", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


_LOOP: JobLoop | None = None


def job_loop() -> JobLoop:
    """This process's :class:`JobLoop`, started on first use."""
    global _LOOP
    with _LOCK:
        if _LOOP is None:
            _LOOP = JobLoop()
        return _LOOP


def shutdown() -> None:
    """Close the summariser's clients on the jobs' loop, the loop and the store (the
    worker's shutdown signal calls this; safe to call twice)."""
    global _LOOP, _RESOURCES
    with _LOCK:
        loop, res, _LOOP, _RESOURCES = _LOOP, _RESOURCES, None, None
    closers: list[Callable[[], Coroutine[Any, Any, Any]]] = []
    if res is not None:
        seen: set[int] = set()
        for part in (res.summarizer, res.extractor):
            model = getattr(part, "model", None)
            if model is not None and hasattr(model, "aclose") and id(model) not in seen:
                seen.add(id(model))
                closers.append(model.aclose)
    if loop is not None:
        loop.close(closers)
    if res is not None:
        for embedder in res.embedders.values():
            embedder.close()
        res.store.close()


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _on_worker_shutdown(**_: Any) -> None:
    shutdown()


def resources() -> WorkerResources:
    """This process's store and summariser, opened on first use from ``CTXWARDEN_DB``
    and ``CTXWARDEN_SUMMARIZER`` (``ctxwarden worker`` sets both from its options)."""
    global _RESOURCES
    with _LOCK:
        if _RESOURCES is None:
            from ctxwarden.pipeline.summarize import resolve_summarizer
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
                open_store(db), summarizer, extractor, JobSettings.from_env(), spec
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
    from ctxwarden.pipeline.summarize import cycle_summarizer
    from ctxwarden.store.job_log import end_attempt, start_attempt

    res = resources()
    job_id = str(self.request.id or "eager")
    retries = int(self.request.retries or 0)
    started = start_attempt(res.store, tenant, session_id, job_id, retries + 1)
    try:
        session = Session(res.store, session_id, tenant=tenant, model=model)
        chosen, extractor = cycle_summarizer(res.spec, (res.summarizer, res.extractor, True))
        with continued(_headers(self.request)):  # the call that enqueued it: same trace
            written = job_loop().run(
                session.summarize(
                    chosen,
                    extractor,
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


def embed_pending_id(session_id: str) -> str:
    """The id an embedding job's pending mark is kept under (apart from the summary's)."""
    return f"embed:{session_id}"


@app.task(  # type: ignore[untyped-decorator]
    name="ctxwarden.embed",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(ProviderError, StoreError),
    retry_backoff=2,
    retry_backoff_max=120,
    retry_jitter=True,
    max_retries=MAX_RETRIES,
)
def embed(self: Any, tenant: str, session_id: str, spec: str, upto_seq: int) -> int:
    """Store the embedding vectors the session's messages up to ``upto_seq`` lack
    (:meth:`ctxwarden.Session.embed`; each message is embedded once, so a redelivered
    job asks for none again); returns how many it stored."""
    from ctxwarden import Session

    res = resources()
    retries = int(self.request.retries or 0)
    final = True
    try:
        session = Session(res.store, session_id, tenant=tenant)
        try:
            made = session.embed(res.embedder(spec), upto_seq=upto_seq)
        finally:
            session.close()
    except (ProviderError, StoreError) as exc:
        final = retries >= MAX_RETRIES
        log.warning("embedding job of %s/%s failed: %s", tenant, session_id, exc)
        raise
    finally:
        if final:
            clear_pending(res.settings, tenant, embed_pending_id(session_id))
    log.info("embedding job of %s/%s: %d vectors", tenant, session_id, made)
    return made


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
