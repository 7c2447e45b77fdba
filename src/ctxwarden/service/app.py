"""The app factory: ``create_app(config)`` wires the routers, the hub and the upstreams.

Routers per concern: the OpenAI proxy, the Anthropic proxy, the session API, the session
pages (``/ui/``, :mod:`.ui_routes`), and the operational routes here (``/healthz``,
``/readyz``, ``/metrics``, ``/v1/models``).
Errors raised before a response starts become the provider's error shape: Anthropic's
for ``/v1/messages``, OpenAI's everywhere else.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ctxwarden import Registry
from ctxwarden._version import __version__
from ctxwarden.errors import StoreUnavailable
from ctxwarden.service import anthropic_proxy, openai_proxy, sessions_api, ui_routes
from ctxwarden.service.auth import CurrentTenant, hub_of
from ctxwarden.service.config import ServiceConfig
from ctxwarden.service.errors import ServiceError, error_body, from_library
from ctxwarden.service.hub import Hub
from ctxwarden.service.metrics import Metrics
from ctxwarden.service.schema import PROXY_ERRORS
from ctxwarden.service.upstream import Upstream, UpstreamFailure

__all__ = ["create_app"]


class _CountRequests:
    """Counts every response by route template and status (``ctxwarden_requests_total``)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(path, str(status[0])).inc()


def _api_of(request: Request) -> str:
    return "anthropic" if request.url.path.startswith("/v1/messages") else "openai"


def create_app(config: ServiceConfig) -> FastAPI:
    """The ASGI app for ``config`` (the store opens at start-up, in the lifespan)."""
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        hub = await anyio.to_thread.run_sync(Hub, config, metrics)
        upstreams: dict[str, Upstream] = {}
        timeouts = {"timeout": config.upstream_timeout, "connect_timeout": config.connect_timeout}
        if config.upstream:
            upstreams["openai"] = Upstream(
                config.upstream, config.upstream_api_key, "openai", **timeouts
            )
        if config.anthropic_upstream:
            upstreams["anthropic"] = Upstream(
                config.anthropic_upstream, config.anthropic_api_key, "anthropic", **timeouts
            )
        app.state.hub, app.state.upstreams, app.state.started = hub, upstreams, time.time()
        if config.broker:  # summaries as Celery jobs (ctxwarden worker runs them)
            from ctxwarden.service.summary_jobs import SummaryJobs

            hub.summaries = SummaryJobs(hub, config.broker)
        elif config.summarizer:
            from ctxwarden.service.summaries import Summaries

            hub.summaries = Summaries(hub, config.summarizer)
        try:
            yield
        finally:
            if hub.summaries is not None:
                await hub.summaries.aclose()
            for upstream in upstreams.values():
                await upstream.aclose()
            hub.close()

    app = FastAPI(
        title="ctxwarden",
        version=__version__,
        description="Context-managing proxy for OpenAI- and Anthropic-compatible APIs.",
        lifespan=lifespan,
    )
    app.include_router(openai_proxy.router)
    app.include_router(anthropic_proxy.router)
    app.include_router(sessions_api.router)
    app.include_router(ui_routes.router)  # /ui/: the session pages
    app.add_middleware(_CountRequests, metrics=metrics)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> Response:
        if exc.code == "store_unavailable":
            metrics.store_unavailable.inc()
        return Response(
            error_body(exc, _api_of(request)), exc.status, media_type="application/json"
        )

    @app.exception_handler(StoreUnavailable)
    async def store_unavailable(request: Request, exc: StoreUnavailable) -> Response:
        return await service_error(request, from_library(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        )
        return Response(
            error_body(ServiceError(422, detail or "invalid request"), _api_of(request)),
            422,
            media_type="application/json",
        )

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], responses={503: {"description": "The store does not answer"}})
    async def readyz(request: Request) -> Response:
        """The store answers (one short read); 503 when it does not."""
        hub = hub_of(request)
        try:
            await hub.run(hub.store.get_session, "_readyz", "_readyz")
        except Exception as exc:  # any failure means not ready
            return JSONResponse({"status": "unavailable", "error": str(exc)}, 503)
        return JSONResponse({"status": "ready", "upstreams": sorted(request.app.state.upstreams)})

    @app.get("/metrics", tags=["ops"], response_class=Response)
    async def prometheus() -> Response:
        """Prometheus metrics (text format)."""
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/v1/models", tags=["proxy"], responses=PROXY_ERRORS)
    async def models(request: Request, tenant: CurrentTenant) -> Response:
        """The model list in the asking SDK's shape (Anthropic's when the request carries
        ``anthropic-version``, as the anthropic SDK's always does): that upstream's list
        when it answers, else the registry's models."""
        api = "anthropic" if "anthropic-version" in request.headers else "openai"
        upstream = request.app.state.upstreams.get(api)
        if upstream is not None:
            record = tenant.record
            key = record.anthropic_api_key if api == "anthropic" else record.upstream_api_key
            path = "/v1/models" if api == "anthropic" else "/models"
            try:
                got = await upstream.get(path, upstream.headers(key, request.headers))
                if got.status_code == 200:
                    return Response(got.content, 200, media_type="application/json")
            except UpstreamFailure:
                pass
        if api == "anthropic":
            return JSONResponse(_anthropic_models(config.registry))
        return JSONResponse(_registry_models(config.registry))

    return app


def _registry_models(registry: Registry | None) -> dict[str, Any]:
    registry = registry or Registry.default()
    data = [
        {"id": info.name, "object": "model", "created": 0, "owned_by": info.provider}
        for info in registry
    ]
    return {"object": "list", "data": data}


def _anthropic_models(registry: Registry | None) -> dict[str, Any]:
    """The registry's Anthropic models as ``GET /v1/models`` of the Messages API lists them."""
    registry = registry or Registry.default()
    data = [
        {"type": "model", "id": m.name, "display_name": m.name,
         "created_at": "1970-01-01T00:00:00Z"}
        for m in registry
        if m.provider == "anthropic"
    ]  # fmt: skip
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"data": data, "has_more": False, "first_id": first, "last_id": last}
