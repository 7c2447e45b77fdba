"""``ctxwarden worker``: a Celery worker that runs the service's summary jobs.

The options become the environment :mod:`ctxwarden.jobs.settings` reads (so the same
worker also runs as ``celery -A ctxwarden.jobs worker`` with those variables set). The
store and the summariser spec are checked before the worker starts, so a wrong URL or
spec is one clear error, not a failing job per session. The pool is threads: a job
spends its time waiting on the model, and a thread pool keeps one process, which one
signal stops (or kills) whole.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from ctxwarden.cli.serve import Db

__all__ = ["worker"]


def worker(
    db: Db,
    broker: Annotated[
        str,
        typer.Option("--broker", envvar="CTXWARDEN_BROKER", help="Redis URL of the job queue."),
    ],
    summarizer: Annotated[
        str,
        typer.Option(
            "--summarizer",
            envvar="CTXWARDEN_SUMMARIZER",
            help="'offline' or a provider spec (openai:gpt-4o-mini).",
        ),
    ],
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, help="Jobs run at once (threads).")
    ] = 4,
    queue: Annotated[
        str | None,
        typer.Option("--queue", envvar="CTXWARDEN_JOB_QUEUE", help="Queue name (as serve's)."),
    ] = None,
    loglevel: Annotated[str, typer.Option("--loglevel")] = "INFO",
    metrics_port: Annotated[
        int | None,
        typer.Option("--metrics-port", help="Serve Prometheus metrics on 127.0.0.1:PORT."),
    ] = None,
) -> None:
    """Run summary jobs from the queue `ctxwarden serve --broker` fills: each one is the
    session's summary cycle, written once behind the session's version check."""
    from ctxwarden.jobs.settings import JobSettings
    from ctxwarden.pipeline.summarize import resolve_summarizer
    from ctxwarden.store import open_store

    env = {"CTXWARDEN_DB": db, "CTXWARDEN_BROKER": broker, "CTXWARDEN_SUMMARIZER": summarizer}
    if queue:
        env["CTXWARDEN_JOB_QUEUE"] = queue
    os.environ.update(env)
    settings = JobSettings.from_env()  # refuses a bad broker URL or queue now
    resolve_summarizer(summarizer)  # refuses a bad spec (or a missing key) now
    open_store(db).close()  # refuses an unreachable store now (and migrates it)
    from ctxwarden.jobs import app
    from ctxwarden.jobs.app import configure

    configure(settings)
    from ctxwarden.telemetry import configure_from_env

    configure_from_env("ctxwarden-worker")  # OTEL_* variables: the jobs' summarize spans
    if metrics_port is not None:
        from ctxwarden.jobs.metrics import serve_metrics

        serve_metrics(metrics_port)
    typer.echo(f"ctxwarden worker on {settings.queue} at {broker} (store {db})", err=True)
    app.worker_main(
        [
            "worker",
            "--pool=threads",
            f"--concurrency={concurrency}",
            f"--queues={settings.queue}",
            f"--loglevel={loglevel}",
            "--without-gossip",
            "--without-mingle",
        ]
    )
