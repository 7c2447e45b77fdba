"""Summaries as jobs (``ctxwarden serve --broker``): a due summary becomes one Celery job.

When a build reports a summary is due (``audit.summary_due``), :meth:`SummaryJobs.after_build`
marks the session's job pending and publishes it (:mod:`ctxwarden.jobs`); the call goes
on with the last stored summary and never waits for the job. A session whose job is
pending or running is not enqueued again; the messages it gets meanwhile wait for the
next cycle.

**Redis down**: the call is served all the same. The summary is deferred (the next due
build tries again), the build's audit says so, and
``ctxwarden_summary_jobs_total{outcome="deferred"}`` counts it. After a failure the
broker is not tried again for :data:`RETRY_AFTER` seconds, so an outage costs one
short timeout, not one per call.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING

from ctxwarden import Session
from ctxwarden.jobs.settings import JobSettings
from ctxwarden.telemetry import trace_headers

if TYPE_CHECKING:
    from ctxwarden import BuiltContext
    from ctxwarden.service.hub import Hub, Tenant

__all__ = ["RETRY_AFTER", "SummaryJobs"]

log = logging.getLogger("ctxwarden.service")

RETRY_AFTER = 5.0
"""Seconds after a failed publish during which due summaries are deferred untried."""


class SummaryJobs:
    """Enqueues due summaries for one app (see the module docstring)."""

    def __init__(self, hub: Hub, broker: str) -> None:
        from ctxwarden.jobs import summarize
        from ctxwarden.jobs.app import configure

        settings = dataclasses.replace(JobSettings.from_env(), broker=broker)
        configure(settings)
        self.hub = hub
        self.settings = settings
        self._task = summarize
        self._down_until = 0.0
        self._lock = threading.Lock()

    def after_build(
        self, tenant: Tenant, session: Session, model: str, built: BuiltContext
    ) -> str | None:
        """Enqueue the session's job when its summary is due; a warning for the build's
        audit when it had to be deferred (``None`` otherwise)."""
        if built.audit.summary_due is None:
            return None
        metrics = self.hub.metrics.summary_jobs
        with self._lock:
            down = time.monotonic() < self._down_until
        if down:
            metrics.labels("deferred").inc()
            return _deferred("the job broker did not answer a moment ago")
        try:
            outcome = self._enqueue(tenant, session.session_id, model, built.audit.budget)
        except Exception as exc:  # redis / kombu errors: the broker is down or refusing
            with self._lock:
                self._down_until = time.monotonic() + RETRY_AFTER
            metrics.labels("deferred").inc()
            log.warning("summary of %s/%s deferred: %s", tenant.name, session.session_id, exc)
            return _deferred(f"{type(exc).__name__}: {exc}")
        metrics.labels(outcome).inc()
        return None

    def _enqueue(self, tenant: Tenant, session_id: str, model: str, window: int) -> str:
        """Publish the job; the trigger's fill ratio is measured against the budget the
        build that found it due was made within (``window``), as the build measured it."""
        from ctxwarden.jobs.pending import clear_pending, set_pending

        if not set_pending(self.settings, tenant.name, session_id):
            return "pending"
        trigger = dataclasses.asdict(tenant.policy.summary)
        try:
            self._task.apply_async(
                (tenant.name, session_id, model, trigger, window),
                queue=self.settings.queue,
                retry=False,
                headers=trace_headers() or None,  # the job's span joins the call's trace
            )
        except BaseException:
            clear_pending(self.settings, tenant.name, session_id)
            raise
        return "enqueued"

    def after_call(self, tenant: Tenant, session: Session, model: str, built: BuiltContext) -> None:
        """Nothing after the call: jobs are enqueued from the build (see above)."""

    async def aclose(self) -> None:
        """Nothing to wait for: the jobs run in the workers."""


def _deferred(why: str) -> str:
    return (
        f"summary due but deferred: the job broker is unreachable ({why}); "
        "the next due build retries"
    )
