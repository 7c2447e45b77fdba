"""Who is calling: the tenant whose API key the request carries, as a dependency.

The key is read from ``Authorization: Bearer <key>`` (the openai SDK), ``x-api-key``
(the anthropic SDK) or ``x-goog-api-key`` (google-genai; on the Gemini routes, also the
``?key=`` query parameter, as Google's REST examples send it), hashed, and looked up
among the active tenants on every request, so ``ctxwarden tenant revoke`` takes effect
at once, in every server process. A missing, unknown or revoked key is a 401 in the
provider's error shape.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import Request

from ctxwarden.service.errors import ServiceError
from ctxwarden.service.hub import Hub, Tenant
from ctxwarden.service.keys import hash_key
from ctxwarden.store.service_tables import tenant_by_key_hash

__all__ = ["CurrentTenant", "authenticate", "hub_of", "is_gemini_path"]


def is_gemini_path(path: str, method: str) -> bool:
    """A Gemini API route: ``/v1beta/...``, or ``POST /v1/models/MODEL:METHOD`` (google-genai
    calls the ``v1`` API unless told ``api_version="v1beta"``). ``GET /v1/models/ID`` is the
    OpenAI (or Anthropic) model lookup, whatever the id holds: an Ollama model's has a colon
    (``llama3.1:8b``), and its 404 takes that route's shape, not Gemini's."""
    if path.startswith("/v1beta/"):
        return True
    return method == "POST" and path.startswith("/v1/models/") and ":" in path.rsplit("/", 1)[-1]


def hub_of(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


def _key(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = request.headers.get("x-api-key") or request.headers.get("x-goog-api-key")
    if not (key and key.strip()) and is_gemini_path(request.url.path, request.method):
        key = request.query_params.get("key")
    return key.strip() if key and key.strip() else None


async def authenticate(request: Request) -> Tenant:
    """The calling tenant, or a 401."""
    key = _key(request)
    if key is None:
        raise ServiceError(
            401, "missing API key: send your ctxwarden tenant key as Authorization: Bearer KEY"
        )
    hub = hub_of(request)
    record = await hub.run(tenant_by_key_hash, hub.store, hash_key(key))
    if record is None:
        raise ServiceError(401, "invalid or revoked API key")
    return hub.tenant(record)


CurrentTenant = Annotated[Tenant, Depends(authenticate)]
"""A route parameter for the calling tenant (a 401 before the route runs otherwise)."""
