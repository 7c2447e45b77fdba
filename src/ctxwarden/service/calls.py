"""What the proxy routes ask of a request: its session id, its upstream, the tenant's caps
and upstream keys."""

from __future__ import annotations

from starlette.requests import Request

from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.service.errors import ServiceError
from ctxwarden.service.history import derived_session_id, valid_session_id
from ctxwarden.service.hub import Tenant
from ctxwarden.service.upstream import Upstream
from ctxwarden.store.service_tables import TenantRecord

__all__ = ["check_spend", "client_session_id", "tenant_key", "upstream_for"]

SESSION_HEADER = "x-ctxwarden-session"


def client_session_id(request: Request, tenant: Tenant, system: str, first_user: str) -> str:
    """``X-Ctxwarden-Session``, else an id derived from the tenant, the system prompt and
    the first user message (so a client that never names its sessions still gets one
    per conversation)."""
    given = request.headers.get(SESSION_HEADER)
    if given is None:
        return derived_session_id(tenant.name, system, first_user)
    try:
        return valid_session_id(given)
    except InvalidMessageError as exc:
        raise ServiceError(
            400, str(exc), code="invalid_session_id", param="x-ctxwarden-session"
        ) from None


def upstream_for(request: Request, api: str) -> Upstream:
    found: Upstream | None = request.app.state.upstreams.get(api)
    if found is None:
        flag = {"anthropic": "--anthropic-upstream", "gemini": "--gemini-upstream"}.get(
            api, "--upstream"
        )
        raise ServiceError(404, f"this server has no {api} upstream (start it with {flag} URL)")
    return found


def tenant_key(record: TenantRecord, api: str) -> str | None:
    """The tenant's own upstream key for ``api`` (``None``: the server's is used)."""
    if api == "anthropic":
        return record.anthropic_api_key
    if api == "gemini":
        return record.gemini_api_key
    return record.upstream_api_key


def check_spend(tenant: Tenant) -> None:
    """429 once the tenant's recorded spend reached its cap (prices from the registry)."""
    record = tenant.record
    cap = record.spend_cap_usd
    if cap is not None and record.spent_usd >= cap:
        raise ServiceError(
            429,
            f"tenant {record.tenant!r} reached its spend cap: ${record.spent_usd:.4f} of "
            f"${cap:.4f}; the operator can raise it with `ctxwarden tenant caps`",
            code="spend_cap_reached",
            spent_usd=round(record.spent_usd, 6),
            spend_cap_usd=cap,
        )
