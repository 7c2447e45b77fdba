"""The spans' core: whether this process traces (:func:`tracing`), the decorators that
open a span at an edge with attributes computed only for a recording span, and the
``traceparent`` handed to, and continued by, another process."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

__all__ = ["BUILD_SPAN", "SUMMARIZE_SPAN", "continued", "trace_headers", "traced",
           "traced_async", "tracer", "tracing", "untraced"]  # fmt: skip

T = TypeVar("T")
P = ParamSpec("P")

BUILD_SPAN = "ctxwarden.build"
SUMMARIZE_SPAN = "ctxwarden.summarize"
_UNSET = object()
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ  # the API loads that one
_QUIET: ContextVar[bool] = ContextVar("ctxwarden_untraced", default=False)


def tracing() -> Any:
    """``opentelemetry.trace`` if this process has imported it and installed a tracer
    provider (an SDK), else ``None``: the API's default provider only makes no-op spans,
    and FastAPI imports the API in every server."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None or _QUIET.get():
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


def tracer(trace: Any) -> Any:
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
            trace = tracing()
            if trace is None:
                return fn(*args, **kwargs)
            with tracer(trace).start_as_current_span(name) as span:
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
            trace = tracing()
            if trace is None or _within(trace, name):
                return await fn(*args, **kwargs)
            with tracer(trace).start_as_current_span(name) as span:
                result = await fn(*args, **kwargs)
                if span.is_recording():
                    span.set_attributes(describe(result))
                return result

        return run

    return wrap


def trace_headers() -> dict[str, str]:
    """The current span's ``traceparent`` (and ``tracestate``) for work handed to another
    process now (a summary job); empty when the process does not trace."""
    trace = tracing()
    if trace is None:
        return {}
    from opentelemetry import propagate

    out: dict[str, str] = {}
    propagate.inject(out)
    return out


@contextmanager
def untraced() -> Iterator[None]:
    """Run the block as a process that does not trace (:func:`tracing` is ``None``): work
    no caller asked for, such as the build ``ctxwarden serve`` makes before it listens
    (:mod:`ctxwarden.service.warm`), makes no span in the user's traces."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


@contextmanager
def continued(carrier: Mapping[str, Any]) -> Iterator[None]:
    """Run the block inside the trace ``carrier`` names (what :func:`trace_headers` gave
    the process that handed the work over); as is when there is none or no tracing."""
    trace = tracing()
    if trace is None or not carrier.get("traceparent"):
        yield
        return
    from opentelemetry import context, propagate

    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)
