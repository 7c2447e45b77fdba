"""Limits on a request's head, held before the app sees it: size, count, read time.

uvicorn's httptools protocol reads a request head of any size (the parser buffers a
header value until it ends: a 64 MB header is 64 MB resident) and waits for it as long
as the client likes (its keep-alive timer runs only between requests), so one client can
hold memory and connections at will. :class:`LimitedHttpTools` is that protocol with
three limits (:class:`HeadLimits`, set by ``ctxwarden serve``):

- the head (request line and headers) above ``max_bytes`` is answered 431, counted as the
  bytes arrive, before the parser buffers more;
- more than ``max_count`` headers: 431;
- a head not complete ``timeout`` seconds after its first byte (or after the connection
  opened): 408.

The answer goes out at once and the connection stays open: the rest of the refused request
(its head up to the blank line, then its ``Content-Length`` of body) is read and thrown
away by :class:`RestOfRequest`, which keeps a few bytes of it, never the whole, and the
next request on the connection is served as usual. The rest must keep arriving (at most
``timeout`` between reads, at most :data:`MAX_READ_PAST` bytes); a refused request whose
length cannot be known (a chunked body) or that is
pipelined behind a running one ends the connection instead. The answers are JSON in the
route's shape, like every other error of the service.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ctxwarden.service.errors import ServiceError, error_body

__all__ = ["HeadLimits", "LimitedHttpTools", "RestOfRequest", "protocol"]


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
        self._refused = False  # the connection is ending
        self._skipping: RestOfRequest | None = None  # reading past a refused request
        self._skipped = 0  # bytes read past since the last refusal
        self._skip_parsed = False  # the parser reads past a refused request's body
        self._head_tail = b""  # the head's last bytes, for a blank line split across reads
        self._content_length: int | None = None
        self._answered = False  # something was answered on this connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._skipping is not None:
            self._skip(data)
            return
        if self._in_head:
            end = data.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end + 4
            if self._head_bytes > self.limits.max_bytes:
                limit = f"request headers are over {self.limits.max_bytes:,} bytes"
                if self._answer_and_skip(431, limit):
                    self._skip(data)
                return
            if self._head_timer is None:
                self._start_head_timer()
            self._head_tail = data[-3:]
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
        self._content_length = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if name.lower() == b"content-length":
            self._content_length = _length(value)
        if self._header_count <= self.limits.max_count:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        self._in_head = False
        if self._header_count > self.limits.max_count:
            many = f"a request may send at most {self.limits.max_count} headers"
            if not self._answer_and_skip(431, many, parsed=True):
                raise _Refused  # stops the parser: this request is not served
            return  # the parser reads past its body; no app sees it
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._skip_parsed:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._skip_parsed:
            self._skip_parsed = False
            self._start_head_timer()  # an idle connection after the refusal still ends
        else:
            super().on_message_complete()
        self._in_head, self._head_bytes, self._head_tail = True, 0, b""

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
        if self._skipping is not None:
            self._refuse_quietly()  # the rest of a refused request did not come in time
            return
        if self._head_bytes == 0 and (self.cycle is not None or self._answered):
            self.transport.close()  # idle after an answer: the keep-alive timer's case
            return
        slow = f"request headers not sent within {self.limits.timeout:g} s"
        if self._answer_and_skip(408, slow):
            self._skip(b"")

    def _answer_and_skip(self, status: int, message: str, *, parsed: bool = False) -> bool:
        """Answer ``status`` at once and read past the rest of the request, keeping the
        connection; or, where that cannot be done safely, answer and close (False)."""
        busy = self.cycle is not None and not self.cycle.response_complete
        if busy or (not parsed and self._chunked()):
            self._refuse(status, message)
            return False
        self._write_error(status, message, close=False)
        self._answered = True
        if parsed:
            self._skip_parsed = True  # (the parser knows the body's length)
        else:
            self._skipping = RestOfRequest(self._content_length, self._head_tail)
            self._skipped = 0
            self._start_head_timer()  # the rest must come within another timeout
        return True

    def _chunked(self) -> bool:
        return any(
            name == b"transfer-encoding" and b"chunked" in value.lower()
            for name, value in getattr(self, "headers", None) or ()
        )

    def _skip(self, data: bytes) -> None:
        assert self._skipping is not None
        self._skipped += len(data)
        if self._skipped > MAX_READ_PAST:
            self._refuse_quietly()  # answered already; reading on would be a free stream
            return
        rest = self._skipping.feed(data)
        if rest is None:
            if data:
                self._start_head_timer()  # the rest keeps coming: the timeout is between reads
            return
        if self._skipping.chunked:
            self._refuse_quietly()
            return
        self._skipping = None
        self._stop_head_timer()
        self.parser = httptools.HttpRequestParser(self)
        self._in_head, self._head_bytes, self._head_tail = True, 0, b""
        self._start_head_timer()
        if rest:
            self.data_received(rest)

    def _refuse_quietly(self) -> None:
        """Close a connection whose refusal was already answered."""
        self._refused = True
        self._stop_head_timer()
        self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` as JSON and close the connection."""
        self._refused = True
        self._stop_head_timer()
        if not self.transport.is_closing():
            self._write_error(status, message, close=True)
            self.transport.close()

    def _write_error(self, status: int, message: str, *, close: bool) -> None:
        url = getattr(self, "url", b"") or b""
        api = "anthropic" if url.startswith(b"/v1/messages") else "openai"
        body = error_body(ServiceError(status, message, code="request_head_refused"), api)
        head = [
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n" if close else b"\r\n",
        ]
        if not self.transport.is_closing():
            self.transport.write(b"".join(head) + body)


