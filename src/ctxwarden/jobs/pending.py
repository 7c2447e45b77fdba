"""A session's pending mark: at most one summary job per session while one is queued or
running.

The service sets the mark with ``SET key 1 NX EX ttl`` before it publishes a job (only
the caller that set it publishes), and the job clears it when it ends. A worker that
dies mid-job leaves the mark; the broker redelivers the job, which clears it, and the
mark's time to live (:attr:`~ctxwarden.jobs.settings.JobSettings.pending_ttl`) bounds
how long a lost job can block the next one.
"""

from __future__ import annotations

import logging
from typing import Any

from ctxwarden.core.caching import BoundedCache
from ctxwarden.jobs.settings import JobSettings

__all__ = ["clear_pending", "redis_client", "set_pending"]

log = logging.getLogger("ctxwarden.jobs")

_CLIENTS: BoundedCache[str, Any] = BoundedCache("jobs.redis_clients", 16)


def redis_client(url: str) -> Any:
    """One shared client per URL (its pool is thread-safe), with short timeouts: a Redis
    that is down must fail a call within a second, not hold a request."""

    def connect() -> Any:
        import redis

        return redis.Redis.from_url(
            url, socket_connect_timeout=0.5, socket_timeout=1.0, retry_on_timeout=False
        )

    return _CLIENTS.get_or_make(url, connect)


def set_pending(settings: JobSettings, tenant: str, session_id: str) -> bool:
    """Mark the session's job pending; ``False`` when it already was (raises the
    client's error when Redis does not answer)."""
    client = redis_client(settings.broker)
    key = settings.pending_key(tenant, session_id)
    return bool(client.set(key, b"1", nx=True, ex=settings.pending_ttl))


def clear_pending(settings: JobSettings, tenant: str, session_id: str) -> None:
    """Clear the mark (best effort: a mark left behind expires on its own)."""
    import redis

    try:
        redis_client(settings.broker).delete(settings.pending_key(tenant, session_id))
    except redis.RedisError as exc:
        log.warning("could not clear the pending mark of %s/%s: %s", tenant, session_id, exc)
