"""``ProxyStream`` relays to the end, stops relaying when the client leaves before it, and
always closes its relay once, saying whether the client got everything."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

from ctxwarden.service.forward import ProxyStream


class _Relay:
    """What ``ProxyStream`` needs of a relay: chunks, and a close that is told whether
    the client got them all. ``hold`` makes the stream wait after its first chunk."""

    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.closed: list[bool] = []
        self.cancelled = False

    async def chunks(self) -> AsyncIterator[bytes]:
        yield b"data: one\n\n"
        if self.hold:
            try:
                await asyncio.Event().wait()  # upstream never sends more
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        yield b"data: [DONE]\n\n"

    async def close(self, delivered: bool) -> None:
        self.closed.append(delivered)


class _Client:
    """An ASGI client side: records what is sent; ``receive`` answers ``http.disconnect``
    once the response is complete (as the ASGI spec says), or when ``leave`` is set."""

    def __init__(self, broken: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.leave = asyncio.Event()
        self.done = asyncio.Event()
        self.broken = broken

    async def receive(self) -> dict[str, Any]:
        if self.broken:
            raise RuntimeError("the server could not read the connection")
        left = asyncio.ensure_future(self.leave.wait())
        ended = asyncio.ensure_future(self.done.wait())
        await asyncio.wait({left, ended}, return_when=asyncio.FIRST_COMPLETED)
        left.cancel()
        ended.cancel()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        await asyncio.sleep(0)  # a write lets the loop run, as a socket's does
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.done.set()


def _stream(relay: _Relay) -> ProxyStream:
    return ProxyStream(relay, {}, "text/event-stream")  # type: ignore[arg-type]


def _run(relay: _Relay, client: _Client, leave_after: float | None = None) -> list[Any]:
    """Serve the stream to ``client``; the loop's unhandled errors are returned."""
    errors: list[Any] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        serving = asyncio.ensure_future(
            _stream(relay)({"type": "http"}, client.receive, client.send)
        )
        if leave_after is not None:
            await asyncio.sleep(leave_after)
            client.leave.set()
        await asyncio.wait_for(serving, 5)
        await asyncio.sleep(0.01)  # the watcher's last turn
        gc.collect()

    asyncio.run(main())
    return errors


def test_a_stream_relayed_to_the_end_closes_delivered() -> None:
    relay, client = _Relay(), _Client()
    assert _run(relay, client) == []
    bodies = [m.get("body") for m in client.sent if m["type"] == "http.response.body"]
    assert bodies == [b"data: one\n\n", b"data: [DONE]\n\n", b""]
    assert relay.closed == [True]


def test_a_client_leaving_mid_stream_stops_the_relay_and_closes_undelivered() -> None:
    relay, client = _Relay(hold=True), _Client()
    assert _run(relay, client, leave_after=0.05) == []
    assert relay.cancelled
    assert relay.closed == [False]
    assert not any(m.get("more_body") is False for m in client.sent)


def test_a_failing_receive_neither_stops_the_relay_nor_goes_unhandled() -> None:
    relay, client = _Relay(), _Client(broken=True)
    assert _run(relay, client) == []
    assert relay.closed == [True]
