"""Embedding vectors after a call, off the request path (``[recall] embeddings``).

When a reply is stored and the tenant's policy recalls by embeddings, the session's
missing vectors (:meth:`ctxwarden.Session.embed`) are computed in the background, at
most one run per session at a time, in a worker thread (the SDK's client is
synchronous) under a small limiter of its own; the response never waits for it. A run
embeds the messages up to the reply it follows: a message appended by a later call is
that call's (its build embeds its newest user message, the query, itself), so no
message is sent to the endpoint twice. The next build reads what it stored. A failing
endpoint is logged and counted; the messages wait for the next call's run.
"""

from __future__ import annotations

import asyncio
import logging

import anyio
import anyio.to_thread

from ctxwarden import Session
from ctxwarden.errors import CtxwardenError
from ctxwarden.service.hub import Tenant

__all__ = ["Embeddings"]

log = logging.getLogger("ctxwarden.service")


class Embeddings:
    """Background embedding runs for one app (see the module docstring)."""

    def __init__(self) -> None:
        self._running: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._limiter = anyio.CapacityLimiter(2)
        self.failed = 0  # runs that ended with an error (the log says which)

    def after_call(self, tenant: Tenant, session: Session, upto_seq: int) -> None:
        """Start a run for ``session`` (messages up to ``upto_seq``) when the tenant's
        policy recalls by embeddings and no run is under way for it."""
        recall = tenant.policy.recall
        spec = recall.embeddings if recall is not None else None
        key = (tenant.name, session.session_id)
        if spec is None or key in self._running:
            return
        self._running.add(key)
        task = asyncio.get_running_loop().create_task(self._run(key, session, spec, upto_seq))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, key: tuple[str, str], session: Session, spec: str, upto: int) -> None:
        try:
            await anyio.to_thread.run_sync(
                lambda: session.embed(spec, upto_seq=upto), limiter=self._limiter
            )
        except CtxwardenError as exc:  # nothing half-written: the next call's run retries
            self.failed += 1
            log.warning("embedding vectors of %s/%s failed: %s", key[0], key[1], exc)
        finally:
            self._running.discard(key)

    async def aclose(self) -> None:
        """Wait for the runs under way (at shutdown)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
