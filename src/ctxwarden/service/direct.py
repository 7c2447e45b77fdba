"""The two proxied routes served straight from the ASGI call, past the framework's layers.

Every request to the app goes through FastAPI's stack: its middleware (server errors,
the body limit, the request counter, the exception handlers, an async exit stack), the
router's match over every route, and the dependency solver. For ``POST
/v1/chat/completions`` and ``POST /v1/messages``, the two routes every proxied call takes,
those layers cost ~0.4 ms of CPU a call here (about a twentieth of a proxied call) and
add nothing those routes use: their endpoints take the request and the calling tenant,
their errors are :class:`~ctxwarden.service.errors.ServiceError` (or a store that does
not answer), and the counter labels them by their fixed path. :class:`Direct` does just
that: authenticates, calls the endpoint, turns those errors into the same responses
through the app's own handler, and counts the response as the middleware would
(``ctxwarden_requests_total``, by route and status; 500 when the endpoint raised
something else, which then reaches the server as it would through the stack).

The routes stay registered with FastAPI, which publishes them in the OpenAPI schema and
serves whatever :class:`Direct` leaves to it: another method on those paths, another
path, or an app mounted under a root path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ctxwarden.errors import StoreUnavailable
from ctxwarden.service.auth import authenticate
from ctxwarden.service.errors import ServiceError, from_library
from ctxwarden.service.hub import Tenant
from ctxwarden.service.metrics import Metrics

__all__ = ["Direct", "Endpoint", "ErrorResponse"]

Endpoint = Callable[[Request, Tenant], Awaitable[Response]]
"""A proxied route's endpoint: the request and its authenticated tenant."""
ErrorResponse = Callable[[Request, ServiceError], Awaitable[Response]]
"""The app's handler of :class:`ServiceError` (the provider's error shape)."""


class Direct:
    """Serves ``POST`` on each path of ``endpoints`` (see the module docstring)."""

    def __init__(
        self, endpoints: Mapping[str, Endpoint], on_error: ErrorResponse, metrics: Metrics
    ) -> None:
        self._endpoints = dict(endpoints)
        self._on_error = on_error
        self._metrics = metrics

    def endpoint(self, scope: Scope) -> Endpoint | None:
        """The endpoint this request goes to, or ``None``: the app's stack serves it."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        return self._endpoints.get(scope["path"])

    async def __call__(
        self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send
    ) -> None:
        request = Request(scope, receive, send)
        status = 500
        try:
            try:
                response = await endpoint(request, await authenticate(request))
            except ServiceError as exc:
                response = await self._on_error(request, exc)
            except StoreUnavailable as exc:
                response = await self._on_error(request, from_library(exc))
            status = response.status_code
            await response(scope, receive, send)
        finally:
            self._metrics.requests.labels(scope["path"], str(status)).inc()
