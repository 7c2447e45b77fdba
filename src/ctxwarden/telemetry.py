"""OpenTelemetry traces at the edges: the build, the summary cycle and the proxied call.

Spans (the ``otel`` extra installs ``opentelemetry-api``; the SDK and its exporters are
the user's choice):

- ``ctxwarden.build`` around every build (``build_context``, ``Session.build`` /
  ``build_unlogged``), its attributes read off the build's audit: tokens per layer, the
  budget, the fill, the messages dropped, masked, truncated and summarised, the prefix
  kept (:func:`build_attributes`). The build itself stays pure: the span is opened where
  a caller hands the history to :func:`~ctxwarden.build.engine.run_build`, never in a step.
- ``ctxwarden.summarize`` around a summary-and-facts cycle (``Session.summarize``, which
  the Celery worker runs, and :func:`ctxwarden.summarize_history`).
- one span per proxied call (:class:`CallTrace`), named and attributed after the GenAI
  semantic conventions (``chat gpt-4o``; ``gen_ai.provider.name`` and the older
  ``gen_ai.system``, ``gen_ai.request.model``, ``gen_ai.usage.*``), continuing the
  client's W3C ``traceparent``; the build is its child, and upstream gets a
  ``traceparent`` of the same trace.

No cost unless traced: nothing here imports OpenTelemetry. A process that traces has
imported ``opentelemetry.trace`` and installed a tracer provider (configuring an SDK
does, so does ``opentelemetry-instrument``, so does :func:`configure_from_env`); until
then :func:`_trace` is a dict lookup (and the API's provider lookup, when something
else imported the API) and every helper runs the wrapped work alone: no span, no
header. Attributes are computed only for a span that ``is_recording()`` (a sampler may
drop it).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable, Coroutine, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ctxwarden.errors import ConfigError

if TYPE_CHECKING:
    from ctxwarden.build.audit import Audit
    from ctxwarden.build.built import BuiltContext
    from ctxwarden.memory.cycle import LayerUpdate
    from ctxwarden.registry.usage import Usage
    from ctxwarden.session.cycle import SummaryWrite
    from ctxwarden.session.pending_log import PendingLog

__all__ = [
    "BUILD_SPAN",
    "SUMMARIZE_SPAN",
    "CallTrace",
    "build_attributes",
    "call_trace",
    "configure_from_env",
    "continued",
    "trace_headers",
    "traced",
    "traced_async",
]

T = TypeVar("T")
P = ParamSpec("P")

BUILD_SPAN = "ctxwarden.build"
SUMMARIZE_SPAN = "ctxwarden.summarize"
_ACTION_KINDS = ("dropped", "evicted", "masked", "truncated", "summarized", "rejected", "recalled")
_UNSET = object()
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ  # the API loads that one
# gen_ai.provider.name's well-known values, by the proxy's wire format
_PROVIDERS = {"openai": "openai", "responses": "openai", "anthropic": "anthropic",
              "gemini": "gcp.gemini"}  # fmt: skip


def _trace() -> Any:
    """``opentelemetry.trace`` if this process has imported it and installed a tracer
    provider (an SDK), else ``None``: the API's default provider only makes no-op spans,
    and FastAPI imports the API in every server."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    # the global as set: ``get_tracer_provider`` reads the environment on every call
    # until one is set (microseconds); that variable is read once, at import
    provider = getattr(trace, "_TRACER_PROVIDER", _UNSET)
    if provider is _UNSET or (provider is None and _PROVIDER_FROM_ENV):
        provider = trace.get_tracer_provider()
    if provider is None or isinstance(
        provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    ):
        return None
    return trace


def _within(trace: Any, name: str) -> bool:
    """Whether the current span is one named ``name`` (an SDK span has a name)."""
    return getattr(trace.get_current_span(), "name", None) == name


def _tracer(trace: Any) -> Any:
    from ctxwarden._version import __version__

    return trace.get_tracer("ctxwarden", __version__)


