"""``/v1/sessions``: the calling tenant's stored sessions (R14).

Every route is scoped by the tenant the API key names: a session of another tenant is
a 404, exactly like one that does not exist, so ids never leak across tenants. Routes
parse, call :class:`ctxwarden.Session` (the library's API) in a worker thread, and
answer JSON; the OpenAPI schema (``/openapi.json``) describes them.

Bodies are read as the proxy reads its own (:func:`~ctxwarden.service.body.read_json`:
the ``--max-body-mb`` cap, the edge's text and nesting rules), then validated against
the route's model: every refusal is a 400 (413 above the cap) in OpenAI's error shape.
Session ids follow the one grammar (:mod:`ctxwarden.store.ids`): a new one is refused
unless it fits; an id outside it is still read and deleted when the store holds it
(made before the rule), so the id is the rest of the path and may hold ``/``.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from ctxwarden import Session
from ctxwarden.core.errors import CtxwardenError
from ctxwarden.formats import message_to_openai
from ctxwarden.service.auth import CurrentTenant, hub_of
from ctxwarden.service.body import read_json
from ctxwarden.service.edge import readable
from ctxwarden.service.errors import ServiceError, from_library
from ctxwarden.service.hub import Hub, Tenant
from ctxwarden.service.schema import ERRORS
from ctxwarden.store.ids import new_id_problem, readable_id_problem, storable_id_problem
from ctxwarden.store.service_tables import delete_session, list_builds

__all__ = ["router"]

_Body = TypeVar("_Body", bound="BaseModel")

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], responses=ERRORS)


class SessionInfo(BaseModel):
    id: str
    messages: int
    created_at: float
    updated_at: float
    has_summary: bool


class SessionList(BaseModel):
    sessions: list[SessionInfo]


class SessionDetail(SessionInfo):
    summary: str | None
    facts: dict[str, Any]
    ledger: dict[str, Any]
    usage: dict[str, int]
    cost_usd: float


class MessagePage(BaseModel):
    messages: list[dict[str, Any]]
    next_offset: int | None


class AppendBody(BaseModel):
    messages: list[dict[str, Any]] = Field(min_length=1)


class Appended(BaseModel):
    seqs: list[int]


class BuildBody(BaseModel):
    model: str = Field(min_length=1)
    max_input_tokens: int | None = Field(default=None, ge=1)


class BuildResult(BaseModel):
    messages: list[dict[str, Any]]
    audit: dict[str, Any]


class BuildRow(BaseModel):
    build_id: str
    turn: int
    created_at: float
    model: str
    history_tokens: int
    input_tokens: int
    status: str
    audit: dict[str, Any]


class BuildPage(BaseModel):
    builds: list[BuildRow]
    next_offset: int | None


class Recalled(BaseModel):
    handle: str
    seq: int
    message: dict[str, Any]


async def _run(hub: Hub, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a worker thread, its answer readable as UTF-8 (:func:`~.edge.readable`:
    a session stored before the text rule may hold a lone surrogate)."""
    try:
        return readable(await hub.run_aside(fn, *args))
    except CtxwardenError as exc:
        raise from_library(exc) from exc


def _existing(hub: Hub, tenant: Tenant, session_id: str) -> Session:
    if hub.store.get_session(tenant.name, session_id) is None:
        problem = readable_id_problem(session_id)  # (not stored: say why it never could be)
        raise ServiceError(400 if problem else 404, problem or f"no session {session_id!r}")
    return hub.session(tenant.name, session_id)


def _storable(session_id: str) -> str:
    """400 for an id the store could never hold (NUL, a lone surrogate, too long)."""
    problem = storable_id_problem(session_id)
    if problem is not None:
        raise ServiceError(400, problem, code="invalid_session_id", param="session_id")
    return session_id


def _new(hub: Hub, tenant: Tenant, session_id: str) -> str:
    """An id a write may use: the grammar's, or one the store already holds."""
    _storable(session_id)
    problem = new_id_problem(session_id)
    if problem is not None and hub.store.get_session(tenant.name, session_id) is None:
        raise ServiceError(400, problem, code="invalid_session_id", param="session_id")
    return session_id


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The route's body in the OpenAPI schema (the route reads it itself, see the module)."""
    schema = {"schema": model.model_json_schema()}
    return {"requestBody": {"required": True, "content": {"application/json": schema}}}


async def _body(request: Request, hub: Hub, model: type[_Body]) -> _Body:
    """The request's body as ``model``: 413 above the cap, 400 for anything else wrong."""
    data = await read_json(request, hub.config.max_body_bytes)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e.get('msg')}"
            for e in exc.errors()
        )
        raise ServiceError(400, detail, code="invalid_request") from None


def _info(record: Any) -> dict[str, Any]:
    return {
        "id": record.session_id,
        "messages": record.next_seq,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "has_summary": record.summary is not None,
    }


@router.get("", response_model=SessionList)
async def list_all(request: Request, tenant: CurrentTenant) -> Any:
    hub = hub_of(request)
    records = await _run(hub, hub.store.list_sessions, tenant.name)
    return {"sessions": [_info(r) for r in records]}


