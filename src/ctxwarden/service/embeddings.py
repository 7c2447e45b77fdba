"""Embedding vectors after a call, off the request path (``[recall] embeddings``).

When a reply is stored and the tenant's policy recalls by embeddings, the session's
missing vectors (:meth:`ctxwarden.Session.embed`) are computed in the background, at
most one run per session at a time, in a worker thread (the SDK's client is
synchronous) under a small limiter of its own; the response never waits for it. A run
embeds the messages up to the reply it follows: a message appended by a later call is
that call's (its build embeds its newest user message, the query, itself), so no
message is sent to the endpoint twice. The next build reads what it stored. A failing
endpoint is logged and counted; the messages wait for the next call's run.

With ``--broker`` (:meth:`Embeddings.use_broker`) the run is a job for ``ctxwarden
worker`` instead (:func:`ctxwarden.jobs.tasks.embed`), at most one queued or running per
session (a pending mark, as a summary job's); a job already pending takes the next
call's messages too, or the call after does. When the broker does not answer, the run
happens here as without one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from ctxwarden import Session
from ctxwarden.core.errors import CtxwardenError

if TYPE_CHECKING:  # (the hub makes this module's Embeddings: a type only here)
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
        self._jobs: Any = None  # JobSettings, with --broker

    def use_broker(self, settings: Any) -> None:
        """Enqueue the runs as worker jobs on ``settings.broker`` (``serve --broker``)."""
        self._jobs = settings

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
            if self._jobs is not None:
                job = (self._jobs, key[0], session.session_id, spec, upto)
                if await anyio.to_thread.run_sync(_enqueue, *job, limiter=self._limiter):
                    return
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


def _enqueue(settings: Any, tenant: str, session_id: str, spec: str, upto: int) -> bool:
    """Publish the session's embedding job unless one is pending; ``False`` when the
    broker does not answer (the caller runs it itself)."""
    from ctxwarden.jobs.pending import clear_pending, set_pending
    from ctxwarden.jobs.tasks import embed, embed_pending_id

    pending = embed_pending_id(session_id)
    try:
        if not set_pending(settings, tenant, pending):
            return True  # a job is queued or running: it, or the next call's, takes these
    except Exception as exc:  # redis errors: the broker is down
        log.warning("embedding job of %s/%s not enqueued: %s", tenant, session_id, exc)
        return False
    try:
        embed.apply_async((tenant, session_id, spec, upto), queue=settings.queue, retry=False)
    except Exception as exc:  # kombu / redis errors
        clear_pending(settings, tenant, pending)
        log.warning("embedding job of %s/%s not enqueued: %s", tenant, session_id, exc)
        return False
    return True
