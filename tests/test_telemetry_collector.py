"""OpenTelemetry end to end (issue 40): ``ctxwarden serve``, configured only by the standard
``OTEL_*`` variables, exports a proxied call's spans over OTLP/HTTP to a real trace
collector process (Arize Phoenix, installed from PyPI in its own environment by ``.ci/run``),
and the collector, asked through its own REST API, holds the call span in the client's trace
with the build as its child.

Runs when ``CTXWARDEN_TEST_PHOENIX`` names the ``phoenix`` executable; skips otherwise (a
laptop without it). Phoenix is not a dependency of ctxwarden: it is the receiving end a user
might run (as Jaeger, Tempo or an OpenTelemetry Collector would be).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_servers import Recorded, Reply, ScriptedServer, openai_completion, openai_stream
from service_harness import ProxyServer, add_tenant, free_port

from ctxwarden_bench.local_servers import stop_process

PHOENIX = os.environ.get("CTXWARDEN_TEST_PHOENIX", "")
CLIENT_TRACE = "5af92f3577b34da6a3ce929d0e0e4737"
CLIENT_PARENT = "10f067aa0ba902b8"

pytestmark = pytest.mark.skipif(
    not PHOENIX,
    reason="CTXWARDEN_TEST_PHOENIX (the path of a `phoenix` executable, arize-phoenix) is unset",
)


class Phoenix:
    """A Phoenix server on free ports with a working directory of its own."""

    def __init__(self, executable: str, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (workdir / "phoenix.log").open("wb")
        env = {**os.environ, "PHOENIX_WORKING_DIR": str(workdir), "PHOENIX_PORT": str(self.port),
               "PHOENIX_GRPC_PORT": str(free_port()), "PHOENIX_HOST": "127.0.0.1"}  # fmt: skip
        self.proc = subprocess.Popen(
            [executable, "serve"], stdout=self.log, stderr=subprocess.STDOUT, env=env
        )
        self._wait_ready(workdir)

    def _wait_ready(self, workdir: Path, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (workdir / "phoenix.log").read_text(errors="replace")[-2000:]
                raise AssertionError(f"phoenix exited ({self.proc.returncode}): {log}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise AssertionError(f"phoenix did not answer on {self.url} in {timeout:.0f} s")

    def spans(self, project: str = "default") -> list[dict[str, Any]]:
        url = f"{self.url}/v1/projects/{project}/spans?limit=1000"
        with urllib.request.urlopen(url, timeout=10) as r:
            return list(json.loads(r.read())["data"])

    def stop(self) -> None:
        stop_process(self.proc, timeout=20)
        self.log.close()


@pytest.fixture(scope="module")
def phoenix() -> Iterator[Phoenix]:
    with tempfile.TemporaryDirectory(prefix="ctxw-phoenix-") as workdir:
        server = Phoenix(PHOENIX, Path(workdir))
        try:
            yield server
        finally:
            server.stop()


def _answer(request: Recorded) -> Reply:
    if request.json.get("stream"):
        return Reply(events=openai_stream(["o", "k"], prompt=42, completion=4, cached=12))
    return Reply(body=openai_completion("ok", prompt=42, completion=4, cached=12))


def _history() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a booking agent."},
        {"role": "user", "content": "Cancel reservation ABC123 for me."},
    ]


def _spans_of(phoenix: Phoenix, trace_id: str, wanted: int) -> list[dict[str, Any]]:
    """The collector's spans of one trace, once it holds ``wanted`` of them (ingestion is
    asynchronous on its side)."""
    deadline = time.monotonic() + 60
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        found = [s for s in phoenix.spans() if s["context"]["trace_id"] == trace_id]
        if len(found) >= wanted:
            return found
        time.sleep(0.5)
    return found


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_proxied_call_reaches_a_real_collector_in_the_clients_trace(
    phoenix: Phoenix, tmp_path: Path, stream: bool
) -> None:
    import openai

    upstream = ScriptedServer(_answer).start()
    db = f"sqlite:///{tmp_path / 'serve.db'}"
    key = add_tenant(db, "t")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": phoenix.url, "OTEL_BSP_SCHEDULE_DELAY": "50",
           "OTEL_SERVICE_NAME": "ctxwarden-e2e"}  # fmt: skip
    server = ProxyServer(db, upstream=upstream.url + "/v1", env=env)
    trace_id = CLIENT_TRACE[:-1] + ("1" if stream else "0")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
        headers = {"traceparent": f"00-{trace_id}-{CLIENT_PARENT}-01"}
        if stream:
            chunks = client.chat.completions.create(
                model="gpt-4o", messages=_history(), stream=True,
                stream_options={"include_usage": True}, extra_headers=headers,
            )  # fmt: skip
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            reply = client.chat.completions.create(
                model="gpt-4o", messages=_history(), extra_headers=headers
            )
            text = reply.choices[0].message.content or ""
        assert text == "ok"
        # exported while the server runs (50 ms batches): not left to the flush on the way
        # out, which a busy machine can cut short (the server is killed after 10 s)
        found = _spans_of(phoenix, trace_id, wanted=2)
    finally:
        server.stop()  # the SDK's batch processor flushes what is left on the way out
        upstream.stop()

    if len(found) < 2:
        found = _spans_of(phoenix, trace_id, wanted=2)
    spans = {s["name"]: s for s in found}
    assert {"chat gpt-4o", "ctxwarden.build"} <= set(spans), sorted(spans)
    call, build = spans["chat gpt-4o"], spans["ctxwarden.build"]
    assert call["parent_id"] == CLIENT_PARENT
    assert build["parent_id"] == call["context"]["span_id"]
    attrs = call["attributes"]
    assert attrs["gen_ai.request.model"] == "gpt-4o"
    assert attrs["gen_ai.usage.input_tokens"] == 42
    assert attrs["gen_ai.usage.output_tokens"] == 4
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == 12
    assert build["attributes"]["ctxwarden.build.input_tokens"] > 0
    [forwarded] = upstream.requests
    assert forwarded.headers["traceparent"] == f"00-{trace_id}-{call['context']['span_id']}-01"
