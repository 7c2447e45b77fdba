"""The two proxied routes served straight from the ASGI call, past the framework's layers.

Every request to the app goes through FastAPI's stack: its middleware (server errors,
the body limit, the request counter, the exception handlers, an async exit stack), the
router's match over every route, and the dependency solver. For ``POST
/v1/chat/completions`` and ``POST /v1/messages``, the two routes every proxied call takes,
those layers cost ~0.4 ms of CPU a call here (about a twentieth of a proxied call) and
add nothing those routes use: their endpoints take the request and the calling tenant,
and the counter labels them by their fixed path. :class:`Direct` does just that:
authenticates, calls the endpoint, answers an exception the app has a handler for with
that handler (looked up by the exception's class and its bases, as the stack does), and
counts the response as the middleware would (``ctxwarden_requests_total``, by route and
status; 500 for an exception no handler takes, which then reaches the server as it
would through the stack).

The routes stay registered with FastAPI, which publishes them in the OpenAPI schema and
serves whatever :class:`Direct` leaves to it: another method on those paths, another
path, or an app mounted under a root path.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ctxwarden.service.auth import authenticate
from ctxwarden.service.hub import Tenant
from ctxwarden.service.metrics import Metrics

__all__ = ["Direct", "Endpoint"]

Endpoint = Callable[[Request, Tenant], Awaitable[Response]]
"""A proxied route's endpoint: the request and its authenticated tenant."""


class Direct:
    """Serves ``POST`` on each path of ``endpoints`` (see the module docstring);
    ``handlers`` are the app's exception handlers (its live mapping)."""

    def __init__(
        self, endpoints: Mapping[str, Endpoint], handlers: Mapping[Any, Any], metrics: Metrics
    ) -> None:
        self._endpoints = dict(endpoints)
        self._handlers = handlers
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
        response: Response
        status = 500
        try:
            try:
                response = await endpoint(request, await authenticate(request))
            except Exception as exc:
                handler = self._handler(exc)
                if handler is None:
                    raise
                if inspect.iscoroutinefunction(handler):
                    response = await handler(request, exc)
                else:  # as the stack runs a plain function: in a thread
                    response = await run_in_threadpool(handler, request, exc)
            status = response.status_code
            await response(scope, receive, send)
        finally:
            metrics = self._metrics  # (its own routes: a fixed set of paths)
            metrics.labelled(metrics.requests, scope["path"], str(status)).inc()

    def _handler(self, exc: Exception) -> Callable[[Request, Exception], Any] | None:
        """The app's handler for ``exc``: of its class, else of the nearest base."""
        for cls in type(exc).__mro__:
            if cls in self._handlers:
                handler: Callable[[Request, Exception], Any] = self._handlers[cls]
                return handler
        return None
