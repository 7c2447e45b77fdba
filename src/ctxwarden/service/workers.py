"""The threads :meth:`~ctxwarden.service.hub.Hub.run` hands blocking work to.

Every proxied call crosses to a worker thread and back two or three times (the tenant's
key, the sync and build, the reply's store). ``anyio.to_thread.run_sync`` made each
crossing cost a scheduling round of the event loop, a capacity limiter, a cancel scope
and a ``queue.Queue`` (a Python lock and condition) on both sides; here a fixed set of
threads takes calls from a :class:`queue.SimpleQueue` (C) and hands results back with
one ``call_soon_threadsafe``. What callers see is the same: at most ``threads`` calls
run at once, in the order they came, each in a copy of the caller's context; a caller
already cancelled (an anyio cancel scope) hands nothing over, and once it has, it waits
for the call to finish (shielded, as ``run_sync`` does), so a cancelled request never
leaves store work running behind its lock.

With ``threads=0`` each call runs on the event loop itself, in a copy of the caller's
context, with no hand-over at all; calls ready together run back to back for up to
10 ms, then the loop takes its turn (its other requests' reads and streams). That is
what a SQLite store gets by default (see :mod:`ctxwarden.service.hub`): its calls take a
few milliseconds of Python that holds the GIL anyway, and handing each to a thread and
back cost ~15% of a proxied call's CPU (the threads' wake-ups and the GIL passing
between them).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

__all__ = ["Workers"]

_TURN = 0.01
"""Seconds of calls the loop runs back to back (``threads=0``) before its own turn."""

T = TypeVar("T")
_Item = tuple[
    asyncio.AbstractEventLoop,
    "asyncio.Future[Any]",
    contextvars.Context,
    Callable[..., Any],
    tuple[Any, ...],
]


class Workers:
    def __init__(self, threads: int, name: str = "ctxwarden worker") -> None:
        if threads < 0:
            raise ValueError(f"threads must be 0 (on the event loop) or more, got {threads}")
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, float] = (
            weakref.WeakKeyDictionary()
        )
        self._threads = [
            threading.Thread(target=self._work, name=f"{name} {i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in one of the threads, or here with none (see the module
        docstring)."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        loop = asyncio.get_running_loop()
        if not self._threads:
            return await self._here(loop, fn, args)
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((loop, future, contextvars.copy_context(), fn, args))
        with anyio.CancelScope(shield=True):
            result = await future
        return result

    async def _here(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[..., T], args: tuple[Any, ...]
    ) -> T:
        """``fn(*args)`` on the loop. Calls that become ready in one iteration of the
        loop run back to back for up to :data:`_TURN` seconds; the rest wait for the
        next iteration, after the loop's own work (other requests' bodies, their
        streams): without that, at 64 concurrent clients some requests waited seconds
        while others were served."""
        while True:
            now = time.perf_counter()
            started = self._turns.get(loop)
            if started is None:  # the first call of this turn of the loop
                self._turns[loop] = now
                loop.call_soon(self._turns.pop, loop, None)  # the turn ends with it
                break
            if now - started <= _TURN:
                break
            await asyncio.sleep(0)  # this turn is spent: after the loop's own
        return contextvars.copy_context().run(fn, *args)

    def close(self) -> None:
        """Stop the threads once the calls already queued are done (no wait)."""
        for _ in self._threads:
            self._queue.put(None)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            loop, future, context, fn, args = item
            result, error = None, None
            if not future.cancelled():
                try:
                    result = context.run(fn, *args)
                except BaseException as exc:  # delivered to the caller, as run_sync does
                    error = exc
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_deliver, future, result, error)
            del item, future, result, error


def _deliver(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    elif isinstance(error, StopIteration):  # a future cannot hold StopIteration
        wrapped = RuntimeError("the worker's call raised StopIteration")
        wrapped.__cause__ = error
        future.set_exception(wrapped)
    else:
        future.set_exception(error)
