"""``/ui/``: the session pages in a browser, signed in with a tenant key (R15).

The sign-in form posts the key in its body (never in an address). The answer sets a
cookie signed by the server (:mod:`.ui_cookie`: the tenant and an expiry under an HMAC
with the server's secret, kept in the store), ``HttpOnly`` (no script reads it),
``SameSite=Strict`` (no other site's page sends it) and ``Secure`` behind HTTPS, on
``/ui`` only: it opens these read-only pages and nothing else, the proxy and the
session API still want the key itself. It holds nothing the store holds, so a leaked
database row signs no one in. Every request checks the signature against the tenant's
current key hash, so ``ctxwarden tenant revoke`` signs the browser out at once, in
every replica; a cookie that does not check (forged, expired, signed before a rotation)
is a 401 that clears it. A session of another tenant is a 404, like one that does not
exist.

Pages are rendered by :mod:`ctxwarden.ui` in a worker thread (the store is blocking),
with a Content-Security-Policy that lets them load nothing from anywhere and run no
script but the page's own (a per-response nonce).
"""

from __future__ import annotations

import secrets
from html import escape
from typing import Annotated
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Query
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from ctxwarden.service import ui_cookie
from ctxwarden.service.auth import hub_of
from ctxwarden.service.edge import readable
from ctxwarden.service.hub import Hub
from ctxwarden.service.keys import hash_key
from ctxwarden.store.page_auth import active_key_hash, page_secret
from ctxwarden.store.service_tables import TenantRecord, list_builds, tenant_by_key_hash
from ctxwarden.ui import (
    render_login,
    render_session,
    render_sessions,
    render_turn,
    session_page,
    session_rows,
    turn_view,
)

__all__ = ["COOKIE", "router"]

ROOT = "/ui"
COOKIE = "ctxwarden_ui"
_MAX_FORM = 4096
_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'nonce-{nonce}'; "
    "img-src data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
