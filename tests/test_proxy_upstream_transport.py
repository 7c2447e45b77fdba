"""The upstream's transport: what httpcore's pool and h11 did for the proxy, over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gzip
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ctxwarden.service.errors import ServiceError
from ctxwarden.service.forward import read_whole
from ctxwarden.service.upstream import Upstream, UpstreamFailure
from ctxwarden.service.upstream_transport import Transport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return await reader.readexactly(length)


def _reply(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


_WRITERS: list[asyncio.StreamWriter] = []
"""Every connection the test servers took (``len``: how many the client opened)."""


async def _serve(handler: Handler, **kw: object) -> tuple[asyncio.Server, int]:
    async def kept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _WRITERS.append(writer)
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(kept, "127.0.0.1", 0, **kw)  # type: ignore[arg-type]
    return server, server.sockets[0].getsockname()[1]


async def _stop(*servers: asyncio.Server) -> None:
    """Close the servers and every connection they took, before the loop ends."""
    for server in servers:
        server.close()
    for writer in _WRITERS:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    _WRITERS.clear()


def _upstream(port: int, timeout: float = 5.0) -> Upstream:
    return Upstream(f"http://127.0.0.1:{port}/v1", None, "openai", timeout=timeout,
                    connect_timeout=timeout)  # fmt: skip


@contextlib.asynccontextmanager
async def _served(handler: Handler) -> AsyncIterator[tuple[Upstream, int]]:
    """An :class:`Upstream` to a test server answering with ``handler``, and its port;
    both closed afterwards, with every connection the server took."""
    _WRITERS.clear()
    server, port = await _serve(handler)
    up = _upstream(port)
    try:
        yield up, port
    finally:
        await up.aclose()
        await _stop(server)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers each request with its body."""
    while True:
        writer.write(_reply(await _request(reader)))
        await writer.drain()


def test_bodies_cross_whole_both_ways_on_one_kept_connection() -> None:
    async def run() -> None:
        seen: list[bytes] = []

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                body = await _request(reader)
                seen.append(body)
                writer.write(_reply(body[::-1]))
                await writer.drain()

        async with _served(echo) as (up, _):
            for body in (b"{}", bytes(range(256)) * 4000, b'{"a": 1}'):  # small, 1 MB, small
                response = await up.open("/chat/completions", body, {"content-type": "x"})
                assert await read_whole(up, response) == body[::-1]
            assert seen == [b"{}", bytes(range(256)) * 4000, b'{"a": 1}']
            assert len(_WRITERS) == 1  # one connection, kept alive
            assert isinstance(up.client._transport, Transport)  # type: ignore[attr-defined]

    asyncio.run(run())


def test_a_slow_reader_gets_a_long_stream_whole() -> None:
    async def run() -> None:
        chunk = b"x" * 65_536

        async def streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await _request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (len(chunk) * 64))
            for _ in range(64):
                writer.write(chunk)
                await writer.drain()

        async with _served(streams) as (up, _):
            response = await up.open("/chat/completions", b"{}", {})
            got = 0
            async for part in response.aiter_bytes():
                got += len(part)
                await asyncio.sleep(0)  # the client reads slower than upstream writes
            await response.aclose()
            assert got == len(chunk) * 64

    asyncio.run(run())


