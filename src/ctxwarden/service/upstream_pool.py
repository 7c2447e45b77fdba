"""The upstream client's connections, with a liveness check that costs one syscall.

On every request it assigns, httpcore's pool asks each idle connection whether the
server closed it (its socket is readable), and the anyio stream answers through
``extra()``, which builds a mapping of all its attributes every time: with 64 agents
streaming through the proxy that was most of a millisecond of CPU per request. The
stream here keeps its raw socket from the connect (and the TLS handshake) and answers
``is_readable`` and ``socket`` from it — the same answers, with the same
:func:`httpcore2._utils.is_socket_readable`. Every other question goes to anyio as before.
When the installed httpcore2 does not look as expected, the pool keeps its own backend.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fast_liveness"]


def _classes() -> tuple[type[Any], type[Any]] | None:
    try:
        import anyio.abc
        from httpcore2._backends.anyio import AnyIOBackend, AnyIOStream
        from httpcore2._utils import is_socket_readable
    except ImportError:  # pragma: no cover - another httpcore2 layout
        return None

    class Stream(AnyIOStream):
        def __init__(self, stream: Any) -> None:
            super().__init__(stream)
            self._socket = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)

        def get_extra_info(self, info: str) -> Any:
            if info == "is_readable":
                return is_socket_readable(self._socket)
            if info == "socket":
                return self._socket
            return super().get_extra_info(info)

        async def start_tls(self, *args: Any, **kw: Any) -> Any:
            return _wrap(await super().start_tls(*args, **kw))

    def _wrap(stream: Any) -> Any:
        inner = getattr(stream, "_stream", None)
        return Stream(inner) if type(stream) is AnyIOStream and inner is not None else stream

    class Backend(AnyIOBackend):
        async def connect_tcp(self, *args: Any, **kw: Any) -> Any:
            return _wrap(await super().connect_tcp(*args, **kw))

    return Stream, Backend


def fast_liveness(transport: Any) -> bool:
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
