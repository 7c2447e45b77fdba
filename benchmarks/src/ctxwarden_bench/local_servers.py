"""What the bench runs beside ctxwarden on this machine: a JSON upstream on a loopback
port, in a thread of this process, and the way to stop a process it started.

Each bench upstream (the scripted chat model of :mod:`~ctxwarden_bench.served_path`,
the Responses model of :mod:`~ctxwarden_bench.responses_replay`, the agent and
summariser of :mod:`~ctxwarden_bench.scale_upstream`) differs only in what it answers:
it subclasses :class:`LocalJSONServer` and says so in :meth:`~LocalJSONServer.answer`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

__all__ = ["LocalJSONServer", "free_port", "stop_process"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default 5 drops connections under a load test


class LocalJSONServer:
    """A threaded HTTP server on a free loopback port that answers every POST with
    :meth:`answer` of its body, as JSON. ``url`` is the server's base URL followed by
    :attr:`prefix` (``"/v1"`` for a client that appends only the route). Use it as a
    context manager, or :meth:`start` and :meth:`stop` it."""

    prefix = ""

    def __init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the proxy reuses its connections
            # the head and the body go out in two writes: without TCP_NODELAY the body
            # waited for the client's delayed ACK, ~40 ms a call on loopback
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                status, data = server.answer(body)
                payload = json.dumps(data).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the caller went away (a worker killed mid-call)
                    self.close_connection = True

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def answer(self, body: bytes) -> tuple[int, Any]:
        """The status and the JSON reply to a request ``body`` (called on the request's
        own thread: guard shared state)."""
        raise NotImplementedError

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}{self.prefix}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


def stop_process(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """Stop ``proc`` if it still runs: SIGTERM, then SIGKILL when it has not exited
    within ``timeout`` seconds (a server stuck in a call must not hang the bench)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def free_port() -> int:
    """A TCP port free on the loopback interface now (for a process to listen on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
