"""The upstream's connections: an ``httpx2`` transport speaking HTTP/1.1 over asyncio.

The proxy sends one request upstream per call (its whole built context, hundreds of
kilobytes) and relays the answer. Through httpx2's default transport (httpcore's pool
and the ``h11`` state machine) that exchange cost ~1.6M instructions in the proxy, a
fourteenth of a whole proxied call; over a bare asyncio connection it costs ~0.06M
(callgrind, a streamed reply from a local upstream). :class:`Transport` is that bare
connection behind httpx2's documented transport interface: the client still builds the
request (its default headers, the timeouts) and the response (content decoding, the
byte streams, the errors the proxy maps to 502 and 504), and ``httptools`` (llhttp, the
parser uvicorn serves with) reads the responses.

What it does of httpcore's work, as httpcore does it: keep-alive connections per origin
(at most 512, of which 128 idle for up to 5 s; an idle one is checked before reuse, and
one the server closed or wrote to is not reused), a connection attempt retried twice
(after 0 and 0.5 s), TLS started on the connection with the context httpx2 would make
(ALPN ``http/1.1``), timeouts per connect, read, write and wait for a connection, raised
as httpx2's own exceptions. A response's body is read from the socket only while less
than ``_BUFFER`` of it waits unread, so a slow client still holds upstream back.
"""

from __future__ import annotations

import asyncio
import re
import select
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httptools
import httpx2

__all__ = ["SENT", "Transport"]

SENT = "ctxwarden.sent"
"""A request extension: a coroutine function awaited once the request is written, before
its response is waited for (the proxy writes its build log while upstream reads)."""

_BUFFER = 64 * 1024
"""Reading pauses while this much of a response has arrived and is not read yet."""
_RETRY_DELAYS = (0.0, 0.5)
"""Seconds before each retried connection attempt (httpcore's backoff)."""
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
"""What no header may hold (h11 refuses it too): a CR or LF would start another header."""

Origin = tuple[str, str, int]


