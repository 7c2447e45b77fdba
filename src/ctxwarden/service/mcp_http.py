"""The MCP server on the service: streamable HTTP at ``/mcp``, tenant key required.

``mount_mcp(app)`` adds the route and runs the SDK's session manager with the app's
lifespan. The server is stateless (a fresh transport per request, JSON answers), so
replicas behind a load balancer need no shared MCP session. Every request must carry a
tenant key (``Authorization: Bearer`` or ``x-api-key``, as on the proxy routes): a
missing, unknown or revoked key is a 401 before the MCP layer sees the request, and each
tool call looks the key up again, so a revoke takes effect at once. A tenant reads only
its own sessions; ``X-Ctxwarden-Session`` is the session hint. The SDK's DNS-rebinding
check (a Host allow-list) is off: it protects servers a browser can reach without
credentials, and this one wants the key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ctxwarden.service.auth import authenticate
from ctxwarden.service.errors import ServiceError, error_body
from ctxwarden.service.hub import Hub
from ctxwarden.service.keys import hash_key
from ctxwarden.store.base import SessionStore
from ctxwarden.store.service_tables import tenant_by_key_hash

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["MCP_PATH", "HubAccess", "mount_mcp"]

MCP_PATH = "/mcp"
T = TypeVar("T")


def _key(headers: Mapping[str, str]) -> str | None:
    scheme, _, value = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    key = (headers.get("x-api-key") or "").strip()
    return key or None


class HubAccess:
    """The service's store, the caller's tenant from its key (see the module)."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app

    @property
    def hub(self) -> Hub:
        hub: Hub = self._app.state.hub
        return hub

    @property
    def store(self) -> SessionStore:
        return self.hub.store

    async def tenant(self, headers: Mapping[str, str] | None) -> str:
        from mcp.server.mcpserver.exceptions import ToolError

        key = _key(headers or {})
        record = None
        if key is not None:
            record = await self.hub.run_aside(tenant_by_key_hash, self.hub.store, hash_key(key))
        if record is None:
            raise ToolError("invalid or revoked API key")
        return record.tenant

    def session(self, headers: Mapping[str, str] | None) -> str | None:
        return (headers or {}).get("x-ctxwarden-session") or None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.hub.run_aside(fn, *args)


class _Endpoint:
    """The route's ASGI app: the key checked, then the SDK's transport (an object, not a
    function, so Starlette hands it the raw request)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await authenticate(Request(scope))
        except ServiceError as exc:
            refused = Response(error_body(exc, "openai"), exc.status, media_type="application/json")
            await refused(scope, receive, send)
            return
        await self.manager.handle_request(scope, receive, send)


def mount_mcp(app: FastAPI) -> None:
    """Serve the MCP tools at ``/mcp`` on ``app`` (see the module); without the ``mcp``
    extra installed there is no such route (a 404 like any unknown path)."""
    try:
        from mcp.server.transport_security import TransportSecuritySettings

        from ctxwarden.mcp.server import build_server
    except ImportError:
        return
    server = build_server(HubAccess(app))
    server.streamable_http_app(  # makes the session manager the route hands requests to
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    manager = server.session_manager
    methods = ["GET", "POST", "DELETE"]
    app.router.routes.append(
        Route(MCP_PATH, _Endpoint(manager), methods=methods, include_in_schema=False)
    )
    outer = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(started: Any) -> AsyncIterator[Any]:
        async with outer(started) as state, manager.run():
            yield state

    app.router.lifespan_context = lifespan
