"""Prometheus metrics of the service, in the ``ctxwarden_`` namespace with base units.

Each app has its own :class:`prometheus_client.CollectorRegistry`, so two apps in one
process (tests) never share counters. ``/metrics`` renders it in the text format.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ctxwarden.core.errors import MissingDependencyError

if TYPE_CHECKING:
    from ctxwarden.store.sqlite_checkpoint import BackgroundCheckpoint

__all__ = ["METRIC_NAMES", "Metrics"]

METRIC_NAMES = (
    "ctxwarden_requests_total",
    "ctxwarden_history_tokens_total",
    "ctxwarden_input_tokens_total",
    "ctxwarden_saved_tokens_total",
    "ctxwarden_upstream_cached_tokens_total",
    "ctxwarden_output_tokens_total",
    "ctxwarden_fill_ratio",
    "ctxwarden_build_seconds",
    "ctxwarden_upstream_seconds",
    "ctxwarden_time_to_first_token_seconds",
    "ctxwarden_branches_total",
    "ctxwarden_summaries_due_total",
    "ctxwarden_summaries_run_total",
    "ctxwarden_summaries_failed_total",
    "ctxwarden_summary_seconds",
    "ctxwarden_summary_jobs_total",
    "ctxwarden_store_unavailable_total",
    "ctxwarden_recall_rounds_total",
    "ctxwarden_recalled_tokens_total",
)
"""Every metric the service exports (the README lists them with their labels)."""

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Histogram
        except ImportError as exc:  # pragma: no cover - the server extra brings it
            raise MissingDependencyError("ctxwarden serve", "server") from exc
        self.registry = CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        ns: dict[str, Any] = {"namespace": "ctxwarden", "registry": self.registry}
        api = ["api"]
        self.requests = Counter(
            "requests", "HTTP requests by route and status.", ["route", "status"], **ns
        )
        self.history_tokens = Counter(
            "history_tokens", "Tokens of the full stored history before the build.", api, **ns
        )
        self.input_tokens = Counter(
            "input_tokens", "Input tokens sent upstream after the build.", api, **ns
        )
        self.saved_tokens = Counter(
            "saved_tokens", "History tokens minus the tokens sent (never negative).", api, **ns
        )
        self.cached_tokens = Counter(
            "upstream_cached_tokens", "Cached input tokens reported by upstream.", api, **ns
        )
        self.output_tokens = Counter(
            "output_tokens", "Output tokens reported by upstream.", api, **ns
        )
        self.fill_ratio = Histogram(
            "fill_ratio",
            "Tokens sent over the model's context window.",
            api,
            buckets=(0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
            **ns,
        )
        self.build_seconds = Histogram(
            "build_seconds", "Time to sync the history and build the context.", api,
            buckets=_LATENCY, **ns,
        )  # fmt: skip
        self.upstream_seconds = Histogram(
            "upstream_seconds", "Upstream call time, to the last byte.", api,
            buckets=_LATENCY, **ns,
        )  # fmt: skip
        self.ttft_seconds = Histogram(
            "time_to_first_token_seconds", "Upstream time to the first streamed token.", api,
            buckets=_LATENCY, **ns,
        )  # fmt: skip
        self.branches = Counter(
            "branches", "New branches started for edited or truncated histories.", api, **ns
        )
        self.summaries_due = Counter("summaries_due", "Summary cycles whose trigger fired.", **ns)
        self.summaries_run = Counter("summaries_run", "Summary cycles written.", **ns)
        self.summaries_failed = Counter("summaries_failed", "Summary cycles that failed.", **ns)
        self.summary_seconds = Histogram(
            "summary_seconds", "Time of one summary cycle.", buckets=_LATENCY, **ns
        )
        self.summary_jobs = Counter(
            "summary_jobs",
            "Due summaries by what became of them: enqueued, pending (one already was), "
            "deferred (the job broker did not answer).",
            ["outcome"],
            **ns,
        )
        self.store_unavailable = Counter(
            "store_unavailable", "Requests answered 503 because the store did not answer.", **ns
        )

        self.recall_rounds = Counter(
            "recall_rounds",
            "Recall rounds the proxy answered, by outcome: answered, unknown_handle (a call "
            "named a handle the store lacks), cut (a recalled original cut to the budget "
            "left); limit: calls whose rounds ran out (the last request went without the tool).",
            ["api", "outcome"],
            **ns,
        )
        self.recalled_tokens = Counter(
            "recalled_tokens", "Tokens of recalled originals the proxy sent upstream.", api, **ns
        )

    def labelled(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, each child looked up once: ``labels`` takes a lock
        and checks every value on each call, and a proxied call asks for ten. For label
        values from a fixed set (an API, a route of the proxy's own)."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def watch_checkpoint(self, checkpoint: BackgroundCheckpoint) -> None:
        """Export what the SQLite store's checkpoint thread did, read at each scrape:
        ``ctxwarden_sqlite_checkpoints_total{outcome}`` (``copied``, ``failed``),
        ``ctxwarden_sqlite_log_pages`` and ``ctxwarden_sqlite_log_copied_pages``."""
        self.registry.register(_CheckpointCollector(checkpoint))

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _CheckpointCollector:
    """The checkpoint thread's counts, as a Prometheus counter and two gauges (see
    :meth:`Metrics.watch_checkpoint`)."""

    def __init__(self, checkpoint: BackgroundCheckpoint) -> None:
        self._checkpoint = checkpoint

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        c = self._checkpoint
        runs = CounterMetricFamily(
            "ctxwarden_sqlite_checkpoints",
            "Copies of the SQLite log into the database file by the server's checkpoint "
            "thread, by outcome: copied, failed (the log then waits for the next one).",
            labels=["outcome"],
        )
        runs.add_metric(["copied"], c.runs)
        runs.add_metric(["failed"], c.failures)
        yield runs
        yield GaugeMetricFamily(
            "ctxwarden_sqlite_log_pages",
            "Pages in the SQLite log at the last checkpoint (since the log last started over).",
            value=c.log_pages,
        )
        yield GaugeMetricFamily(
            "ctxwarden_sqlite_log_copied_pages",
            "Of those, the pages in the database file after it (fewer: readers held the rest).",
            value=c.copied_pages,
        )
