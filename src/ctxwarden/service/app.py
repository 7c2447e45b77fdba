"""The app factory: ``create_app(config)`` wires the routers, the hub and the upstreams.

Routers per concern: the OpenAI proxy, the Anthropic proxy, the session API, the session
pages (``/ui/``, :mod:`.ui_routes`), and the operational routes here (``/healthz``,
``/readyz``, ``/metrics``, ``/v1/models``).
Errors raised before a response starts become the provider's error shape: Anthropic's
for ``/v1/messages``, Gemini's for its routes (``/v1beta/``), OpenAI's everywhere else.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import anyio.to_thread
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ctxwarden import Registry
from ctxwarden._version import __version__
from ctxwarden.core.errors import StoreUnavailable
from ctxwarden.service import (
    anthropic_proxy,
    gemini_proxy,
    openai_proxy,
    responses_proxy,
    sessions_api,
    ui_routes,
)
from ctxwarden.service.auth import CurrentTenant, hub_of
from ctxwarden.service.config import ServiceConfig
from ctxwarden.service.direct import Direct, Endpoint
from ctxwarden.service.errors import ServiceError, error_body, from_library
from ctxwarden.service.failures import Failures, api_of, install
from ctxwarden.service.hub import Hub, Tenant
from ctxwarden.service.mcp_http import mount_mcp
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
    """Whose shape the answer takes (:func:`~ctxwarden.service.failures.api_of`)."""
    return api_of(request.scope)


class _App(FastAPI):
    """FastAPI, with the proxied routes served by :class:`~ctxwarden.service.direct.Direct`
    (past the framework's layers) once :attr:`direct` is set."""

    direct: Direct | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await Failures(self._serve)(scope, receive, send)  # (every failure answered as JSON)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        direct = self.direct
        endpoint = direct.endpoint(scope) if direct is not None else None
        if direct is None or endpoint is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self  # as Starlette sets it: the endpoints read the hub from the app
        await direct(endpoint, scope, receive, send)


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
        if config.gemini_upstream:
            upstreams["gemini"] = Upstream(
                config.gemini_upstream, config.gemini_api_key, "gemini", **timeouts
            )
        app.state.hub, app.state.upstreams, app.state.started = hub, upstreams, time.time()
        if config.broker:  # summaries as Celery jobs (ctxwarden worker runs them)
            from ctxwarden.service.summary_jobs import SummaryJobs

            hub.summaries = SummaryJobs(hub, config.broker)
            hub.embeddings.use_broker(hub.summaries.settings)
        elif config.summarizer:
            from ctxwarden.service.summary_runs import Summaries

            hub.summaries = Summaries(hub, config.summarizer)
        try:
            yield
        finally:
            if hub.summaries is not None:
                await hub.summaries.aclose()
            await hub.embeddings.aclose()
            for upstream in upstreams.values():
                await upstream.aclose()
            hub.close()

    app = _App(
        title="ctxwarden",
        version=__version__,
        description="Context-managing proxy for OpenAI- and Anthropic-compatible APIs.",
        lifespan=lifespan,
    )
    app.include_router(openai_proxy.router)
    app.include_router(anthropic_proxy.router)
    app.include_router(responses_proxy.router)
    app.include_router(gemini_proxy.router)  # /v1beta/models/{model}:generateContent...
    app.include_router(sessions_api.router)
    app.include_router(ui_routes.router)  # /ui/: the session pages
    mount_mcp(app)  # /mcp: recall and search over MCP (ctxwarden.service.mcp_http)
    app.add_middleware(_CountRequests, metrics=metrics)
    install(app)  # what no route expected: a JSON error too (failures.py)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> Response:
        if exc.code == "store_unavailable":
            metrics.store_unavailable.inc()
        return Response(
            error_body(exc, _api_of(request)), exc.status, media_type="application/json"
        )

    proxied: dict[str, Endpoint] = {
        "/v1/chat/completions": openai_proxy.chat_completions,
        "/v1/messages": anthropic_proxy.messages,
        "/v1/responses": responses_proxy.responses,
    }
    app.direct = Direct(proxied, app.exception_handlers, metrics)

    @app.exception_handler(StoreUnavailable)
    async def store_unavailable(request: Request, exc: StoreUnavailable) -> Response:
        return await service_error(request, from_library(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """A route the app does not have (404) or a method it does not take (405), in
        the provider's error shape like every other refusal (the SDKs read ``error``)."""
        return Response(
            error_body(ServiceError(exc.status_code, str(exc.detail)), _api_of(request)),
            exc.status_code,
            headers=exc.headers,
            media_type="application/json",
        )

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
        api = _api_of(request)
        found = await _upstream_models(request, tenant, api, "")
        if found is not None:
            return found
        if api == "anthropic":
            return JSONResponse(_anthropic_models(config.registry))
        return JSONResponse(_registry_models(config.registry))

    @app.get("/v1/models/{model_id:path}", tags=["proxy"], responses=PROXY_ERRORS)
    async def model(model_id: str, request: Request, tenant: CurrentTenant) -> Response:
        """One model (``client.models.retrieve``) in the asking SDK's shape: the
        upstream's answer when it has the model, else the registry's entry; 404 in the
        provider's error shape when neither knows it. Ids may hold ``/`` (OpenRouter's
        ``openai/gpt-4o``)."""
        api = _api_of(request)
        found = None
        if _forwardable(model_id):
            found = await _upstream_models(request, tenant, api, "/" + quote(model_id, safe="/"))
        if found is not None:
            return found
        entry = _model_entry(config.registry, model_id, api)
        if entry is not None:
            return JSONResponse(entry)
        error = ServiceError(404, f"model {model_id!r} is not known", code="model_not_found")
        return Response(error_body(error, api), 404, media_type="application/json")

    return app


def _forwardable(model_id: str) -> bool:
    """Whether ``model_id`` may go into the upstream's URL: no empty, ``.`` or ``..``
    segment, which would reach another of the upstream's routes with the server's key."""
    return all(part not in ("", ".", "..") for part in model_id.split("/"))


async def _upstream_models(
    request: Request, tenant: Tenant, api: str, suffix: str
) -> Response | None:
    """The ``api`` upstream's answer to its models route plus ``suffix`` when it answers
    200; None when there is no such upstream or it does not (the registry answers)."""
    upstream = request.app.state.upstreams.get(api)
    if upstream is None:
        return None
    record = tenant.record
    key = record.anthropic_api_key if api == "anthropic" else record.upstream_api_key
    path = ("/v1/models" if api == "anthropic" else "/models") + suffix
    try:
        got = await upstream.get(path, upstream.headers(key, request.headers))
    except UpstreamFailure:
        return None
    if got.status_code != 200:
        return None
    return Response(got.content, 200, media_type="application/json")


def _model_entry(registry: Registry | None, model_id: str, api: str) -> dict[str, Any] | None:
    """The registry's entry for ``model_id`` in the ``api``'s model shape, or None."""
    if api == "anthropic":
        listed = _anthropic_models(registry)["data"]
    else:
        listed = _registry_models(registry)["data"]
    return next((m for m in listed if m["id"] == model_id), None)


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
