"""LoCoMo questions through ``ctxwarden serve`` and a ``ctxwarden worker``: the service's path.

:class:`ServedPath` starts, as processes of their own, ``ctxwarden serve --broker URL
--summarizer offline`` and ``ctxwarden worker --summarizer offline`` on one store and one
job queue of their own (on the broker given), plus a scripted upstream in this process
(:class:`ScriptedUpstream`). Its :meth:`~ServedPath.path` asks one question as a client of
the proxy would, and returns the context the upstream received: the first call finds the
summary due and enqueues it (the upstream refuses that call, so no reply is stored and the
session's history stays the question's); once the worker has folded, the same call again
is answered, and its body is the context. :func:`~ctxwarden_bench.session_path.locomo_paths`
compares it with ``build_context(summarizer="offline")`` question by question: the two must
send the same context, so a difference is a failing test, not a footnote.

A broker is needed (Redis): ``ctxwarden bench --broker redis://...`` adds the row, and
``python -m ctxwarden_bench.served_path --broker redis://...`` prints it alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctxwarden.core.messages import Message
from ctxwarden_bench.local_servers import LocalJSONServer, free_port, stop_process
from ctxwarden_bench.session_path import sent

__all__ = ["SERVED_ROW", "ScriptedUpstream", "ServedPath", "main"]

SERVED_ROW = "serve + worker"
"""The row's name in the bench's LoCoMo paths table."""

_CLI = ("-c", "from ctxwarden.cli.main import main; main()")
_COMPLETION = {
    "id": "chatcmpl-served",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "gpt-4o",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
}
_REFUSED = {"error": {"message": "refused", "type": "invalid_request", "param": None}}


class ScriptedUpstream(LocalJSONServer):
    """An OpenAI-compatible upstream on a free local port (a thread of this process) that
    keeps every request body it receives and answers 400 to the next ``refuse`` calls,
    200 with a short completion otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[dict[str, Any]] = []
        self._refusals = 0
        self._lock = threading.Lock()

    def refuse(self, calls: int = 1) -> None:
        with self._lock:
            self._refusals += calls

    def answer(self, body: bytes) -> tuple[int, Any]:
        with self._lock:
            self.bodies.append(json.loads(body or b"{}"))
            if self._refusals:
                self._refusals -= 1
                return 400, _REFUSED
        return 200, _COMPLETION


