"""The HTTP service (R14): an OpenAI- and Anthropic-compatible proxy, the session API,
tenants and Prometheus metrics. Needs ``pip install 'ctxwarden[server]'``.

``create_app(ServiceConfig(...))`` gives the ASGI app; ``ctxwarden serve`` runs it
under uvicorn. Importing this package does not import FastAPI: ``create_app`` and
``serve`` load it, and say which extra to install when it is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxwarden.core.errors import MissingDependencyError
from ctxwarden.service.config import ServiceConfig

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["ServiceConfig", "create_app", "serve"]


def create_app(config: ServiceConfig) -> FastAPI:
    try:
        from ctxwarden.service.app import create_app as factory
    except ImportError as exc:
        raise MissingDependencyError("ctxwarden serve", "server") from exc
    return factory(config)


def serve(
    config: ServiceConfig, *, host: str = "127.0.0.1", port: int = 8400, **uvicorn: Any
) -> None:
    """Run the app under uvicorn in this process (one worker)."""
    try:
        import uvicorn as server
    except ImportError as exc:
        raise MissingDependencyError("ctxwarden serve", "server") from exc
    # keep-alive well above clients' pool expiry (httpx: 5 s, as uvicorn's default): a
    # server closing an idle connection just as a client reuses it is a connection error
    options: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "timeout_keep_alive": 75,
    }
    options["http"] = _http_protocol(config)
    options.update(uvicorn)
    app = create_app(config)
    from ctxwarden.service.warm import warm_up

    warm_up()  # the first call finds the encoding loaded (~0.3 s of its latency otherwise)
    _tune_gc()
    server.run(app, host=host, port=port, **options)


def _http_protocol(config: ServiceConfig) -> Any:
    """uvicorn's httptools protocol with the request-head limits
    (:mod:`ctxwarden.service.http_limits`); h11, which caps a head's size itself, where
    httptools is not installed."""
    try:
        from ctxwarden.service.http_limits import HeadLimits, protocol
    except ImportError:  # pragma: no cover (uvicorn without httptools)
        return "h11"
    limits = HeadLimits(config.max_head_bytes, config.max_headers, config.head_timeout)
    return protocol(limits)


def _tune_gc() -> None:
    """This process is the server's own: a build makes and drops thousands of small
    objects, so the youngest generation is collected every ~50,000 net allocations
    instead of 700 (most of a build's containers die by reference count before), and
    what startup made (modules, the app, the schemas) is frozen out of full collections,
    which otherwise walk it every few hundred calls. At 64 concurrent calls, whose parsed
    bodies are all young, collecting every 10,000 cost ~0.15 ms of each call's CPU and
    every 50,000 ~0.02 ms. Collection still runs; only its rhythm changes, so nothing
    any call stores or returns does."""
    import gc

    first, *rest = gc.get_threshold()
    gc.set_threshold(max(first, 50_000), *rest)
    gc.collect()
    gc.freeze()
