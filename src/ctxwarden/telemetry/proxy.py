"""The span of one proxied call, after the GenAI semantic conventions."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ctxwarden.telemetry.spans import tracer, tracing

if TYPE_CHECKING:
    from ctxwarden.core.registry.usage import Usage

__all__ = ["CallTrace", "call_trace"]

# gen_ai.provider.name's well-known values, by the proxy's wire format
_PROVIDERS = {"openai": "openai", "responses": "openai", "anthropic": "anthropic",
              "gemini": "gcp.gemini"}  # fmt: skip


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
        with self._trace.use_span(  # an error is recorded once, by :meth:`fail`
            self.span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            yield

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add ``traceparent`` (and ``tracestate``, baggage) of this span to ``headers``."""
        from opentelemetry import propagate

        propagate.inject(headers, context=self._trace.set_span_in_context(self.span))

    def built(self, tenant: str, session_id: str, build_id: str, sent_tokens: int) -> None:
        """Where to find the call in ctxwarden: its tenant, session and build's audit."""
        if self.span.is_recording():
            self.span.set_attributes({
                "ctxwarden.tenant": tenant,
                "ctxwarden.session.id": session_id,
                "ctxwarden.build.id": build_id,
                "ctxwarden.build.input_tokens": sent_tokens,
            })  # fmt: skip

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
    trace = tracing()
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
    span = tracer(trace).start_span(
        f"chat {model}", context=parent, kind=trace.SpanKind.CLIENT, attributes=attributes
    )
    return CallTrace(trace, span)
