"""Where summary jobs go and how long a taken job may run: read from the environment.

The service (``ctxwarden serve --broker``) and the worker (``ctxwarden worker`` or
``celery -A ctxwarden.jobs worker``) must agree on these, and ``celery -A`` passes no
options of ours, so they are environment variables, which the CLI options set:

- ``CTXWARDEN_BROKER``: the Redis URL (default ``redis://127.0.0.1:6379/0``);
- ``CTXWARDEN_JOB_QUEUE``: the queue name (default ``ctxwarden-summaries``), also the
  prefix of the keys that mark a session's job as pending;
- ``CTXWARDEN_JOB_VISIBILITY``: seconds a taken job stays unacknowledged before Redis
  hands it to another worker (default 300). A job is acknowledged only when it ends
  (``acks_late``), so a worker killed mid-job leaves it to be redelivered after this
  long; a job that runs longer is run twice, which the summary's version check makes
  harmless (the second finds the summary written and changes nothing).
- worker only: ``CTXWARDEN_DB`` (the store) and ``CTXWARDEN_SUMMARIZER`` (the spec).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ctxwarden.core.errors import ConfigError

__all__ = ["DEFAULT_BROKER", "DEFAULT_QUEUE", "JobSettings"]

DEFAULT_BROKER = "redis://127.0.0.1:6379/0"
DEFAULT_QUEUE = "ctxwarden-summaries"
DEFAULT_VISIBILITY = 300.0


@dataclass(frozen=True)
class JobSettings:
    broker: str = DEFAULT_BROKER
    queue: str = DEFAULT_QUEUE
    visibility: float = DEFAULT_VISIBILITY

    def __post_init__(self) -> None:
        if not self.broker.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(
                f"--broker must be a Redis URL (redis://host:port/db), got {self.broker!r}"
            )
        if not self.queue:
            raise ConfigError("the job queue name must not be empty")
        if self.visibility < 1:
            raise ConfigError(f"job visibility timeout must be >= 1 second, got {self.visibility}")

    @classmethod
    def from_env(cls) -> JobSettings:
        raw = os.environ.get("CTXWARDEN_JOB_VISIBILITY", str(DEFAULT_VISIBILITY))
        try:
            visibility = float(raw)
        except ValueError:
            raise ConfigError(f"CTXWARDEN_JOB_VISIBILITY must be seconds, got {raw!r}") from None
        return cls(
            broker=os.environ.get("CTXWARDEN_BROKER") or DEFAULT_BROKER,
            queue=os.environ.get("CTXWARDEN_JOB_QUEUE") or DEFAULT_QUEUE,
            visibility=visibility,
        )

    def pending_key(self, tenant: str, session_id: str) -> str:
        """The Redis key that says a job for the session is pending or running."""
        return f"{self.queue}:pending:{len(tenant)}:{tenant}:{session_id}"

    @property
    def pending_ttl(self) -> int:
        """How long a pending mark lives without its job ending: past one redelivery
        (a worker that died leaves the mark; the redelivered job clears it)."""
        return int(self.visibility * 2 + 60)
