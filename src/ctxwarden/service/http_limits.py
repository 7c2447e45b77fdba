"""Limits on a request's head, held before the app sees it: size, count, read time.

uvicorn's httptools protocol reads a request head of any size (the parser buffers a
header value until it ends: a 64 MB header is 64 MB resident) and waits for it as long
as the client likes (its keep-alive timer runs only between requests), so one client can
hold memory and connections at will. :class:`LimitedHttpTools` is that protocol with
three limits (:class:`HeadLimits`, set by ``ctxwarden serve``):

- the head (request line and headers) above ``max_bytes`` is answered 431 and the
  connection closed, counted as the bytes arrive, before the parser buffers more;
- more than ``max_count`` headers: 431, the connection closed;
- a head not complete ``timeout`` seconds after its first byte (or after the connection
  opened): 408, the connection closed.

The connection ends because the rest of such a head cannot be told from the next
request; every refusal past the head (a body too large, invalid text) keeps it. The
answers are JSON in the route's shape, like every other error of the service.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ctxwarden.service.errors import ServiceError, error_body

__all__ = ["HeadLimits", "LimitedHttpTools", "protocol"]


@dataclass(frozen=True)
class HeadLimits:
    """``max_bytes`` of request line and headers, ``max_count`` headers, ``timeout``
    seconds to send them (nginx: 8 KB lines, 32 KB in all, 60 s; ours leave room for
    large cookies and many SDK headers)."""

    max_bytes: int = 64 * 1024
    max_count: int = 128
    timeout: float = 15.0


class LimitedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`HeadLimits` (see the module)."""

    limits = HeadLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the next bytes belong to a request head
        self._head_bytes = 0
        self._header_count = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            end = data.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end + 4
            if self._head_bytes > self.limits.max_bytes:
                self._refuse(431, f"request headers are over {self.limits.max_bytes:,} bytes")
                return
            if self._head_timer is None:
                self._start_head_timer()
        self._unset_keepalive_if_required()  # (uvicorn's data_received from here on)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            if not self._refused:  # (not one of ours: a request the parser cannot read)
                self._refuse(400, "invalid HTTP request")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_count = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count <= self.limits.max_count:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        self._in_head = False
        if self._header_count > self.limits.max_count:
            self._refuse(431, f"a request may send at most {self.limits.max_count} headers")
            raise _Refused  # stops the parser: this request is not served
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0

    def _start_head_timer(self) -> None:
        self._stop_head_timer()
        self._head_timer = self.loop.call_later(self.limits.timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if self._head_bytes == 0 and self.cycle is not None:
            self.transport.close()  # idle after an answer: the keep-alive timer's case
            return
        self._refuse(408, f"request headers not sent within {self.limits.timeout:g} s")

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` as JSON and close the connection."""
        self._refused = True
        self._stop_head_timer()
        url = getattr(self, "url", b"") or b""
        api = "anthropic" if url.startswith(b"/v1/messages") else "openai"
        body = error_body(ServiceError(status, message, code="request_head_refused"), api)
        head = [
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        if not self.transport.is_closing():
            self.transport.write(b"".join(head) + body)
            self.transport.close()


class _Refused(Exception):
    """Raised from a parser callback to stop reading a refused request."""


def protocol(limits: HeadLimits) -> type[LimitedHttpTools]:
    """The protocol class with ``limits`` (uvicorn's ``http=`` takes a class)."""
    return type("LimitedHttpTools", (LimitedHttpTools,), {"limits": limits})
