"""Summaries as Celery jobs on Redis (R16): ``celery -A ctxwarden.jobs worker`` finds ``app``.

The service enqueues one :func:`~ctxwarden.jobs.tasks.summarize` job per session when a
build reports a summary is due (:mod:`ctxwarden.service.summary_jobs`); a worker
(``ctxwarden worker --db URL --broker URL --summarizer SPEC``, or plain ``celery -A
ctxwarden.jobs worker`` with ``CTXWARDEN_DB`` and ``CTXWARDEN_SUMMARIZER`` set) runs the
session's three-step summary cycle. With ``[recall] embeddings`` in a tenant's policy,
the service also enqueues an :func:`~ctxwarden.jobs.tasks.embed` job after each call: the
worker stores the vectors the session's messages lack. Settings: :mod:`ctxwarden.jobs.settings`.

Delivery is at least once: ``acks_late`` with ``reject_on_worker_lost`` keeps a job in
Redis until it ends, so a worker killed mid-job leaves it to be redelivered; failures are
retried with exponential backoff. The summary lands exactly once all the same, because
the cycle's write is guarded by the session's version and a redelivered job finds the
trigger no longer fires.
"""

from __future__ import annotations

from ctxwarden.jobs.app import app
from ctxwarden.jobs.tasks import embed, summarize

__all__ = ["app", "embed", "summarize"]
