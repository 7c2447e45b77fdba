"""Running ``ctxwarden serve`` as a real process for the service tests.

:class:`ProxyServer` starts the console script on a free loopback port against a store
URL and an upstream (a :class:`~llm_servers.ScriptedServer` in the test process, so a
test can read exactly what the proxy forwarded), waits for ``/readyz``, and stops it —
politely, or with SIGKILL for the crash tests. Tenants are added through the CLI, as
the contract says (``ctxwarden tenant add`` prints the key alone on its last line).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxwarden_bench.local_servers import free_port, stop_process

PG_DSN = os.environ.get("CTXWARDEN_TEST_POSTGRES")
PG_SKIP = "set CTXWARDEN_TEST_POSTGRES to a PostgreSQL DSN to run the service on PostgreSQL"
CLI = str(Path(sys.executable).with_name("ctxwarden"))


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )


def add_tenant(db: str, name: str, *extra: str) -> str:
    done = cli("tenant", "add", name, "--db", db, *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


class ProxyServer:
    def __init__(
        self,
        db: str,
        *,
        upstream: str | None = None,
        anthropic_upstream: str | None = None,
        gemini_upstream: str | None = None,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.db = db
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [CLI, "serve", "--db", db, "--port", str(self.port), *extra]
        if upstream:
            args += ["--upstream", upstream]
        if anthropic_upstream:
            args += ["--anthropic-upstream", anthropic_upstream]
        if gemini_upstream:
            args += ["--gemini-upstream", gemini_upstream]
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "CTXWARDEN_UPSTREAM_API_KEY": "sk-upstream-openai",
                 "CTXWARDEN_ANTHROPIC_API_KEY": "sk-upstream-anthropic",
                 "CTXWARDEN_GEMINI_API_KEY": "sk-upstream-gemini", **(env or {})},
        )  # fmt: skip
        self._wait_ready()

    def _wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise AssertionError(f"ctxwarden serve exited ({self.proc.returncode}): {err}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise AssertionError("ctxwarden serve did not become ready")

    def get(self, path: str, key: str | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path)
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                body = r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            body, status = e.read(), e.code
        try:
            return status, json.loads(body) if body else None
        except ValueError:
            return status, body.decode()

    def stop(self) -> None:
        stop_process(self.proc, timeout=10)  # SIGTERM, then SIGKILL after 10 s
        if self.proc.stderr:
            self.proc.stderr.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stderr:
            self.proc.stderr.close()


def pg_url(schema: str) -> str:
    assert PG_DSN
    return f"{PG_DSN}{'&' if '?' in PG_DSN else '?'}schema={schema}"


def drop_schema(schema: str) -> None:
    import psycopg

    assert PG_DSN
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store per test: an SQLite file, or a PostgreSQL schema dropped after."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'service.db'}"
        return
    if not PG_DSN:
        pytest.skip(PG_SKIP)
    schema = f"ctxw_svc_{uuid.uuid4().hex[:10]}"
    yield pg_url(schema)
    drop_schema(schema)


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def module_db(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A store shared by one module's tests (each test uses its own session ids)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('svc') / 'service.db'}"
        return
    if not PG_DSN:
        pytest.skip(PG_SKIP)
    schema = f"ctxw_svc_{uuid.uuid4().hex[:10]}"
    yield pg_url(schema)
    drop_schema(schema)


def sid() -> str:
    """A fresh client session id."""
    return f"chat-{uuid.uuid4().hex[:10]}"


def sse(name: str | None, data: dict[str, Any]) -> str:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def _block(index: int, block: dict[str, Any]) -> str:
    return sse("content_block_start", {"type": "content_block_start", "index": index,
                                       "content_block": block})  # fmt: skip


def _delta(index: int, delta: dict[str, Any]) -> str:
    return sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                       "delta": delta})  # fmt: skip


def _stop(index: int) -> str:
    return sse("content_block_stop", {"type": "content_block_stop", "index": index})


def anthropic_rich_stream(
    *,
    text: str,
    tool: tuple[str, str, dict[str, Any]] | None,
    thinking: str = "",
    redacted: str = "",
    error: bool = False,
) -> list[str]:
    """An Anthropic stream with a thinking block (thinking and signature deltas) and a
    ``redacted_thinking`` block (whole in its start event) if asked, a ``ping``, a text
    block, optionally a ``tool_use`` block streamed as ``input_json_delta`` pieces, usage
    split over ``message_start`` and ``message_delta``; or cut by ``event: error`` after
    the first text delta."""
    usage = {"input_tokens": 120, "output_tokens": 1, "cache_read_input_tokens": 40,
             "cache_creation_input_tokens": 10}  # fmt: skip
    start = {"id": "msg_rich", "type": "message", "role": "assistant", "model": "claude",
             "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}  # fmt: skip
    out = [sse("message_start", {"type": "message_start", "message": start})]
    index = 0
    if thinking:
        out.append(_block(0, {"type": "thinking", "thinking": "", "signature": ""}))
        out.append(_delta(0, {"type": "thinking_delta", "thinking": thinking}))
        out.append(_delta(0, {"type": "signature_delta", "signature": "sig-abc"}))
        out.append(_stop(0))
        index = 1
    if redacted:
        out.append(_block(index, {"type": "redacted_thinking", "data": redacted}))
        out.append(_stop(index))
        index += 1
    out.append(sse("ping", {"type": "ping"}))
    out.append(_block(index, {"type": "text", "text": ""}))
    half = len(text) // 2
    for piece in (text[:half], text[half:]):
        out.append(_delta(index, {"type": "text_delta", "text": piece}))
        if error:
            overloaded = {"type": "overloaded_error", "message": "Overloaded"}
            out.append(sse("error", {"type": "error", "error": overloaded}))
            return out
    out.append(_stop(index))
    if tool is not None:
        tid, name, args = tool
        index += 1
        out.append(_block(index, {"type": "tool_use", "id": tid, "name": name, "input": {}}))
        raw = json.dumps(args)
        for i in range(0, len(raw), 7):
            out.append(_delta(index, {"type": "input_json_delta", "partial_json": raw[i : i + 7]}))
        out.append(_stop(index))
    stop = {"stop_reason": "tool_use" if tool else "end_turn", "stop_sequence": None}
    out.append(sse("message_delta", {"type": "message_delta", "delta": stop,
                                     "usage": {"output_tokens": 33}}))  # fmt: skip
    out.append(sse("message_stop", {"type": "message_stop"}))
    return out
