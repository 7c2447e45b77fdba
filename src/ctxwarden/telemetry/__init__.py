"""OpenTelemetry traces at the edges: the build, the summary cycle and the proxied call.

Spans (the ``otel`` extra installs ``opentelemetry-api``; the SDK and its exporters are
the user's choice):

- ``ctxwarden.build`` around every build (``build_context``, ``Session.build`` /
  ``build_unlogged``), its attributes read off the build's audit: tokens per layer, the
  budget, the fill, the messages dropped, masked, truncated and summarised, the prefix
  kept (:func:`build_attributes`). The build itself stays pure: the span is opened where
  a caller hands the history to :func:`~ctxwarden.pipeline.engine.run_build`, never in a step.
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

from ctxwarden.telemetry.attributes import (
    build_attributes,
    built_attributes,
    layer_update_attributes,
    pending_attributes,
    summary_write_attributes,
)
from ctxwarden.telemetry.proxy import CallTrace, call_trace
from ctxwarden.telemetry.setup import configure_from_env
from ctxwarden.telemetry.spans import (
    BUILD_SPAN,
    SUMMARIZE_SPAN,
    continued,
    trace_headers,
    traced,
    traced_async,
)

__all__ = [
    "BUILD_SPAN",
    "SUMMARIZE_SPAN",
    "CallTrace",
    "build_attributes",
    "built_attributes",
    "call_trace",
    "configure_from_env",
    "continued",
    "layer_update_attributes",
    "pending_attributes",
    "summary_write_attributes",
    "trace_headers",
    "traced",
    "traced_async",
]
