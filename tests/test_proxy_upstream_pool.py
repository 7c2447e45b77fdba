"""The upstream pool's cheaper liveness check answers as httpcore's own does."""

from __future__ import annotations

import asyncio

from ctxwarden.service.upstream import Upstream

_REPLY = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


def test_idle_connections_are_checked_through_the_kept_socket() -> None:
    async def run() -> None:
        writers: list[asyncio.StreamWriter] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            try:
                while await reader.readuntil(b"\r\n\r\n"):
                    writer.write(_REPLY)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        up = Upstream(f"http://127.0.0.1:{port}/v1", None, "openai", timeout=5, connect_timeout=5)
        try:
            for _ in range(2):  # the second request reuses the idle connection
                response = await up.open("/chat/completions", b"{}", {"content-type": "x"})
                assert await response.aread() == b"{}"
                await response.aclose()
            [connection] = up.client._transport._pool._connections  # type: ignore[attr-defined]
            stream = connection._connection._network_stream
            assert type(stream).__name__ == "Stream"  # ours, not anyio's plain stream
            assert stream.get_extra_info("socket") is not None
            assert stream.get_extra_info("is_readable") is False  # idle and open
            assert not connection.has_expired()
            writers[0].close()  # the server drops the idle connection
            await writers[0].wait_closed()
            await asyncio.sleep(0.1)  # the FIN crosses the loopback
            assert stream.get_extra_info("is_readable") is True
            assert connection.has_expired()  # so the pool will not send on it
            response = await up.open("/chat/completions", b"{}", {"content-type": "x"})
            assert await response.aread() == b"{}"  # on a new connection
            await response.aclose()
        finally:
            await up.aclose()
            for writer in writers:
                writer.close()
            server.close()
            await server.wait_closed()

    asyncio.run(run())
