"""The worker's Prometheus metrics (``ctxwarden worker --metrics-port N``).

``ctxwarden_summary_job_attempts_total{outcome}`` counts attempts by how they ended
(``landed``, ``facts``, ``unchanged``, ``retry``, ``failed``) and
``ctxwarden_summary_job_seconds`` times them. Without a metrics port nothing is
registered or served; the job log (:mod:`ctxwarden.store.job_log`) keeps every attempt
either way.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["observe", "serve_metrics"]

_METRICS: tuple[Any, Any] | None = None
_LOCK = threading.Lock()


def serve_metrics(port: int, host: str = "127.0.0.1") -> None:
    """Register the metrics and serve them on ``host:port`` (a daemon thread)."""
    global _METRICS
    from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

    registry = CollectorRegistry()
    ns: dict[str, Any] = {"namespace": "ctxwarden", "registry": registry}
    attempts = Counter(
        "summary_job_attempts", "Summary job attempts by outcome.", ["outcome"], **ns
    )
    seconds = Histogram(
        "summary_job_seconds",
        "Time of one summary job attempt (the model call included).",
        buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
        **ns,
    )
    with _LOCK:
        _METRICS = (attempts, seconds)
    start_http_server(port, addr=host, registry=registry)


def observe(outcome: str, seconds: float) -> None:
    """Count one attempt (nothing without :func:`serve_metrics`)."""
    with _LOCK:
        found = _METRICS
    if found is not None:
        found[0].labels(outcome).inc()
        found[1].observe(seconds)
