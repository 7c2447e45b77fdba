"""The background ``ctxwarden serve`` that ``wrap`` starts, and finds again on later runs.

One server per configuration (store, upstream URLs, upstream keys, policy, and the port
when one is asked for: a client configured by file, such as Codex, needs a fixed one): its state
file, ``serve-<id>.json`` in the data dir, holds its pid, port and store, never a key.
The id is an HMAC of the configuration under the local tenant's key, so a change of
upstream key starts a new server (the running one holds the old key in its
environment) while the file name tells nothing about the key. A state file is reused
only when its process is alive and answers ``/readyz``; a stale one is replaced. The
server runs in its own session (a terminal's Ctrl-C stops the agent, not the proxy) with
its output in ``serve-<id>.log``, until ``ctxwarden wrap --stop``.

Upstream keys reach the server through its environment only
(``CTXWARDEN_UPSTREAM_API_KEY``, ``CTXWARDEN_ANTHROPIC_API_KEY``,
``CTXWARDEN_GEMINI_API_KEY``), as ``serve`` reads them.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ctxwarden.core.errors import RuntimeFailure
from ctxwarden.local.home import Home

__all__ = ["Running", "ServeConfig", "ensure_server", "server_urls", "stop_servers"]

READY_TIMEOUT = 90.0
"""Seconds a new server may take to answer ``/readyz`` (imports and migrations on a busy
machine take a few)."""


@dataclass(frozen=True)
class ServeConfig:
    """What a background server is started with. The keys are only passed to the
    server's environment; ``None`` leaves that route without an upstream key."""

    db: str
    upstream: str
    anthropic_upstream: str
    openai_key: str | None = None
    anthropic_key: str | None = None
    policy: str | None = None  # a policy file's path
    port: int | None = None  # None: a free one
    policy_sha256: str | None = None  # its content: an edited policy starts a new server
    gemini_upstream: str | None = None
    gemini_key: str | None = None

    def config_id(self, secret: str) -> str:
        """16 hex digits naming this configuration (keys included, not recoverable)."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()[:16]

    def args(self, port: int) -> list[str]:
        args = ["serve", "--db", self.db, "--host", "127.0.0.1", "--port", str(port)]
        args += ["--upstream", self.upstream, "--anthropic-upstream", self.anthropic_upstream]
        if self.gemini_upstream:
            args += ["--gemini-upstream", self.gemini_upstream]
        return [*args, "--policy", self.policy] if self.policy else args

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name, value in (
            ("CTXWARDEN_UPSTREAM_API_KEY", self.openai_key),
            ("CTXWARDEN_ANTHROPIC_API_KEY", self.anthropic_key),
            ("CTXWARDEN_GEMINI_API_KEY", self.gemini_key),
        ):
            if value:
                env[name] = value
            else:
                env.pop(name, None)
        return env


@dataclass(frozen=True)
class Running:
    """A background server: ``reused`` when an earlier run started it."""

    pid: int
    port: int
    db: str
    started_at: float
    reused: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def ensure_server(home: Home, config: ServeConfig, secret: str) -> Running:
    """The running server for ``config`` (started by an earlier run and alive), or a new
    one. Runs under a lock on the data dir, so two runs at once share one server."""
    config_id = config.config_id(secret)
    state = home.state_file(config_id)
    with _locked(home.lock_file):
        found = _read_state(state)
        if found is not None and _alive(found):
            return Running(found.pid, found.port, found.db, found.started_at, reused=True)
        running = _start(config, home.log_file(config_id))
        _write_state(state, running)
        return running


def stop_servers(home: Home) -> list[Running]:
    """Stop every background server started from this data dir; the ones stopped."""
    stopped = []
    with _locked(home.lock_file):
        for path in home.state_files():
            found = _read_state(path)
            if found is not None and _ours(found):
                _terminate(found.pid)
                stopped.append(found)
            path.unlink(missing_ok=True)
    return stopped


# -- starting and checking -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(config: ServeConfig, log: Path) -> Running:
    port = config.port or _free_port()
    command = [sys.executable, "-m", "ctxwarden", *config.args(port)]
    with log.open("ab") as out:
        out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=config.env(),
            start_new_session=True,  # not stopped by the terminal's Ctrl-C with the agent
        )
    running = Running(proc.pid, port, config.db, time.time())
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeFailure(
                f"ctxwarden serve exited with code {proc.returncode} before it was ready; "
                f"its output is in {log}:\n{_tail(log)}"
            )
        if _ready(running.url):
            return running
        time.sleep(0.1)
    _terminate(proc.pid)
    raise RuntimeFailure(f"ctxwarden serve did not answer in {READY_TIMEOUT:g} s; see {log}")


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2) as answer:
            return int(answer.status) == 200
    except (OSError, urllib.error.URLError):
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now holds the pid
        return False
    return True


def _alive(running: Running) -> bool:
    return _pid_alive(running.pid) and _ready(running.url)


def _ours(running: Running) -> bool:
    """The state's pid is still the server it names, not a process that got the number
    since: its command line says ``serve --port N`` (where ``/proc`` shows it), else it
    answers on that port."""
    if not _pid_alive(running.pid):
        return False
    try:
        args = Path(f"/proc/{running.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return _ready(running.url)
    return b"serve" in args and str(running.port).encode() in args


def _terminate(pid: int, wait: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):  # reap it when it is our child
            os.waitpid(pid, os.WNOHANG)
        if not _pid_alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _tail(log: Path, lines: int = 20) -> str:
    text = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:])


# -- the state file --------------------------------------------------------------------------


def _read_state(path: Path) -> Running | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Running(int(data["pid"]), int(data["port"]), str(data["db"]),
                       float(data["started_at"]))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_state(path: Path, running: Running) -> None:
    data = {"pid": running.pid, "port": running.port, "db": running.db,
            "started_at": running.started_at}  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (where the platform has ``fcntl``)."""
    with path.open("a") as f:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no lock, a race starts two servers
            yield
            return
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def server_urls(home: Home) -> tuple[str, ...]:
    """The URLs of this data dir's servers (running or not): an upstream URL among them
    would make the proxy forward to itself."""
    found = (_read_state(path) for path in home.state_files())
    return tuple(r.url for r in found if r is not None)
