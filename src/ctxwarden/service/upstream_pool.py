"""The upstream client's connections: asyncio streams under httpcore's pool.

httpcore's default asyncio backend goes through anyio: every read and write opens a
cancel scope with its own deadline timer, checkpoints once more through the event loop,
and looks up the current task several times; the pool's per-request liveness check
built a mapping of all the stream's attributes. On this proxy's path (one request
upstream per call, and a read per streamed chunk) that was about a fifth of the HTTP
client's CPU. :class:`Stream` speaks to an asyncio transport directly, with the same
contract as httpcore's anyio stream: ``read`` returns at most ``max_bytes`` (``b""`` at
the end), a timeout is :class:`httpcore2.ReadTimeout` / ``WriteTimeout`` /
``ConnectTimeout`` and a broken connection ``ReadError`` / ``WriteError`` /
``ConnectError``, TLS is started on the same connection, and ``is_readable`` (the pool's
check that an idle connection was not closed by the server) is true once the server
sent anything or closed it.

A small write (a request's head) is held until the next write or read, so a request's
head and its body leave in one send: one wake-up of the upstream instead of two. The
transport reads only while the stream has less than one read's worth buffered, so a
slow client still holds upstream back (as anyio's stream did).

When the installed httpcore2 does not look as expected, the pool keeps its own backend.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["asyncio_streams"]

_HOLD = 16 * 1024
"""Writes up to this size wait for the next write or read (a request's head)."""
_BUFFER = 64 * 1024
"""Reading pauses while this much has arrived and is not read yet."""


class _Protocol(asyncio.Protocol):
    """Buffers what arrives and wakes the stream's one waiting read or drain."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.buffer = bytearray()
        self.closed = False  # the server closed its side, or the connection broke
        self.error: BaseException | None = None
        self.paused_writing = False
        self.paused_reading = False
        self.waiter: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) >= _BUFFER and not self.paused_reading:
            self.paused_reading = True
            self.transport.pause_reading()
        _wake(self.waiter)

    def eof_received(self) -> bool:
        self.closed = True
        _wake(self.waiter)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc
        _wake(self.waiter)
        _wake(self.drained)

    def pause_writing(self) -> None:
        self.paused_writing = True

    def resume_writing(self) -> None:
        self.paused_writing = False
        _wake(self.drained)


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


def _expire(future: asyncio.Future[None], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)


def _classes() -> tuple[type[Any], type[Any]] | None:
    try:
        from httpcore2 import (
            ConnectError,
            ConnectTimeout,
            ReadError,
            ReadTimeout,
            WriteError,
            WriteTimeout,
        )
        from httpcore2._backends.anyio import AnyIOBackend
        from httpcore2._backends.base import AsyncNetworkStream
        from httpcore2._utils import is_socket_readable
    except ImportError:  # pragma: no cover - another httpcore2 layout
        return None

    async def _wait(future: asyncio.Future[None], seconds: float | None, error: Exception) -> None:
        """Await ``future``; ``error`` when ``seconds`` pass first (no task is cancelled
        for it: a cancel scope around the call stays the only canceller)."""
        timer = None
        if seconds is not None:
            timer = asyncio.get_running_loop().call_later(seconds, _expire, future, error)
        try:
            await future
        finally:
            if timer is not None:
                timer.cancel()

    class Stream(AsyncNetworkStream):
        def __init__(self, transport: Any, protocol: _Protocol) -> None:
            self._transport = transport
            self._protocol = protocol
            self._socket = transport.get_extra_info("socket")
            self._held: bytes | None = None

        def _flush(self) -> None:
            held, self._held = self._held, None
            if held is not None and not self._transport.is_closing():
                self._transport.write(held)

        # the timeouts of httpcore's stream interface: per read and write, not per call
        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
            self._flush()
            p = self._protocol
            if not p.buffer and not p.closed:
                p.waiter = asyncio.get_running_loop().create_future()
                try:
                    await _wait(p.waiter, timeout, ReadTimeout("timed out reading from upstream"))
                finally:
                    p.waiter = None
            if p.buffer:
                data = bytes(p.buffer[:max_bytes])
                del p.buffer[:max_bytes]
                if p.paused_reading and len(p.buffer) < _BUFFER:
                    p.paused_reading = False
                    self._transport.resume_reading()
                return data
            if p.error is not None:
                raise ReadError(str(p.error) or type(p.error).__name__)
            return b""  # the server closed the connection

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
            if not buffer:
                return
            p = self._protocol
            if p.closed or self._transport.is_closing():
                self._held = None
                raise WriteError(str(p.error) if p.error is not None else "connection closed")
            held, self._held = self._held, None
            if held is not None:
                self._transport.writelines((held, buffer))  # one send, no copy (uvloop)
            elif len(buffer) <= _HOLD:
                self._held = buffer
                return
            else:
                self._transport.write(buffer)
            if p.paused_writing:
                p.drained = asyncio.get_running_loop().create_future()
                try:
                    await _wait(p.drained, timeout, WriteTimeout("timed out writing upstream"))
                finally:
                    p.drained = None
                if p.error is not None:
                    raise WriteError(str(p.error) or type(p.error).__name__)

        async def aclose(self) -> None:
            self._held = None
            self._transport.close()

        async def start_tls(
            self,
            ssl_context: Any,
            server_hostname: str | None = None,
            timeout: float | None = None,  # noqa: ASYNC109
        ) -> Any:
            self._flush()
            loop = asyncio.get_running_loop()
            started = loop.start_tls(
                self._transport, self._protocol, ssl_context, server_hostname=server_hostname
            )
            try:
                transport = await asyncio.wait_for(started, timeout)
            except TimeoutError:
                self._transport.abort()
                raise ConnectTimeout("timed out in the TLS handshake with upstream") from None
            except OSError as exc:  # ssl.SSLError included
                self._transport.abort()
                raise ConnectError(str(exc)) from exc
            self._protocol.transport = transport  # pausing reads goes through TLS now
            return Stream(transport, self._protocol)

        def get_extra_info(self, info: str) -> Any:
            if info == "is_readable":
                p = self._protocol
                return bool(p.buffer) or p.closed or is_socket_readable(self._socket)
            if info == "socket":
                return self._socket
            if info == "ssl_object":
                return self._transport.get_extra_info("ssl_object")
            if info == "client_addr":
                return self._transport.get_extra_info("sockname")
            if info == "server_addr":
                return self._transport.get_extra_info("peername")
            return None

    class Backend(AnyIOBackend):
        async def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,  # noqa: ASYNC109
            local_address: str | None = None,
            socket_options: Any = None,
        ) -> Any:
            loop = asyncio.get_running_loop()
            local = (local_address, 0) if local_address else None
            opened = loop.create_connection(_Protocol, host, port, local_addr=local)
            try:
                transport, protocol = await asyncio.wait_for(opened, timeout)
            except TimeoutError:
                raise ConnectTimeout(f"timed out connecting to {host}:{port}") from None
            except OSError as exc:
                raise ConnectError(str(exc)) from exc
            sock = transport.get_extra_info("socket")
            for option in socket_options or ():
                sock.setsockopt(*option)
            return Stream(transport, protocol)

    return Stream, Backend


def asyncio_streams(transport: Any) -> bool:
    """Give ``transport`` (an ``httpx2.AsyncHTTPTransport`` without connections yet) the
    backend above; False (nothing changed) if its pool is not the expected one."""
    pool = getattr(transport, "_pool", None)
    found = _classes()
    if found is None or pool is None or not hasattr(pool, "_network_backend"):
        return False
    if getattr(pool, "_connections", None):
        return False  # only before the first connection
    pool._network_backend = found[1]()
    return True