def traced(
    name: str, describe: Callable[[T], Mapping[str, Any]]
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorate a function to run inside a span ``name`` (a child of the current span)
    with the attributes ``describe(result)`` when the span records; alone when the
    process does not trace."""

    def wrap(fn: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> T:
            trace = _trace()
            if trace is None:
                return fn(*args, **kwargs)
            with _tracer(trace).start_as_current_span(name) as span:
                result = fn(*args, **kwargs)
                if span.is_recording():
                    span.set_attributes(describe(result))
                return result

        return run

    return wrap


def traced_async(
    name: str, describe: Callable[[T], Mapping[str, Any]]
) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """:func:`traced` for a coroutine function. Within a span of the same name it runs
    alone: ``Session.summarize`` (one span, its outcome and attempts) runs
    :func:`~ctxwarden.summarize_history` once per attempt."""

    def wrap(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(fn)
        async def run(*args: P.args, **kwargs: P.kwargs) -> T:
            trace = _trace()
            if trace is None or _within(trace, name):
                return await fn(*args, **kwargs)
            with _tracer(trace).start_as_current_span(name) as span:
                result = await fn(*args, **kwargs)
                if span.is_recording():
                    span.set_attributes(describe(result))
                return result

        return run

    return wrap


def build_attributes(audit: Audit) -> dict[str, Any]:
    """The ``ctxwarden.build`` span's attributes, off the build's audit. The counts per
    action kind are the audit's actions of that kind: one per message, but one per fold
    for ``summarized`` (``ctxwarden.build.summarized_tokens`` says how much it folded)."""
    counts = dict.fromkeys(_ACTION_KINDS, 0)
    summarized_tokens = 0
    for action in audit.actions:
        counts[action.action] = counts.get(action.action, 0) + 1
        if action.action == "summarized":
            summarized_tokens += action.tokens_saved
    out: dict[str, Any] = {
        "ctxwarden.build.model": audit.model,
        "ctxwarden.build.budget": audit.budget,
        "ctxwarden.build.input_tokens": audit.input_tokens,
        "ctxwarden.build.exact": audit.exact,
        "ctxwarden.build.budget_ratio": audit.budget_ratio,
        "ctxwarden.build.history_messages": audit.history_messages,
        "ctxwarden.build.kept_messages": audit.kept_messages,
        "ctxwarden.build.tokens_saved": audit.tokens_saved,
        "ctxwarden.build.summarized_tokens": summarized_tokens,
        "ctxwarden.build.prefix_shared_tokens": audit.prefix_shared_tokens,
        "ctxwarden.build.cacheable_prefix_tokens": audit.cacheable_prefix_tokens,
        "ctxwarden.build.warnings": len(audit.warnings),
        "ctxwarden.build.steps": list(audit.steps),
    }
    if audit.fill_ratio is not None:
        out["ctxwarden.build.fill_ratio"] = audit.fill_ratio
    if audit.context_window is not None:
        out["ctxwarden.build.context_window"] = audit.context_window
    for layer, tokens in audit.layers.items():
        out[f"ctxwarden.build.layer.{layer}.tokens"] = tokens
    for kind, n in counts.items():
        out[f"ctxwarden.build.messages.{kind}"] = n
    return out


def built_attributes(built: BuiltContext) -> dict[str, Any]:
    return build_attributes(built.audit)


def pending_attributes(pending: PendingLog) -> dict[str, Any]:
    return build_attributes(pending.built.audit)


def _usage_attributes(usage: Usage) -> dict[str, Any]:
    return {
        "ctxwarden.summarize.calls": usage.calls,
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
    }


def summary_write_attributes(write: SummaryWrite | None) -> dict[str, Any]:
    """A session's cycle: ``unchanged`` (nothing to write), ``folded`` or ``facts``."""
    if write is None:
        return {"ctxwarden.summarize.outcome": "unchanged"}
    return {
        "ctxwarden.summarize.outcome": "folded" if write.folded else "facts",
        "ctxwarden.summarize.folded_messages": write.folded,
        "ctxwarden.summarize.meta": write.meta,
        "ctxwarden.summarize.attempts": write.attempts,
        **({"ctxwarden.summarize.error": write.error} if write.error else {}),
        **_usage_attributes(write.usage),
    }


def layer_update_attributes(update: LayerUpdate) -> dict[str, Any]:
    """:func:`ctxwarden.summarize_history`'s cycle."""
    outcome = "failed" if update.error and not update.folded else (
        "folded" if update.folded else "unchanged")  # fmt: skip
    return {
        "ctxwarden.summarize.outcome": outcome,
        "ctxwarden.summarize.folded_messages": len(update.folded),
        "ctxwarden.summarize.meta": update.meta,
        **({"ctxwarden.summarize.error": update.error} if update.error else {}),
        **_usage_attributes(update.usage),
    }


class CallTrace:
    """The span of one proxied call: opened before the build (which it parents, see
    :meth:`current`), its ``traceparent`` put on the upstream request (:meth:`inject`),
    ended once with upstream's usage (:meth:`end`) or the error that ended the call
    (:meth:`fail`)."""

    def __init__(self, trace: Any, span: Any) -> None:
        self._trace, self.span, self._ended = trace, span, False

    @contextmanager
    def current(self) -> Iterator[None]:
        """The span as the current one (spans started inside, the build's, are children)."""
        with self._trace.use_span(self.span, end_on_exit=False):
            yield

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add ``traceparent`` (and ``tracestate``, baggage) of this span to ``headers``."""
        from opentelemetry import propagate

        propagate.inject(headers, context=self._trace.set_span_in_context(self.span))

    def end(self, usage: Usage | None, status: str) -> None:
        if self._ended:
            return
        self._ended = True
        span = self.span
        if span.is_recording():
            span.set_attribute("ctxwarden.call.status", status)
            if usage is not None:
                span.set_attributes({
                    "gen_ai.usage.input_tokens": usage.input_tokens,
                    "gen_ai.usage.output_tokens": usage.output_tokens,
                    "gen_ai.usage.cache_read.input_tokens": usage.cached_input_tokens,
                    "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
                })  # fmt: skip
            if status not in ("complete", "partial"):
                from opentelemetry.trace import Status, StatusCode

                span.set_attribute("error.type", status)
                span.set_status(Status(StatusCode.ERROR, status))
        span.end()

    def fail(self, exc: BaseException) -> None:
        """End the span with ``exc`` (a call that failed before upstream answered)."""
        if self._ended:
            return
        span = self.span
        if span.is_recording():
            span.record_exception(exc)
            status = getattr(exc, "status", None)
            self.end(None, f"http_{status}" if status else type(exc).__name__)
        else:
            self.end(None, "error")


def call_trace(api: str, model: str, client_headers: Mapping[str, str]) -> CallTrace | None:
    """The span of a proxied call, continuing the client's ``traceparent``; ``None``
    when the process does not trace."""
    trace = _trace()
    if trace is None:
        return None
    from opentelemetry import propagate

    parent = propagate.extract(client_headers)
    provider = _PROVIDERS.get(api, api)
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,
        "gen_ai.request.model": model,
    }
    span = _tracer(trace).start_span(
        f"chat {model}", context=parent, kind=trace.SpanKind.CLIENT, attributes=attributes
    )
    return CallTrace(trace, span)


def trace_headers() -> dict[str, str]:
    """The current span's ``traceparent`` (and ``tracestate``) for work handed to another
    process now (a summary job); empty when the process does not trace."""
    trace = _trace()
    if trace is None:
        return {}
    from opentelemetry import propagate

    out: dict[str, str] = {}
    propagate.inject(out)
    return out


@contextmanager
def continued(carrier: Mapping[str, Any]) -> Iterator[None]:
    """Run the block inside the trace ``carrier`` names (what :func:`trace_headers` gave
    the process that handed the work over); as is when there is none or no tracing."""
    trace = _trace()
    if trace is None or not carrier.get("traceparent"):
        yield
        return
    from opentelemetry import context, propagate

    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)


def configure_from_env(default_service: str = "ctxwarden") -> bool:
    """Install the SDK's tracer provider when the standard variables ask for traces
    (``OTEL_TRACES_EXPORTER``, ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), for ``ctxwarden serve`` and the worker.

    ``OTEL_TRACES_EXPORTER`` is ``otlp`` (the default; ``OTEL_EXPORTER_OTLP_PROTOCOL``
    ``http/protobuf``, the default, or ``grpc``), ``console`` or ``none``; the exporters
    read their own variables (endpoint, headers, timeout), the resource reads
    ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``. A provider already installed
    (``opentelemetry-instrument``) is kept. Returns whether one was installed; a missing
    package is a :class:`ConfigError` naming it."""
    env = os.environ
    names = env.get("OTEL_TRACES_EXPORTER", "").strip()
    asked = names or any(
        env.get(v) for v in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )
    if not asked or names == "none" or env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigError(
            "OTEL_* variables ask for traces but the OpenTelemetry SDK is not installed: "
            "pip install 'ctxwarden[otel]' opentelemetry-sdk opentelemetry-exporter-otlp"
        ) from exc
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return False
    exporters = [_exporter(name.strip()) for name in (names or "otlp").split(",") if name.strip()]
    service = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": default_service}
    provider = TracerProvider(resource=Resource.create(service))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER={name!r}: ctxwarden knows otlp, console, none")
    env = os.environ
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    package = "grpc" if protocol == "grpc" else "http"
    name = f"opentelemetry.exporter.otlp.proto.{package}.trace_exporter"
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        raise ConfigError(
            f"OTLP traces over {protocol} need opentelemetry-exporter-otlp-proto-{package}"
        ) from exc
    return module.OTLPSpanExporter()
