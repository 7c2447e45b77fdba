"""What the bench runs beside ctxwarden on this machine: a JSON upstream on a loopback
port, in a thread of this process; ``ctxwarden serve`` in a process of its own
(:func:`serving`, :func:`start_serve`); and the way to stop a process it started.

Each bench upstream (the scripted chat model of :mod:`~ctxwarden_bench.served_path`,
the Responses model of :mod:`~ctxwarden_bench.responses_replay`, the agent and
summariser of :mod:`~ctxwarden_bench.scale_upstream`) differs only in what it answers:
it subclasses :class:`LocalJSONServer` and says so in :meth:`~LocalJSONServer.answer`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

__all__ = [
    "CLI",
    "LocalJSONServer",
    "free_port",
    "serving",
    "start_serve",
    "stop_process",
    "wait_healthy",
]

#: The ``ctxwarden`` command of the interpreter running the bench (and of the ``src``
#: first on its path): ``[*CLI, "serve", ...]``.
CLI = (sys.executable, "-c", "from ctxwarden.cli.main import main; main()")


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


def wait_healthy(url: str, proc: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    """Return once ``url`` (a server's ``/healthz``) answers; ``SystemExit`` when ``proc``
    exits first or it does not answer within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"ctxwarden serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{url} did not answer in {timeout:.0f} s")


def start_serve(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    quiet: bool = False,
    timeout: float = 30.0,
    wrapper: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], str]:
    """``ctxwarden serve ARGS`` in a process of its own on a free loopback port, once it
    answers: the process and its base URL (``http://127.0.0.1:PORT``). ``quiet`` sends its
    output to nowhere; ``wrapper`` is a command that runs it (``valgrind ...``); a server
    that exits or does not answer is stopped, and the error raised (the caller stops it
    otherwise: :func:`stop_process`)."""
    port = free_port()
    proc = subprocess.Popen(
        [*wrapper, *CLI, "serve", *args, "--port", str(port)],
        env=None if env is None else dict(env),
        stdout=subprocess.DEVNULL if quiet else None,
        stderr=subprocess.DEVNULL if quiet else None,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base + "/healthz", proc, timeout)
    except BaseException:
        stop_process(proc)
        raise
    return proc, base


@contextmanager
def serving(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    quiet: bool = False,
    timeout: float = 30.0,
    wrapper: Sequence[str] = (),
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """:func:`start_serve` for the ``with`` block: the process and its base URL, stopped
    on the way out."""
    proc, base = start_serve(args, env=env, quiet=quiet, timeout=timeout, wrapper=wrapper)
    try:
        yield proc, base
    finally:
        stop_process(proc)