class _Connection(asyncio.Protocol):
    """One connection: the response in flight, parsed as it arrives, and the waiting
    reader's wake-up."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.socket: Any = None
        self.parser: Any = None
        self.closed = False  # the server closed its side, or the connection broke
        self.error: BaseException | None = None  # the broken connection's, or the parser's
        self.stale = False  # the server wrote while no request was in flight
        self.busy = False
        self.idle_since = 0.0
        self.paused_reading = False
        self.paused_writing = False
        self.waiter: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.informational = False
        self.keep_alive = False
        self.head = False  # the response's status line and headers arrived
        self.done = False  # and its whole body
        self.body: deque[bytes] = deque()
        self.buffered = 0

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.socket = transport.get_extra_info("socket")

    def data_received(self, data: bytes) -> None:
        if not self.busy or self.done:
            self.stale = True  # nothing was asked: not an answer to the next request
            return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self.error = httpx2.RemoteProtocolError(f"malformed response from upstream: {exc}")
            self.stale = True
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if exc is not None and self.error is None:
            self.error = exc
        self._wake()
        _wake(self.drained)

    def pause_writing(self) -> None:
        self.paused_writing = True

    def resume_writing(self) -> None:
        self.paused_writing = False
        _wake(self.drained)

    # -- httptools callbacks --------------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # informational: the answer follows
            self.informational = True
            self.headers, self.reason = [], b""
            return
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()  # known here, not after the body
        self.head = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered >= _BUFFER and not self.paused_reading:
            self.paused_reading = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        self.done = True

    # -- the request ----------------------------------------------------------------------

    def _wake(self) -> None:
        _wake(self.waiter)

    async def _wait(self, seconds: float | None, error: Exception) -> None:
        """Until the protocol wakes the reader; ``error`` when ``seconds`` pass first."""
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await _within(self.waiter, seconds, error)
        finally:
            self.waiter = None

    async def send(
        self,
        head: bytes,
        body: bytes,
        timeouts: dict[str, Any],
        sent: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Write the request, await ``sent()`` when given, and wait for the response's
        head. The head and the body are written one after the other: ``writelines``
        would join them first (Python 3.11), copying the body (hundreds of KB) once more.
        ``sent`` runs once the whole request is handed to the socket, so upstream reads
        and answers meanwhile (its answer waits in the socket)."""
        if self.closed or self.transport.is_closing():
            raise httpx2.WriteError("the upstream connection is closed")
        self._reset()
        self.busy = True
        self.transport.write(head)
        self.transport.write(body)
        if self.paused_writing:
            self.drained = asyncio.get_running_loop().create_future()
            try:
                # no write timeout, or 0: wait as long as it takes
                seconds = timeouts.get("write") or None
                await _within(
                    self.drained, seconds, httpx2.WriteTimeout("timed out writing upstream")
                )
            finally:
                self.drained = None
            if self.closed and self.error is not None:
                raise httpx2.WriteError(str(self.error) or type(self.error).__name__)
        if sent is not None:
            await sent()
        while not self.head:
            self._check(complete=False)
            await self._wait(timeouts.get("read"), httpx2.ReadTimeout("timed out reading upstream"))

    def _check(self, *, complete: bool) -> None:
        """Raise what stops the response from arriving (``complete``: its head did)."""
        if isinstance(self.error, httpx2.RemoteProtocolError):
            raise self.error
        if not self.closed:
            return
        if self.error is not None:
            raise httpx2.ReadError(str(self.error) or type(self.error).__name__)
        if not complete:
            raise httpx2.RemoteProtocolError("Server disconnected without sending a response.")
        raise httpx2.RemoteProtocolError("peer closed connection without sending complete body")

    def _unframed(self) -> bool:
        """A body that ends where the connection does (no length, not chunked)."""
        names = {name.lower() for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    async def chunks(self, read_timeout: float | None) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (as one chunk what arrived together)."""
        while True:
            if self.body:
                data = self.body.popleft() if len(self.body) == 1 else b"".join(self.body)
                self.body.clear()
                self.buffered = 0
                if self.paused_reading:
                    self.paused_reading = False
                    self.transport.resume_reading()
                yield data
                continue
            if self.done:
                return
            if self.closed and self.error is None and self._unframed():
                self.done = True
                return
            self._check(complete=True)
            await self._wait(read_timeout, httpx2.ReadTimeout("timed out reading upstream"))

    def reusable(self, expiry: float) -> bool:
        """Whether an idle connection may take the next request: open, silent, not idle
        for longer than ``expiry``, and nothing to read on its socket (a close or data
        the loop has not delivered yet), as httpcore checks it."""
        if self.closed or self.stale or time.monotonic() - self.idle_since > expiry:
            return False
        return not _readable(self.socket)

    def close(self) -> None:
        self.busy = False
        if self.transport is not None:
            self.transport.close()


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


def _expire(future: asyncio.Future[None], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)


async def _within(future: asyncio.Future[None], seconds: float | None, error: Exception) -> None:
    """Await ``future``; ``error`` when ``seconds`` (None: no limit) pass first. No task
    is cancelled for it: the caller's cancellation stays the only one."""
    timer = None
    if seconds is not None:
        timer = asyncio.get_running_loop().call_later(seconds, _expire, future, error)
    try:
        await future
    finally:
        if timer is not None:
            timer.cancel()


def _readable(sock: Any) -> bool:
    """Whether ``sock`` has something to read, or is gone (httpcore's check)."""
    if sock is None or sock.fileno() < 0:
        return True
    if not hasattr(select, "poll"):  # pragma: no cover - Windows
        return bool(select.select([sock], [], [], 0)[0])
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(0))


class _Body(httpx2.AsyncByteStream):
    """A response's body; the connection goes back to the pool once it is read whole."""

    def __init__(
        self, conn: _Connection, read_timeout: float | None, release: Callable[[bool], None]
    ) -> None:
        self._conn, self._timeout, self._release = conn, read_timeout, release
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._conn.chunks(self._timeout):
            yield chunk
        self._done(reusable=True)

    async def aclose(self) -> None:
        self._done(reusable=False)  # not read whole: the connection is not reused

    def _done(self, *, reusable: bool) -> None:
        if not self._released:
            self._released = True
            self._release(reusable)


