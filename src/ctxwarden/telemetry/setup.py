"""Installing the SDK from the standard ``OTEL_*`` variables, for ``ctxwarden serve`` and
``ctxwarden worker`` (a library user installs their own provider)."""

from __future__ import annotations

import importlib
import os
from typing import Any

from ctxwarden.core.errors import ConfigError

__all__ = ["configure_from_env"]


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
