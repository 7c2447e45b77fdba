"""The HTTP service (R14): an OpenAI- and Anthropic-compatible proxy, the session API,
tenants and Prometheus metrics. Needs ``pip install 'ctxwarden[server]'``.

``create_app(ServiceConfig(...))`` gives the ASGI app; ``ctxwarden serve`` runs it
under uvicorn. Importing this package does not import FastAPI: ``create_app`` and
``serve`` load it, and say which extra to install when it is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxwarden.errors import MissingDependencyError
from ctxwarden.service.config import ServiceConfig
from ctxwarden.service.tuning import tune_process

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
    options.update(uvicorn)
    app = create_app(config)
    tune_process()
    server.run(app, host=host, port=port, **options)
