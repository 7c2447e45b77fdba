"""The upstream pool's asyncio streams: what httpcore's anyio streams did, over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
from collections.abc import Awaitable, Callable
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
from ctxwarden.service.upstream_pool import asyncio_streams

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


def test_bodies_cross_whole_both_ways_on_one_kept_connection() -> None:
    async def run() -> None:
        seen: list[bytes] = []

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                body = await _request(reader)
                seen.append(body)
                writer.write(_reply(body[::-1]))
                await writer.drain()

        server, port = await _serve(echo)
        up = _upstream(port)
        try:
            for body in (b"{}", bytes(range(256)) * 4000, b'{"a": 1}'):  # small, 1 MB, small
                response = await up.open("/chat/completions", body, {"content-type": "x"})
                assert await read_whole(up, response) == body[::-1]
            assert seen == [b"{}", bytes(range(256)) * 4000, b'{"a": 1}']
            [connection] = up.client._transport._pool._connections  # type: ignore[attr-defined]
            assert type(connection._connection._network_stream).__name__ == "Stream"
        finally:
            await up.aclose()
            await _stop(server)

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

        server, port = await _serve(streams)
        up = _upstream(port)
        try:
            response = await up.open("/chat/completions", b"{}", {})
            got = 0
            async for part in response.aiter_bytes():
                got += len(part)
                await asyncio.sleep(0)  # the client reads slower than upstream writes
            await response.aclose()
            assert got == len(chunk) * 64
        finally:
            await up.aclose()
            await _stop(server)

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

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                writer.write(_reply(await _request(reader)))
                await writer.drain()

        server, port = await _serve(echo, ssl=served)
        trusting = httpx2.AsyncHTTPTransport(verify=ssl.create_default_context(cafile=str(cert)))
        doubting = httpx2.AsyncHTTPTransport()
        assert asyncio_streams(trusting) and asyncio_streams(doubting)
        try:
            async with httpx2.AsyncClient(transport=trusting) as client:
                for body in (b"{}", b"y" * 300_000):
                    got = await client.post(f"https://localhost:{port}/v1", content=body)
                    assert got.status_code == 200 and got.content == body
                [connection] = trusting._pool._connections  # type: ignore[attr-defined]
                stream = connection._connection._network_stream
                assert stream.get_extra_info("ssl_object").version().startswith("TLS")
            async with httpx2.AsyncClient(transport=doubting) as client:
                with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                    await client.post(f"https://localhost:{port}/v1", content=b"{}")
        finally:
            await _stop(server)

    asyncio.run(run())