def test_timeouts_refusals_and_cuts_are_the_proxys_504_and_502() -> None:
    async def run() -> None:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await _request(reader)
            await asyncio.sleep(2)

        async def cuts(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await _request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhalf")
            await writer.drain()

        quiet, quiet_port = await _serve(silent)
        cut, cut_port = await _serve(cuts)
        try:
            up = _upstream(quiet_port, timeout=0.2)
            with pytest.raises(UpstreamFailure) as waited:
                await up.open("/chat/completions", b"{}", {})
            assert waited.value.status == 504
            await up.aclose()
            closed = _upstream(cut_port)  # a port nobody listens on after this
            cut.close()
            await cut.wait_closed()
            with pytest.raises(UpstreamFailure) as refused:
                await closed.open("/chat/completions", b"{}", {})
            assert refused.value.status == 502
            await closed.aclose()
            cut, cut_port = await _serve(cuts)
            halfway = _upstream(cut_port)
            response = await halfway.open("/chat/completions", b"{}", {})
            with pytest.raises(ServiceError) as broken:
                await read_whole(halfway, response)
            assert broken.value.status == 502
            await halfway.aclose()
        finally:
            await _stop(quiet, cut)

    asyncio.run(run())


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_tls_is_started_on_the_connection_and_checked(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path)

    async def run() -> None:
        served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        served.load_cert_chain(cert, key)

        server, port = await _serve(_echo, ssl=served)
        _WRITERS.clear()
        trusting = Transport(ssl_context=ssl.create_default_context(cafile=str(cert)))
        doubting = Transport()  # httpx2's context: certifi does not know this certificate
        try:
            async with httpx2.AsyncClient(transport=trusting) as client:
                for body in (b"{}", b"y" * 300_000):
                    got = await client.post(f"https://localhost:{port}/v1", content=body)
                    assert got.status_code == 200 and got.content == body
                [connection] = trusting._idle[("https", "localhost", port)]
                assert connection.transport.get_extra_info("ssl_object").version().startswith("TLS")
                assert len(_WRITERS) == 1
            async with httpx2.AsyncClient(transport=doubting) as client:
                with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                    await client.post(f"https://localhost:{port}/v1", content=b"{}")
        finally:
            await _stop(server)

    asyncio.run(run())


async def _exchange(up: Upstream, body: bytes = b"{}") -> tuple[int, bytes]:
    response = await up.open("/chat/completions", body, {"content-type": "application/json"})
    return response.status_code, await read_whole(up, response)


def test_an_idle_connection_the_server_closed_is_not_reused() -> None:
    async def run() -> None:
        async with _served(_echo) as (up, _):
            assert await _exchange(up, b"a") == (200, b"a")
            assert await _exchange(up, b"b") == (200, b"b")
            assert len(_WRITERS) == 1  # the second call reused the idle connection
            _WRITERS[0].close()  # the server drops it while idle
            await _WRITERS[0].wait_closed()
            await asyncio.sleep(0.1)  # the FIN crosses the loopback
            assert await _exchange(up, b"c") == (200, b"c")  # on a new connection
            assert len(_WRITERS) == 2

    asyncio.run(run())


def test_chunked_unframed_and_compressed_bodies_arrive_decoded() -> None:
    packed = gzip.compress(b'{"zipped": true}')
    replies = [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"5\r\ndata:\r\n7\r\n [DONE]\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n%s"
        % (len(packed), packed),
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end",  # no length: ends at close
    ]

    async def run() -> None:

        async def scripted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while replies:
                await _request(reader)
                reply = replies.pop(0)
                writer.write(reply)
                await writer.drain()
                if b"connection: close" in reply:
                    break

        async with _served(scripted) as (up, port):
            assert await _exchange(up) == (200, b"data: [DONE]")
            assert await _exchange(up) == (200, b'{"zipped": true}')
            assert await _exchange(up) == (201, b"ok")
            assert await _exchange(up) == (200, b"until the end")
            assert len(_WRITERS) == 1 and replies == []
            assert not up.client._transport._idle[("http", "127.0.0.1", port)]  # type: ignore[attr-defined]

    asyncio.run(run())


def test_a_response_left_unread_or_marked_close_takes_its_connection_along() -> None:
    async def run() -> None:

        async def answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                body = await _request(reader)
                if body == b"bye":
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
                    )
                else:
                    writer.write(_reply(b"z" * 300_000))
                await writer.drain()

        async with _served(answers) as (up, _):
            response = await up.open("/chat/completions", b"{}", {})
            async for _ in response.aiter_bytes():
                break  # the client went away after the first bytes
            await response.aclose()
            assert await _exchange(up, b"bye") == (200, b"ok")  # a new connection
            assert await _exchange(up) == (200, b"z" * 300_000)  # and another: close was said
            assert len(_WRITERS) == 3

    asyncio.run(run())


