"""OpenTelemetry traces (issue 40): the build's span and its audit attributes, the summary
cycle's span, the proxied call's GenAI span parenting the build and continuing the
client's trace, and nothing at all without OpenTelemetry."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_servers import (
    Recorded,
    Reply,
    ScriptedServer,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_stream,
)
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.util._once import Once
from starlette.testclient import TestClient

from ctxwarden import Policy, Session, build_context
from ctxwarden.service import ServiceConfig, create_app
from ctxwarden.service.keys import hash_key, shown_prefix
from ctxwarden.store import open_store
from ctxwarden.store.service_tables import add_tenant
from ctxwarden.telemetry import attributes as telemetry_attributes

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"
AUTH = {"authorization": "Bearer cwk_t"}


def _reset_globals() -> None:
    """Forget the global tracer provider (as OpenTelemetry's own tests do)."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The SDK installed as the global provider, its spans kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_globals()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset_globals()


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _agent_history(turns: int = 30) -> list[dict[str, Any]]:
    """A tool-using agent's history: big tool results the build must mask or cut."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a booking agent. Never cancel without asking."},
        {"role": "user", "content": "Find reservation ABC123 and change the seat."},
    ]
    for i in range(turns):
        args = json.dumps({"q": f"page {i}"})
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "search", "arguments": args}}  # fmt: skip
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        page = " ".join(f"row{i}-{j} flight UA{100 + j} seat {j}A" for j in range(120))
        out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": page})
    out.append({"role": "user", "content": "Now pick the window seat on UA105."})
    return out


# -- the build ----------------------------------------------------------------------------


def _check_build_span(span: ReadableSpan, built: Any) -> None:
    audit = built.audit
    attrs = dict(span.attributes or {})
    assert attrs["ctxwarden.build.budget"] == audit.budget
    assert attrs["ctxwarden.build.input_tokens"] == built.input_tokens
    assert attrs["ctxwarden.build.fill_ratio"] == pytest.approx(audit.fill_ratio)
    assert attrs["ctxwarden.build.prefix_shared_tokens"] == audit.prefix_shared_tokens
    for layer, tokens in audit.layers.items():
        assert attrs[f"ctxwarden.build.layer.{layer}.tokens"] == tokens
    for kind in ("dropped", "masked", "truncated", "summarized"):
        assert attrs[f"ctxwarden.build.messages.{kind}"] == len(audit.by_action(kind))


def test_build_context_makes_one_build_span_with_the_audit(
    spans: InMemorySpanExporter,
) -> None:
    built = build_context(_agent_history(), "gpt-4o", 4_000)
    [span] = _named(spans, "ctxwarden.build")
    _check_build_span(span, built)
    attrs = dict(span.attributes or {})
    cut = sum(attrs[f"ctxwarden.build.messages.{k}"] for k in ("dropped", "masked", "truncated"))
    assert cut > 0  # the build had work to do: the counts are not all zero
    assert attrs["ctxwarden.build.budget"] == 4_000
    assert len(spans.get_finished_spans()) == 1


def test_the_servers_warm_up_build_makes_no_span(spans: InMemorySpanExporter) -> None:
    """``ctxwarden serve`` builds once before it listens (:mod:`ctxwarden.service.warm`):
    no build a user asked for, so none in their traces; a build after it is traced."""
    from ctxwarden.service.warm import warm_up

    warm_up()
    assert spans.get_finished_spans() == ()
    build_context(_agent_history(), "gpt-4o", 4_000)
    assert len(_named(spans, "ctxwarden.build")) == 1


def test_a_second_build_reports_the_prefix_it_kept(spans: InMemorySpanExporter) -> None:
    history = _agent_history()
    first = build_context(history, "gpt-4o", 4_000)
    second = build_context([*history, {"role": "assistant", "content": "Done."}], "gpt-4o",
                           4_000, previous=first)  # fmt: skip
    later = _named(spans, "ctxwarden.build")[-1]
    assert second.audit.prefix_shared_tokens > 0
    assert later.attributes["ctxwarden.build.prefix_shared_tokens"] == (  # type: ignore[index]
        second.audit.prefix_shared_tokens
    )


def test_session_build_and_summarize_spans(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    policy = Policy.from_dict({"summary": {"max_messages": 20, "keep_recent": 6}})
    with Session(open_store(db), "s1", model="gpt-4o", policy=policy) as session:
        session.append(_agent_history(20))
        built = session.build(max_input_tokens=4_000)
        [span] = _named(spans, "ctxwarden.build")
        _check_build_span(span, built)
        written = session.summarize_sync("offline")
    [summary] = _named(spans, "ctxwarden.summarize")
    attrs = dict(summary.attributes or {})
    assert written is not None and written.folded > 0
    assert attrs["ctxwarden.summarize.outcome"] == "folded"
    assert attrs["ctxwarden.summarize.folded_messages"] == written.folded


def test_no_attributes_computed_when_the_span_does_not_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A provider whose sampler drops every span: the audit is never read for them."""
    _reset_globals()
    trace.set_tracer_provider(TracerProvider(sampler=ALWAYS_OFF))

    def boom(audit: Any) -> dict[str, Any]:
        raise AssertionError("attributes computed for a span that does not record")

    monkeypatch.setattr(telemetry_attributes, "build_attributes", boom)
    try:
        built = build_context(_agent_history(5), "gpt-4o", 4_000)
    finally:
        _reset_globals()
    assert built.input_tokens > 0


# -- the proxy ----------------------------------------------------------------------------


def _upstream_answer(request: Recorded) -> Reply:
    body = request.json
    if request.path.endswith("/messages"):
        if body.get("stream"):
            return Reply(events=anthropic_stream(["o", "k"], input_tokens=30, output_tokens=4,
                                                 cache_read=12))  # fmt: skip
        return Reply(body=anthropic_message("ok", input_tokens=30, output_tokens=4, cache_read=12))
    if body.get("stream"):
        return Reply(events=openai_stream(["o", "k"], prompt=42, completion=4, cached=12))
    return Reply(body=openai_completion("ok", prompt=42, completion=4, cached=12))


@pytest.fixture
def upstream() -> Iterator[ScriptedServer]:
    server = ScriptedServer(_upstream_answer).start()
    try:
        yield server
    finally:
        server.stop()


def _app(tmp_path: Path, upstream: ScriptedServer) -> TestClient:
    db = f"sqlite:///{tmp_path / 'svc.db'}"
    with open_store(db) as store:
        add_tenant(store, "t", key_hash=hash_key("cwk_t"), key_prefix=shown_prefix("cwk_t"))
    config = ServiceConfig(db=db, upstream=upstream.url + "/v1", anthropic_upstream=upstream.url)
    return TestClient(create_app(config), raise_server_exceptions=False)


def _traceparent(value: str) -> tuple[str, str]:
    version, trace_id, parent_id, _flags = value.split("-")
    assert version == "00"
    return trace_id, parent_id


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_proxied_call_span_parents_the_build_and_continues_the_client_trace(
    spans: InMemorySpanExporter, tmp_path: Path, upstream: ScriptedServer, api: str, stream: bool
) -> None:
    history = _agent_history(8)
    with _app(tmp_path, upstream) as client:
        if api == "openai":
            path, model = "/v1/chat/completions", "gpt-4o"
            body: dict[str, Any] = {"model": model, "messages": history, "stream": stream}
            auth = {"authorization": "Bearer cwk_t"}
        else:
            path, model = "/v1/messages", "claude-sonnet-4-5"
            turns = [{"role": "user", "content": "Find reservation ABC123."},
                     {"role": "assistant", "content": "Which seat?"},
                     {"role": "user", "content": "The window seat."}]  # fmt: skip
            body = {"model": model, "max_tokens": 64, "messages": turns, "stream": stream}
            auth = {"x-api-key": "cwk_t"}
        answer = client.post(path, json=body, headers={**auth, "traceparent": TRACEPARENT})
        assert answer.status_code == 200, answer.text
    [call] = _named(spans, f"chat {model}")
    [build] = _named(spans, "ctxwarden.build")
    attrs = dict(call.attributes or {})
    provider = "openai" if api == "openai" else "anthropic"
    assert attrs["gen_ai.provider.name"] == attrs["gen_ai.system"] == provider
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == model
    input_tokens = 42 if api == "openai" else 30 + 12  # Anthropic's excludes its cache reads
    assert attrs["gen_ai.usage.input_tokens"] == input_tokens
    assert attrs["gen_ai.usage.output_tokens"] == 4
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == 12
    assert call.kind == trace.SpanKind.CLIENT
    assert attrs["ctxwarden.build.id"] == answer.headers["x-ctxwarden-build-id"]
    assert attrs["ctxwarden.session.id"] == answer.headers["x-ctxwarden-session"]
    # the client's trace, continued; the build a child of the call
    assert call.context is not None and build.context is not None
    assert f"{call.context.trace_id:032x}" == CLIENT_TRACE
    assert call.parent is not None and f"{call.parent.span_id:016x}" == CLIENT_PARENT
    assert build.parent is not None and build.parent.span_id == call.context.span_id
    assert build.context.trace_id == call.context.trace_id
    assert build.attributes["ctxwarden.build.input_tokens"] > 0  # type: ignore[index,operator]
    # upstream was called inside the same trace, as a child of the call's span
    [sent] = upstream.requests
    trace_id, parent_id = _traceparent(sent.headers["traceparent"])
    assert trace_id == CLIENT_TRACE
    assert parent_id == f"{call.context.span_id:016x}"


def test_an_upstream_failure_ends_the_call_span_as_an_error(
    spans: InMemorySpanExporter, tmp_path: Path, upstream: ScriptedServer
) -> None:
    upstream.reply(Reply(500, {"error": {"message": "down", "type": "server_error"}}))
    with _app(tmp_path, upstream) as client:
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        answer = client.post("/v1/chat/completions", json=body, headers=AUTH)
        assert answer.status_code == 500
    [call] = _named(spans, "chat gpt-4o")
    assert call.status.status_code == trace.StatusCode.ERROR
    assert call.attributes["error.type"] == "upstream_500"  # type: ignore[index]
    assert call.parent is None  # no traceparent from the client: a new trace


# -- without OpenTelemetry ----------------------------------------------------------------

_BLOCKED = textwrap.dedent(
    """
    import sys

    class Blocked:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError("blocked for the test: " + name)
            return None

    sys.meta_path.insert(0, Blocked())
    """
)


def _run(script: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_without_opentelemetry_the_library_runs_and_never_imports_it(tmp_path: Path) -> None:
    script = _BLOCKED + textwrap.dedent(
        f"""
        import json, os
        from ctxwarden import Session, build_context
        from ctxwarden.core.errors import ConfigError
        from ctxwarden.store import open_store
        from ctxwarden.telemetry import configure_from_env

        msgs = [{{"role": "user", "content": "hello " * 50}}]
        built = build_context(msgs, "gpt-4o", 1000, summarizer="offline")
        with Session(open_store("sqlite:///{tmp_path / "x.db"}"), "s", model="gpt-4o") as s:
            s.append(msgs)
            again = s.build()
            s.summarize_sync("offline")
        untouched = configure_from_env()  # no OTEL_* variable: nothing to do
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:4318"
        try:
            configure_from_env()
            refused = ""
        except ConfigError as exc:
            refused = str(exc)
        print(json.dumps({{
            "same": built.messages == again.messages,
            "untouched": untouched,
            "loaded": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
            "refused": refused,
        }}))
        """
    )
    out = _run(script)
    assert out["same"] and out["untouched"] is False
    assert out["loaded"] == []
    assert "opentelemetry-sdk" in out["refused"]


def test_proxy_without_an_sdk_adds_no_span_and_no_header(tmp_path: Path) -> None:
    """FastAPI itself imports the OpenTelemetry API; without an SDK the proxy is as before."""
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from llm_servers import Reply, ScriptedServer, openai_completion
        from starlette.testclient import TestClient
        from ctxwarden.service import ServiceConfig, create_app
        from ctxwarden.service.keys import hash_key, shown_prefix
        from ctxwarden.store import open_store
        from ctxwarden.store.service_tables import add_tenant

        db = "sqlite:///{tmp_path / "svc.db"}"
        up = ScriptedServer(lambda r: Reply(body=openai_completion("ok"))).start()
        with open_store(db) as store:
            add_tenant(store, "t", key_hash=hash_key("cwk_t"), key_prefix=shown_prefix("cwk_t"))
        app = create_app(ServiceConfig(db=db, upstream=up.url + "/v1"))
        msgs = [{{"role": "user", "content": "hello"}}]
        with TestClient(app) as client:
            headers = {{"authorization": "Bearer cwk_t", "traceparent": "{TRACEPARENT}"}}
            body = {{"model": "gpt-4o", "messages": msgs}}
            r = client.post("/v1/chat/completions", json=body, headers=headers)
        up.stop()
        print(json.dumps({{
            "status": r.status_code,
            "reply": r.json()["choices"][0]["message"]["content"],
            "traceparent": up.requests[0].headers.get("traceparent"),
            "sdk": any(m.startswith("opentelemetry.sdk") for m in sys.modules),
        }}))
        """
    )
    out = _run(script)
    assert out["status"] == 200 and out["reply"] == "ok"
    assert out["traceparent"] is None  # as before: the proxy adds no header of its own
    assert out["sdk"] is False


# -- ctxwarden serve, configured the standard way -----------------------------------------


def test_serve_exports_the_call_and_its_build_over_otlp(tmp_path: Path) -> None:
    """The real server process with ``OTEL_EXPORTER_OTLP_ENDPOINT``: its spans reach an
    OTLP/HTTP receiver (a scripted one here: it decodes what the SDK's exporter sent)."""
    import urllib.request

    from service_harness import ProxyServer
    from service_harness import add_tenant as cli_add_tenant

    receiver = ScriptedServer(lambda r: Reply(body={})).start()
    upstream = ScriptedServer(_upstream_answer).start()
    db = f"sqlite:///{tmp_path / 'serve.db'}"
    key = cli_add_tenant(db, "t")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50",
           "OTEL_SERVICE_NAME": "ctxwarden-test"}  # fmt: skip
    server = ProxyServer(db, upstream=upstream.url + "/v1", env=env)
    try:
        body = json.dumps({"model": "gpt-4o", "messages": _agent_history(4)}).encode()
        request = urllib.request.Request(server.url + "/v1/chat/completions", data=body,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json",
                     "traceparent": TRACEPARENT})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
    finally:
        server.stop()  # the provider flushes its spans on the way out
        receiver.stop()
        upstream.stop()
    found = {
        span.name: span for service, span in _exported(receiver) if service == "ctxwarden-test"
    }
    call, build = found["chat gpt-4o"], found["ctxwarden.build"]
    assert call.trace_id.hex() == CLIENT_TRACE and call.parent_span_id.hex() == CLIENT_PARENT
    assert build.trace_id == call.trace_id and build.parent_span_id == call.span_id
    attrs = {a.key: a.value for a in call.attributes}
    assert attrs["gen_ai.provider.name"].string_value == "openai"
    assert attrs["gen_ai.usage.input_tokens"].int_value == 42
    assert attrs["gen_ai.usage.output_tokens"].int_value == 4
    [forwarded] = upstream.requests
    assert forwarded.headers["traceparent"] == f"00-{CLIENT_TRACE}-{call.span_id.hex()}-01"


def _exported(receiver: ScriptedServer) -> list[tuple[str, Any]]:
    """(service name, span) of every span an OTLP/HTTP exporter sent ``receiver``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    out = []
    for sent in receiver.requests:
        assert sent.path == "/v1/traces"
        message = ExportTraceServiceRequest.FromString(sent.body)
        for resource in message.resource_spans:
            named = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                out += [(named["service.name"], span) for span in scope.spans]
    return out


def test_the_workers_summary_job_joins_the_calls_trace(
    pg_schema_url: str | None, tmp_path: Path
) -> None:
    """``serve --broker`` enqueues the summary a build found due with the build's
    ``traceparent``; the Celery worker's ``ctxwarden.summarize`` span continues it."""
    import os
    import urllib.request
    import uuid

    from service_harness import ProxyServer
    from service_harness import add_tenant as cli_add_tenant
    from test_replicas import Worker

    from ctxwarden.store.job_log import job_attempts
    from ctxwarden_bench.scale_upstream import ScaleUpstream

    redis = os.environ.get("CTXWARDEN_TEST_REDIS")
    if not redis or not pg_schema_url:
        pytest.skip("set CTXWARDEN_TEST_REDIS and CTXWARDEN_TEST_POSTGRES to run the worker")
    db, queue = pg_schema_url, f"ctxw-otel-{uuid.uuid4().hex[:8]}"
    policy = tmp_path / "policy.toml"
    policy.write_text("[summary]\nmax_messages = 6\nkeep_recent = 2\n")
    receiver = ScriptedServer(lambda r: Reply(body={})).start()
    upstream = ScaleUpstream(summary_delay=0.0).start()
    key = cli_add_tenant(db, "t")
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    server = ProxyServer(db, upstream=upstream.url, env={**otel, "CTXWARDEN_JOB_QUEUE": queue},
                         extra=("--policy", str(policy), "--broker", redis))  # fmt: skip
    worker = Worker(db, redis, queue, upstream.url, tmp_path / "worker.log", **otel)
    try:
        turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 30}
                 for i in range(13)]  # fmt: skip
        body = json.dumps({"model": "gpt-4o", "messages": turns}).encode()
        request = urllib.request.Request(server.url + "/v1/chat/completions", data=body,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json",
                     "traceparent": TRACEPARENT, "x-ctxwarden-session": "otel-job"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
        deadline = time.monotonic() + 40
        with open_store(db) as store:
            while time.monotonic() < deadline:
                attempts = job_attempts(store, "t", "otel-job")
                if attempts and all(a.outcome for a in attempts):
                    break
                time.sleep(0.2)
        assert attempts and attempts[-1].outcome == "landed", attempts
    finally:
        worker.stop()  # both flush their spans on the way out
        server.stop()
        receiver.stop()
        upstream.stop()
    spans = _exported(receiver)
    [job] = [span for service, span in spans if service == "ctxwarden-worker"]
    [build] = [span for service, span in spans if span.name == "ctxwarden.build"]
    assert job.name == "ctxwarden.summarize"
    assert job.trace_id.hex() == CLIENT_TRACE and job.parent_span_id == build.span_id
    attrs = {a.key: a.value for a in job.attributes}
    assert attrs["ctxwarden.summarize.outcome"].string_value == "folded"
    assert attrs["ctxwarden.summarize.folded_messages"].int_value > 0


GRPC = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
}


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin'"),
        (GRPC, "opentelemetry-exporter-otlp-proto-grpc"),
    ],
)
def test_serve_refuses_traces_it_cannot_export(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    from service_harness import cli

    done = cli("serve", "--db", f"sqlite:///{tmp_path / 'x.db'}", "--upstream",
               "http://127.0.0.1:9/v1", "--port", "9", env=env)  # fmt: skip
    assert done.returncode != 0
    assert says in done.stderr


def test_a_refused_build_ends_the_call_span_with_its_error(
    spans: InMemorySpanExporter, tmp_path: Path, upstream: ScriptedServer
) -> None:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello " * 200}]}
    headers = {**AUTH, "x-ctxwarden-max-input-tokens": "20", "traceparent": TRACEPARENT}
    with _app(tmp_path, upstream) as client:
        answer = client.post("/v1/chat/completions", json=body, headers=headers)
    assert answer.status_code == 400, answer.text
    [call] = _named(spans, "chat gpt-4o")
    assert call.status.status_code == trace.StatusCode.ERROR
    assert call.attributes["error.type"] == "http_400"  # type: ignore[index]
    assert [e.name for e in call.events] == ["exception"]  # recorded once
    assert f"{call.context.trace_id:032x}" == CLIENT_TRACE  # type: ignore[union-attr]
    assert upstream.requests == []