class Transport(httpx2.AsyncBaseTransport):
    """HTTP/1.1 connections for an ``httpx2.AsyncClient`` (see the module docstring);
    ``ssl_context`` defaults to the one httpx2 makes (certifi, or ``SSL_CERT_FILE``)."""

    def __init__(
        self,
        *,
        retries: int = 2,
        max_connections: int = 512,
        max_keepalive: int = 128,
        keepalive_expiry: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._retries = retries
        self._max_connections = max_connections
        self._max_keepalive = max_keepalive
        self._expiry = keepalive_expiry
        # made now, as httpx2's own transport makes it: a bad SSL_CERT_FILE fails the start
        self._ssl = ssl_context if ssl_context is not None else httpx2.create_ssl_context()
        self._ssl.set_alpn_protocols(["http/1.1"])
        self._idle: dict[Origin, list[_Connection]] = {}
        self._slots: asyncio.Semaphore | None = None
        self._closed = False

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timeouts: dict[str, Any] = request.extensions.get("timeout") or {}
        url = request.url
        scheme = url.scheme
        origin = (scheme, url.host, url.port or (443 if scheme == "https" else 80))
        head = _head(request)
        try:
            body = request.content
        except httpx2.RequestNotRead:
            body = b"".join([part async for part in request.stream])  # type: ignore[union-attr]
        slots = self._slots
        if slots is None:
            slots = self._slots = asyncio.Semaphore(self._max_connections)
        if slots.locked():
            try:
                await asyncio.wait_for(slots.acquire(), timeouts.get("pool"))
            except TimeoutError:
                raise httpx2.PoolTimeout("timed out waiting for an upstream connection") from None
        else:
            await slots.acquire()
        conn: _Connection | None = None
        try:
            conn = self._idle_connection(origin) or await self._connect(origin, timeouts)
            await conn.send(head, body, timeouts, request.extensions.get(SENT))
        except BaseException:
            if conn is not None:
                conn.close()
            slots.release()
            raise

        answered = conn

        def release(reusable: bool) -> None:
            slots.release()
            self._put_back(origin, answered, reusable)

        return httpx2.Response(
            answered.status,
            headers=answered.headers,
            stream=_Body(answered, timeouts.get("read"), release),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": answered.reason},
        )

    def _idle_connection(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.reusable(self._expiry):
                return conn
            conn.close()
        return None

    def _put_back(self, origin: Origin, conn: _Connection, reusable: bool) -> None:
        conn.busy = False
        idle = self._idle.setdefault(origin, [])
        if (
            reusable
            and not self._closed
            and not conn.closed
            and not conn.stale
            and conn.done
            and conn.keep_alive
            and len(idle) < self._max_keepalive
        ):
            conn.idle_since = time.monotonic()
            idle.append(conn)
        else:
            conn.close()

    async def _connect(self, origin: Origin, timeouts: dict[str, Any]) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        seconds = timeouts.get("connect")
        for attempt in range(self._retries + 1):
            try:
                opened = loop.create_connection(_Connection, host, port)
                transport, conn = await asyncio.wait_for(opened, seconds)
                break
            except (TimeoutError, OSError) as exc:
                if attempt >= self._retries:
                    if isinstance(exc, TimeoutError):
                        raise httpx2.ConnectTimeout(
                            f"timed out connecting to {host}:{port}"
                        ) from None
                    raise httpx2.ConnectError(str(exc)) from exc
                await asyncio.sleep(_RETRY_DELAYS[min(attempt, len(_RETRY_DELAYS) - 1)])
        if scheme == "https":
            started = loop.start_tls(transport, conn, self._ssl, server_hostname=host)
            try:
                tls = await asyncio.wait_for(started, seconds)
            except TimeoutError:
                transport.abort()
                raise httpx2.ConnectTimeout(
                    "timed out in the TLS handshake with upstream"
                ) from None
            except OSError as exc:  # ssl.SSLError included
                transport.abort()
                raise httpx2.ConnectError(str(exc)) from exc
            conn.transport = tls  # pausing reads goes through TLS now
        return conn

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _head(request: httpx2.Request) -> bytes:
    """The request line and headers as httpx2 made them (Host, Content-Length included)."""
    lines = [b"%s %s HTTP/1.1" % (request.method.encode("ascii"), request.url.raw_path)]
    for name, value in request.headers.raw:
        if _CONTROL.search(name) or _CONTROL.search(value) or b":" in name:
            raise httpx2.LocalProtocolError(f"illegal header {name!r}")
        lines.append(b"%s: %s" % (name, value))
    lines.append(b"\r\n")
    return b"\r\n".join(lines)