def test_a_header_that_would_split_the_request_is_refused_before_sending() -> None:
    async def run() -> None:
        async with _served(_echo) as (up, _):
            with pytest.raises(UpstreamFailure) as refused:
                await up.open("/chat/completions", b"{}", {"x-key": "k\r\nx-evil: 1"})
            assert refused.value.status == 502 and not _WRITERS

    asyncio.run(run())


def test_calls_beyond_the_connection_limit_wait_for_one() -> None:
    async def run() -> None:
        release = asyncio.Event()

        async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                body = await _request(reader)
                await release.wait()
                writer.write(_reply(body))
                await writer.drain()

        server, port = await _serve(slow)
        transport = Transport(max_connections=1)
        timeout = httpx2.Timeout(5.0, pool=0.2)
        try:
            async with httpx2.AsyncClient(transport=transport, timeout=timeout) as client:
                url = f"http://127.0.0.1:{port}/v1"
                first = asyncio.create_task(client.post(url, content=b"1"))
                await asyncio.sleep(0.05)
                with pytest.raises(httpx2.PoolTimeout):
                    await client.post(url, content=b"2")
                second = asyncio.create_task(client.post(url, content=b"3"))
                await asyncio.sleep(0.05)
                release.set()
                assert (await first).content == b"1" and (await second).content == b"3"
        finally:
            await _stop(server)

    asyncio.run(run())


def test_no_cookie_an_upstream_sets_is_sent_on_a_later_call() -> None:
    """One upstream client serves every tenant: a cookie one response sets (here on
    every response, as a CDN does) is never sent back, on a POST or a GET."""
    cookies: list[bytes | None] = []

    async def setting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            fields = dict(line.lower().split(b": ", 1) for line in lines[1:] if b": " in line)
            await reader.readexactly(int(fields.get(b"content-length", b"0")))
            cookies.append(fields.get(b"cookie"))
            body = b'{"data": []}'
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"set-cookie: __cf_bm=tenant-a; Path=/; HttpOnly\r\n"
                b"set-cookie: affinity=node-3\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()

    async def run() -> None:
        async with _served(setting) as (up, _port):
            for _ in range(3):
                response = await up.open("/chat/completions", b"{}", up.headers(None, {}))
                assert "set-cookie" in response.headers
                await read_whole(up, response)
            models = await up.get("/models", up.headers(None, {}))
            assert models.status_code == 200
            await up.open("/chat/completions", b"{}", up.headers(None, {}))

    asyncio.run(run())
    assert cookies == [None] * 5


def test_sent_runs_once_the_whole_request_is_upstream_and_before_its_answer_is_read() -> None:
    """The proxy writes its build log while upstream reads the context: ``sent`` is
    awaited after the request (1 MB here, past the socket's buffer) has reached the
    server whole, and the answer, sent at once, is read only after it; what it raises
    closes the connection, which the server sees, and reaches the caller."""

    async def run() -> None:
        body = bytes(range(256)) * 4000
        received = asyncio.Event()
        closed = asyncio.Event()

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                got = await _request(reader)
                received.set()
                writer.write(_reply(b"len=%d" % len(got)))
                await writer.drain()
                if not got:
                    break
            with contextlib.suppress(Exception):
                await reader.read()  # until the client closes
            closed.set()

        async with _served(answer) as (up, _):
            order: list[str] = []

            async def sent() -> None:
                await asyncio.wait_for(received.wait(), 5)  # never set unless sent whole
                order.append("sent")
                await asyncio.sleep(0.05)  # the answer is in the socket meanwhile

            response = await up.open("/chat/completions", body, {}, sent)
            order.append("answered")
            assert await read_whole(up, response) == b"len=%d" % len(body)
            assert order == ["sent", "answered"]

            received.clear()

            async def fails() -> None:
                await asyncio.wait_for(received.wait(), 5)
                raise RuntimeError("the log could not be written")

            with pytest.raises(RuntimeError, match="could not be written"):
                await up.open("/chat/completions", b"", {}, fails)
            await asyncio.wait_for(closed.wait(), 5)  # upstream saw the connection go

    asyncio.run(run())