class ServedPath:
    """``ctxwarden serve`` + ``ctxwarden worker`` for :func:`locomo_paths` (see the module
    docstring). ``broker`` is a Redis URL; ``db`` a store URL both processes share (a
    temporary SQLite file when ``None``). Each question is a session of its own, in a
    tenant of its own (a store given may hold an earlier run's). Use it as a context
    manager, or call :meth:`close`: it stops what it started."""

    def __init__(
        self,
        broker: str,
        db: str | None = None,
        *,
        model: str = "gpt-4o",
        job_timeout: float = 120.0,
        start_timeout: float = 90.0,
    ) -> None:
        from ctxwarden.service.keys import hash_key, new_key, shown_prefix
        from ctxwarden.store import open_store
        from ctxwarden.store.service_tables import add_tenant

        self.model, self.job_timeout = model, job_timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="ctxwarden-bench-served-")
        tmp = Path(self._tmp.name)
        self.db = db or f"sqlite:///{tmp / 'served.db'}"
        self.queue = f"ctxw-bench-{uuid.uuid4().hex[:8]}"
        self.tenant, self.key = f"bench-{uuid.uuid4().hex[:8]}", new_key()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []
        self.upstream: ScriptedUpstream | None = None
        try:
            with open_store(self.db) as store:  # migrates it before either process opens it
                add_tenant(store, self.tenant, key_hash=hash_key(self.key),
                           key_prefix=shown_prefix(self.key))  # fmt: skip
            self.upstream = ScriptedUpstream().start()
            env = {**os.environ, "CTXWARDEN_JOB_QUEUE": self.queue}
            jobs = ("--db", self.db, "--broker", broker, "--summarizer", "offline")
            self.worker_log = tmp / "worker.log"
            worker_args = [*jobs, "--queue", self.queue, "--concurrency", "1"]
            worker = self._start("worker", worker_args, env, self.worker_log)
            self.serve_log = tmp / "serve.log"
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            serve_args = [*jobs, "--port", str(port), "--upstream", self.upstream.url + "/v1"]
            serve = self._start("serve", serve_args, env, self.serve_log)
            self._wait_serve(serve, start_timeout)
            self._wait_worker(worker, start_timeout)
        except BaseException:
            self.close()
            raise
        self._names = 0

    def _start(
        self, command: str, args: Sequence[str], env: dict[str, str], log: Path
    ) -> subprocess.Popen[bytes]:
        out = log.open("ab")
        self._logs.append(out)
        proc = subprocess.Popen(
            [sys.executable, *_CLI, command, *args], stdout=out, stderr=subprocess.STDOUT, env=env
        )
        self._procs.append(proc)
        return proc

    def _wait_serve(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._alive(proc, "ctxwarden serve", self.serve_log)
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + "/readyz", timeout=1) as r,
            ):
                if r.status == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"ctxwarden serve not ready in {timeout:.0f} s: {_tail(self.serve_log)}")

    def _wait_worker(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        """Celery says `` ready.`` once it consumes the queue; a job enqueued before that
        would wait all the same, but a worker that cannot start must fail here."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._alive(proc, "ctxwarden worker", self.worker_log)
            if b" ready." in self.worker_log.read_bytes():
                return
            time.sleep(0.1)
        raise RuntimeError(f"ctxwarden worker not ready in {timeout:.0f} s: "
                           f"{_tail(self.worker_log)}")  # fmt: skip

    @staticmethod
    def _alive(proc: subprocess.Popen[bytes], name: str, log: Path) -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited ({proc.returncode}): {_tail(log)}")

    def close(self) -> None:
        for proc in reversed(self._procs):
            stop_process(proc)
        self._procs.clear()
        for out in self._logs:
            out.close()
        self._logs.clear()
        if self.upstream is not None:
            self.upstream.stop()
            self.upstream = None
        self._tmp.cleanup()

    def __enter__(self) -> ServedPath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, session: str, messages: Sequence[Message], budget: int) -> int:
        request = urllib.request.Request(
            self.url + "/v1/chat/completions",
            data=json.dumps({"model": self.model, "messages": sent(messages)}).encode(),
            headers={
                "Authorization": f"Bearer {self.key}",
                "Content-Type": "application/json",
                "X-Ctxwarden-Session": session,
                "X-Ctxwarden-Max-Input-Tokens": str(budget),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            e.read()
            return int(e.code)

    def _wait_job(self, session: str) -> None:
        """Until the session's summary job has run to an end: it must have landed."""
        from ctxwarden.store import open_store
        from ctxwarden.store.job_log import job_attempts

        deadline = time.monotonic() + self.job_timeout
        while True:
            with open_store(self.db) as store:
                found = job_attempts(store, self.tenant, session)
            if found and all(a.outcome for a in found):
                if found[-1].outcome != "landed":
                    raise RuntimeError(f"the summary job of {session} ended {found[-1]}")
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no summary job of {session} ended within {self.job_timeout:.0f} s "
                    f"(attempts: {found}); worker log: {_tail(self.worker_log)}"
                )
            time.sleep(0.1)

    def path(self, messages: Sequence[Message], budget: int) -> list[dict[str, Any]]:
        """One question as a client of the proxy (see the module docstring): the context
        the upstream received, as OpenAI dicts."""
        assert self.upstream is not None, "closed"
        self._names += 1
        session = f"q-{self._names}-{uuid.uuid4().hex[:6]}"
        self.upstream.refuse()
        status = self._call(session, messages, budget)
        if status != 400:  # 400: the upstream's refusal, passed on
            raise RuntimeError(f"first call of {session}: HTTP {status}, not the refusal")
        self._wait_job(session)
        status = self._call(session, messages, budget)
        if status != 200:
            raise RuntimeError(f"second call of {session}: HTTP {status}: {_tail(self.serve_log)}")
        return list(self.upstream.bodies[-1]["messages"])


def _tail(log: Path, chars: int = 2000) -> str:
    try:
        return log.read_text("utf-8", "replace")[-chars:]
    except OSError:
        return "(no log)"


def main(argv: list[str] | None = None) -> int:
    """Print the LoCoMo paths rows, ``serve + worker`` among them, as JSON."""
    from ctxwarden_bench.session_path import locomo_paths, session_locomo_path
    from ctxwarden_bench.traces import load_locomo

    data = Path(os.environ.get("CTXWARDEN_DATA") or Path("..") / "shared" / "data")
    ap = argparse.ArgumentParser(prog="python -m ctxwarden_bench.served_path", description=__doc__)
    ap.add_argument("--broker", required=True, help="Redis URL of the job queue")
    ap.add_argument("--db", help="store URL (default: a temporary SQLite file)")
    ap.add_argument("--locomo", type=Path, default=data / "locomo" / "locomo-dev.json")
    ap.add_argument("--budget", type=int, default=4000)
    ap.add_argument("--questions", type=int, help="per conversation (default: all)")
    ap.add_argument("--conversations", type=int, help="the first N (default: all)")
    args = ap.parse_args(argv)
    convs = load_locomo(args.locomo)[: args.conversations]
    with tempfile.TemporaryDirectory() as tmp, ServedPath(args.broker, args.db) as served:
        paths = {
            "session": session_locomo_path(f"sqlite:///{tmp}/locomo.db"),
            SERVED_ROW: served.path,
        }
        rows = locomo_paths(convs, args.budget, paths=paths, questions=args.questions,
                            progress=lambda s: print(s, file=sys.stderr))  # fmt: skip
    print(json.dumps(rows, indent=2))
    same = [r.get("same_as_build_context", r["questions"]) == r["questions"] for r in rows.values()]
    return 0 if all(same) else 1


if __name__ == "__main__":
    raise SystemExit(main())