MAX_READ_PAST = 256 * 1024 * 1024
"""Bytes of a refused request read past at most (its head's rest and its body); more ends
the connection."""


class RestOfRequest:
    """Reads past the rest of a refused request without keeping it: its head up to the
    blank line (noting a ``Content-Length`` or chunked ``Transfer-Encoding`` line on the
    way, from each line's first bytes only), then that many bytes of body.

    :meth:`feed` returns None while more is needed, then the bytes that follow the request
    (the next request's, possibly empty). ``chunked`` says the body's end cannot be known
    this way; the caller closes the connection.
    """

    _LINE_KEPT = 256  # bytes of a header line looked at; a longer value is read past

    def __init__(self, content_length: int | None, seen: bytes = b"") -> None:
        self.content_length = content_length
        self.chunked = False
        self._tail = seen[-3:]  # a blank line may start in bytes already read
        self._line = bytearray()
        self._in_head = True
        self._body_left = 0

    def feed(self, data: bytes) -> bytes | None:
        if self._in_head:
            joined = self._tail + data
            end = joined.find(b"\r\n\r\n")
            if end < 0:
                self._lines(data)
                self._tail = joined[-3:]
                return None
            after = end + 4 - len(self._tail)  # where the head ends in ``data``
            self._lines(data[: max(after - 2, 0)])
            self._in_head = False
            self._body_left = self.content_length or 0
            data = data[after:]
            if self.chunked:
                return b""
        taken = min(len(data), self._body_left)
        self._body_left -= taken
        return data[taken:] if self._body_left == 0 else None

    def _lines(self, data: bytes) -> None:
        *ended, current = data.split(b"\n")
        for piece in ended:
            self._header_line(bytes(self._line) + piece[: self._LINE_KEPT])
            self._line.clear()
        room = self._LINE_KEPT - len(self._line)
        if room > 0:
            self._line += current[:room]

    def _header_line(self, line: bytes) -> None:
        name, colon, value = line.partition(b":")
        if not colon:
            return
        name = name.strip().lower()
        if name == b"content-length":
            self.content_length = _length(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            self.chunked = True


def _length(value: bytes) -> int | None:
    text = value.strip()
    return int(text) if text.isdigit() and len(text) < 19 else None


class _Refused(Exception):
    """Raised from a parser callback to stop reading a refused request."""


def protocol(limits: HeadLimits) -> type[LimitedHttpTools]:
    """The protocol class with ``limits`` (uvicorn's ``http=`` takes a class)."""
    return type("LimitedHttpTools", (LimitedHttpTools,), {"limits": limits})
