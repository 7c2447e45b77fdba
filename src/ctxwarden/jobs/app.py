"""The Celery app, configured from :class:`~ctxwarden.jobs.settings.JobSettings`.

Imported only by the worker and by ``serve --broker`` (Celery is the ``jobs`` extra).
"""

from __future__ import annotations

from typing import Any

from ctxwarden.core.errors import MissingDependencyError
from ctxwarden.jobs.settings import JobSettings

__all__ = ["app", "configure", "make_app"]

try:
    from celery import Celery
except ImportError as exc:  # pragma: no cover - the jobs extra is missing
    raise MissingDependencyError("summary jobs (Celery on Redis)", "jobs") from exc


def _config(settings: JobSettings) -> dict[str, Any]:
    transport = {
        "visibility_timeout": settings.visibility,
        # sweep for jobs of dead workers about every visibility period, not every 100 s
        "unacked_restore_interval": max(1, min(10, int(settings.visibility // 2))),
        "unacked_restore_throttle": 1,
        # a Redis that is down must fail a publish within a second, not hang a request
        "socket_connect_timeout": 1.0,
        "socket_timeout": 5.0,
        "retry_on_timeout": False,
    }
    return {
        "broker_url": settings.broker,
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "task_default_queue": settings.queue,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "worker_hijack_root_logger": False,
    }


def make_app(settings: JobSettings) -> Any:
    """A Celery app for ``settings`` (the task module registers its task on ``app``)."""
    celery = Celery("ctxwarden")
    celery.conf.update(_config(settings))
    return celery


def configure(settings: JobSettings) -> None:
    """Point :data:`app` at ``settings`` (the CLI calls this after parsing options)."""
    app.conf.update(_config(settings))


app = make_app(JobSettings.from_env())
"""The app ``celery -A ctxwarden.jobs`` loads, configured from the environment."""
