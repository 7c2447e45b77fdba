"""The summary worker's event loop (:class:`ctxwarden.jobs.tasks.JobLoop`): every job of a
process runs on one loop, so the summariser's HTTP client is made once and reused, and
the worker's shutdown closes it on that loop before closing the loop (issue 41: a loop
per job left each job's client to be collected after its loop had closed)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from llm_servers import Reply, ScriptedServer, openai_completion

pytest.importorskip("celery")

from ctxwarden import Message
from ctxwarden.jobs import tasks
from ctxwarden.llm.spec import parse_spec


@pytest.fixture
def upstream() -> Iterator[ScriptedServer]:
    server = ScriptedServer(lambda r: Reply(body=openai_completion("a summary"))).start()
    try:
        yield server
    finally:
        server.stop()


def test_jobs_share_one_loop_and_one_client_closed_at_shutdown(
    upstream: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    monkeypatch.setenv("OPENAI_BASE_URL", upstream.url + "/v1")
    model: Any = parse_spec("openai:gpt-4o-mini")
    loop = tasks.JobLoop()
    failures: list[dict[str, Any]] = []
    loop.loop.set_exception_handler(lambda _loop, context: failures.append(context))
    clients, loops = [], []

    async def job() -> str:
        done = await model.complete([Message.user("summarise this")])
        clients.append(model._client.current)
        loops.append(asyncio.get_running_loop())
        return str(done.text)

    answers: list[str] = []
    threads = [threading.Thread(target=lambda: answers.append(loop.run(job()))) for _ in range(4)]
    for t in threads:  # from several threads at once, as Celery's thread pool runs jobs
        t.start()
    for t in threads:
        t.join()
    assert answers == ["a summary"] * 4
    assert len({id(c) for c in clients}) == 1 and len({id(x) for x in loops}) == 1
    loop.close([model.aclose])
    assert clients[0].is_closed()
    assert loop.loop.is_closed() and failures == []


def test_shutdown_closes_what_the_process_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[str] = []

    class Model:
        async def aclose(self) -> None:
            closed.append("model")

    class Part:
        model = Model()

    class Store:
        def close(self) -> None:
            closed.append("store")

    part = Part()
    res = tasks.WorkerResources(Store(), part, part, settings=None)  # type: ignore[arg-type]
    monkeypatch.setattr(tasks, "_RESOURCES", res)
    monkeypatch.setattr(tasks, "_LOOP", None)
    tasks.job_loop()
    tasks.shutdown()
    tasks.shutdown()  # twice: nothing left to close
    assert closed == ["model", "store"]  # one model shared by summariser and extractor