@router.get("/{session_id:path}/messages", response_model=MessagePage)
async def messages(
    session_id: str,
    request: Request,
    tenant: CurrentTenant,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
    meta: Annotated[
        bool, Query(description="Add our metadata (id, partial) as ctxwarden.")
    ] = False,
) -> Any:
    """The stored messages, oldest first, as OpenAI chat dicts (system prompt included)."""
    hub = hub_of(request)

    def page() -> dict[str, Any]:
        session = _existing(hub, tenant, session_id)
        rows = hub.store.range(tenant.name, session_id, offset, offset + limit)
        total = session.record.next_seq
        nxt = offset + limit if offset + limit < total else None
        out = [message_to_openai(r.message, with_meta=meta) for r in rows]
        return {"messages": out, "next_offset": nxt}

    return await _run(hub, page)


@router.post(
    "/{session_id:path}/messages", response_model=Appended, openapi_extra=_body_schema(AppendBody)
)
async def append(session_id: str, request: Request, tenant: CurrentTenant) -> Any:
    """Append messages (creating the session when new); all or nothing."""
    hub = hub_of(request)
    body = await _body(request, hub, AppendBody)
    await _run(hub, _new, hub, tenant, session_id)
    async with hub.locked(tenant.name, session_id):
        seqs = await _run(hub, lambda: hub.session(tenant.name, session_id).append(body.messages))
    return {"seqs": seqs}


@router.post(
    "/{session_id:path}/build", response_model=BuildResult, openapi_extra=_body_schema(BuildBody)
)
async def build(session_id: str, request: Request, tenant: CurrentTenant) -> Any:
    """Build the context from the store as the proxy would (nothing is forwarded)."""
    hub = hub_of(request)
    body = await _body(request, hub, BuildBody)
    _storable(session_id)
    caps = [b for b in (body.max_input_tokens, tenant.record.max_input_tokens) if b]
    budget = min(caps) if caps else None

    def run() -> dict[str, Any]:
        session = _existing(hub, tenant, session_id)
        built = session.build(
            model=body.model,
            policy=tenant.policy,
            max_input_tokens=budget,
            summarizer=hub.config.summarizer,  # laid out as the proxy lays it out
        )
        return {"messages": built.to_openai(), "audit": built.audit.to_dict()}

    async with hub.locked(tenant.name, session_id):
        return await _run(hub, run)


@router.get("/{session_id:path}/builds", response_model=BuildPage)
async def builds(
    session_id: str,
    request: Request,
    tenant: CurrentTenant,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> Any:
    """Each logged build's audit, oldest first: the proxy's (``forwarded`` until the call
    ends) and every other ``Session.build`` of the session (``built``), the newest ones."""
    hub = hub_of(request)

    def page() -> dict[str, Any]:
        _existing(hub, tenant, session_id)
        rows = list_builds(hub.store, tenant.name, session_id, limit=limit + 1, offset=offset)
        more = len(rows) > limit
        return {
            "builds": [
                {k: v for k, v in vars(r).items() if k != "session_id"} for r in rows[:limit]
            ],
            "next_offset": offset + limit if more else None,
        }

    return await _run(hub, page)


@router.get("/{session_id:path}/recall/{handle}", response_model=Recalled)
async def recall(session_id: str, handle: str, request: Request, tenant: CurrentTenant) -> Any:
    """The original of a stored message by its handle: ``cw:msg:<id>`` as the context
    shows it, ``m<seq>`` (the id the store gives a message without one of its own) or
    the bare sequence number; the recall is audited (a ``recalled`` row of ``/builds``)."""
    from ctxwarden.core.errors import UnknownHandleError
    from ctxwarden.session.recall import audit_recall, find_stored, recalled

    hub = hub_of(request)
    full = handle if handle.startswith("cw:msg:") else f"cw:msg:m{handle.removeprefix('m')}"

    def find() -> dict[str, Any]:
        _existing(hub, tenant, session_id)
        try:
            seq, message = find_stored(hub.store, tenant.name, session_id, full)
        except UnknownHandleError as exc:
            raise ServiceError(404, str(exc)) from None
        found = recalled(message, "gpt-4o", seq)  # its tokens, for the audit row
        audit_recall(hub.store, tenant.name, session_id, found)
        return {"handle": handle, "seq": seq, "message": message_to_openai(message)}

    return await _run(hub, find)


@router.get("/{session_id:path}", response_model=SessionDetail)  # (after the longer paths)
async def show(session_id: str, request: Request, tenant: CurrentTenant) -> Any:
    hub = hub_of(request)

    def detail() -> dict[str, Any]:
        session = _existing(hub, tenant, session_id)
        record = session.record
        usage = record.total_usage
        return {
            **_info(record),
            "summary": record.summary,
            "facts": dict(record.facts),
            "ledger": {"upto": session.ledger.upto, "entries": session.ledger.ledger.to_dict()},
            "usage": {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cached_input_tokens": usage.cached_input_tokens,
                "cache_write_tokens": usage.cache_write_tokens,
                "calls": usage.calls,
            },
            "cost_usd": record.dollars,
        }

    return await _run(hub, detail)


@router.delete("/{session_id:path}", status_code=204, response_class=Response)
async def delete(session_id: str, request: Request, tenant: CurrentTenant) -> Response:
    """Delete the session with its messages, ledger and builds."""
    hub = hub_of(request)
    _storable(session_id)
    async with hub.locked(tenant.name, session_id):
        found = await _run(hub, delete_session, hub.store, tenant.name, session_id)
    if not found:
        problem = readable_id_problem(session_id)
        raise ServiceError(400 if problem else 404, problem or f"no session {session_id!r}")
    hub.forget(tenant.name, session_id)
    return Response(status_code=204)
