"""The hub's worker threads keep ``anyio.to_thread.run_sync``'s contract."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ctxwarden.core.errors import ConfigError
from ctxwarden.service.config import ServiceConfig
from ctxwarden.service.hub import Hub
from ctxwarden.service.metrics import Metrics
from ctxwarden.service.workers import Workers

_WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


def test_calls_run_off_the_loop_in_order_within_the_thread_count() -> None:
    async def run() -> None:
        workers = Workers(2)
        running, most, order = 0, 0, []
        lock = threading.Lock()

        def job(i: int) -> int:
            nonlocal running, most
            with lock:
                running += 1
                most = max(most, running)
            time.sleep(0.02)
            with lock:
                running -= 1
                order.append(i)
            return i * i

        try:
            loop_thread = threading.get_ident()
            assert await workers.run(threading.get_ident) != loop_thread
            results = await asyncio.gather(*(workers.run(job, i) for i in range(6)))
            assert results == [i * i for i in range(6)]
            assert most == 2  # never more at once than threads
            one = Workers(1)
            await asyncio.gather(*(one.run(job, i) for i in range(10, 14)))
            assert order[-4:] == [10, 11, 12, 13]  # one thread: in the order they came
            one.close()
        finally:
            workers.close()

    asyncio.run(run())


def test_errors_and_the_callers_context_cross_over() -> None:
    async def run() -> None:
        workers = Workers(1)

        def fails() -> None:
            raise KeyError("missing")

        def stops() -> None:
            raise StopIteration

        try:
            _WHO.set("caller")
            assert await workers.run(_WHO.get) == "caller"
            with pytest.raises(KeyError, match="missing"):
                await workers.run(fails)
            with pytest.raises(RuntimeError, match="StopIteration"):
                await workers.run(stops)
            assert await workers.run(sum, [1, 2, 3]) == 6  # the thread survived both
        finally:
            workers.close()

    asyncio.run(run())


def test_a_cancelled_caller_starts_nothing_and_a_started_call_is_waited_for() -> None:
    async def run() -> None:
        workers = Workers(1)
        ran: list[str] = []

        def slow() -> str:
            time.sleep(0.2)
            ran.append("slow")
            return "done"

        try:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await workers.run(ran.append, "never")
            assert scope.cancelled_caught and ran == []

            got: list[str] = []
            started = time.monotonic()
            async with anyio.create_task_group() as group:

                async def call() -> None:
                    got.append(await workers.run(slow))

                group.start_soon(call)
                await anyio.sleep(0.05)
                group.cancel_scope.cancel()  # while the call runs in its thread
            assert ran == ["slow"] and got == ["done"]  # the caller waited for it, shielded
            assert time.monotonic() - started >= 0.2
        finally:
            workers.close()

    asyncio.run(run())


def test_no_threads_runs_each_call_on_the_loop_in_a_copy_of_the_callers_context() -> None:
    async def run() -> None:
        workers = Workers(0)

        def sets_and_reads() -> tuple[int, str]:
            seen = _WHO.get()
            _WHO.set("callee")  # stays in the call's copy
            return threading.get_ident(), seen

        def fails() -> None:
            raise KeyError("missing")

        _WHO.set("caller")
        assert await workers.run(sets_and_reads) == (threading.get_ident(), "caller")
        assert _WHO.get() == "caller"
        with pytest.raises(KeyError, match="missing"):
            await workers.run(fails)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await workers.run(_WHO.set, "never")
        assert scope.cancelled_caught and _WHO.get() == "caller"
        workers.close()  # nothing to stop

    asyncio.run(run())


def test_a_negative_thread_count_is_refused() -> None:
    with pytest.raises(ValueError, match="threads must be 0"):
        Workers(-1)


@contextlib.contextmanager
def _hub(tmp_path: Path, **config: Any) -> Iterator[Hub]:
    """A hub on a SQLite file in ``tmp_path``, closed after."""
    db = f"sqlite:///{tmp_path / 'hub.db'}"
    hub = Hub(ServiceConfig(db=db, upstream="http://127.0.0.1:9/v1", **config), Metrics())
    try:
        yield hub
    finally:
        hub.close()


def test_the_hub_runs_sqlite_work_on_the_loop_unless_given_threads(tmp_path: Path) -> None:
    async def thread_of(**config: Any) -> int:
        with _hub(tmp_path, **config) as hub:
            return await hub.run(threading.get_ident)

    async def run() -> None:
        loop_thread = threading.get_ident()
        assert await thread_of() == loop_thread
        assert await thread_of(store_threads=1) != loop_thread
        # a publish may wait on the broker
        assert await thread_of(broker="redis://127.0.0.1:9/0") != loop_thread

    asyncio.run(run())
    with pytest.raises(ConfigError, match="--store-threads must be between 0 and 64"):
        ServiceConfig(db="sqlite:///:memory:", upstream="http://127.0.0.1:9/v1", store_threads=65)


def test_calls_on_the_loop_let_it_take_its_turn_every_few_milliseconds() -> None:
    """20 calls of 4 ms ready at once: at most 3 run back to back (10 ms) before the
    loop runs its other tasks, which would otherwise wait for all 20 (80 ms)."""

    async def run() -> None:
        workers = Workers(0)
        done = 0
        between: list[int] = []

        def call() -> None:
            nonlocal done
            time.sleep(0.004)
            done += 1

        async def other_task() -> None:
            seen = 0
            while done < 20:
                await asyncio.sleep(0)
                between.append(done - seen)
                seen = done

        ticker = asyncio.ensure_future(other_task())
        await asyncio.gather(*(workers.run(call) for _ in range(20)))
        await ticker
        assert done == 20
        assert max(between) <= 3
        assert sum(1 for n in between if n) >= 7  # the calls ran over several turns

    asyncio.run(run())


def test_pages_and_the_session_api_wait_aside_not_on_the_loop(tmp_path: Path) -> None:
    """On SQLite a page's work runs in a thread of its own: a slow one holds up no
    proxied call on the loop; with store threads, it shares them."""

    async def run() -> None:
        gate = threading.Event()
        with _hub(tmp_path) as hub:
            try:
                slow_page = asyncio.ensure_future(hub.run_aside(gate.wait, 5.0))
                await asyncio.sleep(0.05)  # the page's work has started, and waits
                assert await hub.run(threading.get_ident) == threading.get_ident()  # served
                assert not slow_page.done()
                gate.set()
                assert await slow_page is True
            finally:
                gate.set()
        with _hub(tmp_path, store_threads=1) as threaded:
            assert await threaded.run_aside(threading.get_ident) == await threaded.run(
                threading.get_ident
            )

    asyncio.run(run())
