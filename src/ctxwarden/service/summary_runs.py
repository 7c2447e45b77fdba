"""Summary cycles after a call, off the request path (``ctxwarden serve --summarizer``).

When a reply is stored, the session's summary cycle (:meth:`ctxwarden.Session.summarize`,
with the tenant policy's ``[summary]`` trigger, its fill measured against the budget of
the call's build, as the build and a ``--broker`` job measure it) is started in the
background, at most one per session at a time; the response never waits for it. It runs
in its own worker thread (its own event loop for the model call), outside the store
limiter, so a slow summarising model never holds up calls; the cycle itself holds no
transaction while the model thinks. The next build uses what it wrote. Metrics:
``ctxwarden_summaries_due_total`` (the trigger fired), ``_run_total`` (written),
``_failed_total``, ``ctxwarden_summary_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import anyio
import anyio.to_thread

from ctxwarden import Session
from ctxwarden.core.errors import CtxwardenError
from ctxwarden.service.hub import Hub, Tenant

__all__ = ["Summaries"]

log = logging.getLogger("ctxwarden.service")


class Summaries:
    """Background summary cycles for one app (``spec`` as ``--summarizer`` takes it)."""

    def __init__(self, hub: Hub, spec: str) -> None:
        from ctxwarden.pipeline.summarize import resolve_summarizer

        self.hub = hub
        self.spec = spec
        self.summarizer, self.extractor, _ = resolve_summarizer(spec)
        self._running: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._limiter = anyio.CapacityLimiter(2)

    def after_build(self, tenant: Tenant, session: Session, model: str, built: Any) -> None:
        """Nothing at build time: the cycle starts after the call (see the module)."""

    def after_call(self, tenant: Tenant, session: Session, model: str, built: Any) -> None:
        """Start a cycle for ``session`` unless one is running for it; it measures the
        trigger's fill against the budget ``built`` was made within, as the build (and a
        ``--broker`` job) does."""
        key = (tenant.name, session.session_id)
        budget: int = built.audit.budget
        if key in self._running:
            return
        self._running.add(key)
        task = asyncio.get_running_loop().create_task(self._cycle(key, tenant, session, budget))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _cycle(
        self,
        key: tuple[str, str],
        tenant: Tenant,
        session: Session,
        budget: int,
    ) -> None:
        metrics = self.hub.metrics
        started = time.perf_counter()
        try:
            written = await anyio.to_thread.run_sync(
                self._run, session, tenant, budget, limiter=self._limiter
            )
            if written is not None:
                metrics.summaries_due.inc()
                metrics.summaries_run.inc()
                metrics.summary_seconds.observe(time.perf_counter() - started)
        except CtxwardenError as exc:  # a failed cycle changes nothing; the next call retries
            metrics.summaries_due.inc()
            metrics.summaries_failed.inc()
            log.warning("summary of %s/%s failed: %s", key[0], key[1], exc)
        finally:
            self._running.discard(key)

    def _run(self, session: Session, tenant: Tenant, budget: int) -> Any:
        from ctxwarden.pipeline.summarize import cycle_summarizer

        chosen, extractor = cycle_summarizer(self.spec, (self.summarizer, self.extractor, True))
        return asyncio.run(
            session.summarize(
                chosen,
                extractor,
                trigger=tenant.policy.summary,
                window=budget,
            )
        )

    async def aclose(self) -> None:
        """Wait for the cycles under way (at shutdown)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