_HEADERS = {
    "Content-Security-Policy": _CSP.format(nonce="none"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}

router = APIRouter(prefix=ROOT, include_in_schema=False)


def _html(body: str, status: int = 200, *, nonce: str = "none") -> HTMLResponse:
    """A page that may load nothing from anywhere, nor run any script but its own."""
    headers = {**_HEADERS, "Content-Security-Policy": _CSP.format(nonce=nonce)}
    return HTMLResponse(readable(body), status, headers=headers)  # (edge.readable: old rows)


def _not_found(what: str) -> HTMLResponse:
    body = f"<!doctype html><meta charset=utf-8><title>Not found</title><p>{escape(what)}</p>"
    return _html(body, 404)


async def _tenant(request: Request) -> TenantRecord | None:
    """The signed-in tenant, or None without a cookie; a cookie that does not check is
    a 401 (:class:`_BadCookie`)."""
    cookie = request.cookies.get(COOKIE)
    if not cookie:
        return None
    claim = ui_cookie.claimed_tenant(cookie)
    hub = hub_of(request)
    record = await hub.run_aside(_signed_in, hub, claim) if claim is not None else None
    if record is None:
        raise _BadCookie
    return record


def _signed_in(hub: Hub, claim: tuple[str, int, str]) -> TenantRecord | None:
    tenant, expiry, mac = claim
    key_hash = active_key_hash(hub.store, tenant)
    if key_hash is None or not ui_cookie.check(
        page_secret(hub.store), tenant, expiry, mac, key_hash
    ):
        return None
    return tenant_by_key_hash(hub.store, key_hash)


class _BadCookie(Exception):
    """The request's cookie is forged, expired or no longer valid."""


def _signed_out(request: Request) -> Response:
    """401: the sign-in form, the cookie cleared."""
    answer = _html(render_login(ROOT, error="signed out: sign in again"), 401)
    answer.delete_cookie(COOKIE, path=ROOT, httponly=True, samesite="strict")
    return answer


def _to_login() -> Response:
    return RedirectResponse(ROOT + "/", 303, headers=_HEADERS)


def _same_origin(request: Request) -> bool:
    """A form post from a page of this server (no Origin header: an old client, allowed)."""
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host")


@router.get("", include_in_schema=False)
async def root() -> Response:
    return RedirectResponse(ROOT + "/", 307)


@router.get("/")
async def sessions(request: Request) -> Response:
    """The tenant's sessions, or the sign-in form."""
    try:
        tenant = await _tenant(request)
    except _BadCookie:
        return _signed_out(request)
    if tenant is None:
        return _html(render_login(ROOT))
    hub = hub_of(request)
    rows = await hub.run_aside(session_rows, hub.store, tenant.tenant)
    return _html(render_sessions(rows, ROOT, tenant.tenant))


@router.post("/login")
async def login(request: Request) -> Response:
    if not _same_origin(request):
        return _html(render_login(ROOT, error="sign in from this server's own page"), 403)
    body = await request.body()
    fields = parse_qs(body[:_MAX_FORM].decode("utf-8", "replace"))
    key = (fields.get("key") or [""])[0].strip()
    hub = hub_of(request)
    record = await hub.run_aside(tenant_by_key_hash, hub.store, hash_key(key)) if key else None
    if record is None:
        return _html(render_login(ROOT, error="unknown or revoked tenant key"), 401)
    answer = RedirectResponse(ROOT + "/", 303, headers=_HEADERS)
    secret = await hub.run_aside(page_secret, hub.store)
    answer.set_cookie(
        COOKIE,
        ui_cookie.sign(secret, record.tenant, hash_key(key)),
        max_age=ui_cookie.LIFETIME,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=ROOT,
    )
    return answer


@router.post("/logout")
async def logout(request: Request) -> Response:
    answer = _to_login()
    if _same_origin(request):
        answer.delete_cookie(COOKIE, path=ROOT, httponly=True, samesite="strict")
    return answer


def _page(
    hub: Hub, tenant: str, session_id: str, turn: int | None, nonce: str
) -> tuple[str, int] | None:
    """The page and its status: 404 (with the newest turn shown) for a turn not logged."""
    record = hub.store.get_session(tenant, session_id)
    if record is None:
        return None
    page = session_page(hub.store, tenant, record, turn=turn, registry=hub.config.registry)
    status = 404 if page.missing_turn is not None else 200
    return render_session(page, root=ROOT, tenant=tenant, nonce=nonce), status


def _turn(hub: Hub, tenant: str, session_id: str, turn: int) -> str | None:
    if hub.store.get_session(tenant, session_id) is None:
        return None
    builds = list_builds(hub.store, tenant, session_id, limit=2, since_turn=turn - 1)
    at = next((i for i, b in enumerate(builds) if b.turn == turn), None)
    if at is None:
        return None
    previous = builds[at - 1] if at else None
    view = turn_view(hub.store, tenant, builds[at], previous, registry=hub.config.registry)
    return render_turn(view)


@router.get("/sessions/{session_id:path}/turns/{turn}")
async def turn_fragment(session_id: str, turn: int, request: Request) -> Response:
    """One turn's details alone, for the page's script (the page works without it)."""
    try:
        tenant = await _tenant(request)
    except _BadCookie:
        return _signed_out(request)
    if tenant is None:
        return _html("sign in first", 401)
    hub = hub_of(request)
    body = await hub.run_aside(_turn, hub, tenant.tenant, session_id, turn)
    return _not_found(f"no turn {turn} in this session") if body is None else _html(body)


@router.get("/sessions/{session_id:path}")
async def session(
    session_id: str,
    request: Request,
    turn: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    """A session's page: the chart, the selected turn (default the newest), summary, facts."""
    try:
        tenant = await _tenant(request)
    except _BadCookie:
        return _signed_out(request)
    if tenant is None:
        return _to_login()
    hub = hub_of(request)
    nonce = secrets.token_urlsafe(16)
    found = await hub.run_aside(_page, hub, tenant.tenant, session_id, turn, nonce)
    return _not_found("no such session") if found is None else _html(*found, nonce=nonce)
