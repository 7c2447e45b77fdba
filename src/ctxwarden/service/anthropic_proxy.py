"""``POST /v1/messages``: the Anthropic Messages API proxy (JSON and streamed).

The request is the client's, with ``system`` and ``messages`` replaced by the built
context in Anthropic's shape, ``cache_control`` placed on the build's breakpoints.
Streams pass through whole: ``event:`` lines (the SDK's parser needs them), ``ping``,
thinking and signature deltas, a mid-stream ``event: error``. The stored reply and the
usage come from a parsed copy: input and cache tokens from ``message_start`` merged
with what ``message_delta`` reports.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ctxwarden import Usage
from ctxwarden.core.errors import CtxwardenError
from ctxwarden.core.messages import Message
from ctxwarden.formats import messages_from_anthropic, messages_to_anthropic
from ctxwarden.formats.anthropic import system_from_anthropic, turns_from_anthropic
from ctxwarden.service.anthropic_json import object_bytes, request_json
from ctxwarden.service.auth import CurrentTenant, hub_of
from ctxwarden.service.body import (
    max_input_tokens_header,
    model_and_messages,
    read_body,
    read_chat,
    read_json,
)
from ctxwarden.service.calls import SESSION_HEADER, client_session_id, upstream_for
from ctxwarden.service.errors import ServiceError, from_library
from ctxwarden.service.forward import forward, read_whole
from ctxwarden.service.history import message_key
from ctxwarden.service.prepared import Call, Prepared
from ctxwarden.service.replay import is_retry, request_digest
from ctxwarden.service.schema import ANTHROPIC_BODY, COUNT_BODY, PROXY_ERRORS
from ctxwarden.service.sse import AnthropicReply, parse_frame
from ctxwarden.service.upstream import UpstreamFailure
from ctxwarden.session.recall import recall_tool

__all__ = ["AnthropicWire", "router"]

router = APIRouter()


def anthropic_usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict) or not raw:
        return None
    try:
        return Usage.from_anthropic(
            int(raw.get("input_tokens") or 0),
            int(raw.get("output_tokens") or 0),
            int(raw.get("cache_read_input_tokens") or 0),
            int(raw.get("cache_creation_input_tokens") or 0),
        )
    except (TypeError, ValueError):
        return None


def _reply(content: list[dict[str, Any]], *, partial: bool = False) -> Message | None:
    if not content:
        return None
    parsed = messages_from_anthropic(None, [{"role": "assistant", "content": content}])
    if len(parsed) != 1:
        return None
    reply = parsed[0]
    return replace(reply, meta={**reply.meta, "partial": True}) if partial else reply


class _Reader:
    def __init__(self) -> None:
        self.reply = AnthropicReply()

    @property
    def tokens_seen(self) -> bool:
        return self.reply.tokens_seen

    @property
    def finished(self) -> bool:
        return self.reply.done

    def frame(self, frame: bytes) -> bytes | None:
        _, data = parse_frame(frame)
        if data is not None:
            self.reply.add(data)
        return frame

    def result(self, complete: bool) -> tuple[Message | None, Usage | None, str]:
        done = complete and self.reply.done and self.reply.error is None
        reply = _reply(self.reply.content(complete=done), partial=not done)
        status = "complete" if done else ("upstream_error" if self.reply.error else "partial")
        return reply, anthropic_usage(self.reply.usage), status


def _tools_as_openai(tools: Any) -> list[dict[str, Any]] | None:
    """Anthropic tool definitions in OpenAI's shape, to count them in the budget."""
    if not isinstance(tools, list):
        return None
    return [
        {
            "type": "function",
            "function": {
                "name": t.get("name", ""),
                "description": t.get("description", ""),
                "parameters": t.get("input_schema", {}),
            },
        }
        for t in tools
        if isinstance(t, dict)
    ]


def _place(out: dict[str, Any], system: object, turns: object) -> None:
    """Put the built context in the request ``out``: ``messages``, and ``system`` where
    there is one (else the client's is removed), each in the client's key order."""
    out["messages"] = turns
    if system:
        out["system"] = system
    else:
        out.pop("system", None)


class AnthropicWire:
    api = "anthropic"
    path = "/v1/messages"

    def __init__(self, data: dict[str, Any], nonfinite: bool = True) -> None:
        self.data = data
        self.nonfinite = nonfinite  # the client's body may hold NaN or Infinity

    def body(
        self, prepared: Prepared, extra: tuple[Message, ...] = (), recall: bool = False
    ) -> bytes:
        """The request upstream gets: the client's, with the built context (and the
        recall rounds' ``extra`` messages; the recall tool offered with ``recall``)."""
        built = prepared.built
        context = [*built.messages, *extra]
        breakpoints = built.audit.cache_breakpoints
        out = dict(self.data)
        if recall:
            tools = self.data.get("tools")
            out["tools"] = [*(tools if isinstance(tools, list) else ()), recall_tool("anthropic")]
        written = None if self.nonfinite else request_json(context, breakpoints)
        if written is not None:  # each message's blocks written once, across calls
            _place(out, *written)
            try:
                return object_bytes(out, {k: out[k] for k in ("system", "messages") if k in out})
            except (orjson.JSONEncodeError, TypeError):  # as below
                pass
        _place(out, *messages_to_anthropic(context, cache_breakpoints=breakpoints))
        if not self.nonfinite:  # orjson would write NaN as null: only without any
            try:  # tens of times faster than json for a whole history; the same JSON, compact
                return orjson.dumps(out)
            except (orjson.JSONEncodeError, TypeError):  # a huge int, a non-string key
                pass
        try:
            return json.dumps(out, ensure_ascii=False).encode()
        except UnicodeEncodeError:  # a lone surrogate a session stored before the text rule
            return json.dumps(out).encode()  # (as an escape, as the client sent it)

    def from_json(self, data: Any) -> tuple[Message | None, Usage | None]:
        return _reply(list(data["content"])), anthropic_usage(data.get("usage"))

    def reader(self) -> _Reader:
        return _Reader()


@dataclass(frozen=True)
class _Turns:
    """What the route made of a body's first ``count`` turns, kept with the body's front
    (:mod:`~ctxwarden.service.body_memo`): the turns converted, their keys, and the tool
    names by ``tool_use`` id after them (what converting the next turns needs)."""

    count: int
    messages: tuple[Message, ...]
    keys: tuple[bytes, ...]
    names: Mapping[str, str]


_NO_TURNS = _Turns(0, (), (), {})


@router.post("/v1/messages", responses=PROXY_ERRORS, openapi_extra=ANTHROPIC_BODY)
async def messages(request: Request, tenant: CurrentTenant) -> Response:
    """Build the context from the stored session and forward it (see the module)."""
    hub = hub_of(request)
    upstream = upstream_for(request, "anthropic")
    raw = await read_body(request, hub.config.max_body_bytes)
    scope = ("anthropic", tenant.name, request.headers.get(SESSION_HEADER))
    reading, data = read_chat(hub.bodies, scope, raw)
    model, turns = model_and_messages(data)
    system = data.get("system")
    known = _NO_TURNS
    if reading is not None and isinstance(reading.made, _Turns):
        known = reading.made if reading.made.count == reading.reused else _NO_TURNS
    try:
        head = system_from_anthropic(system if isinstance(system, str | list) else None)
        new, names = turns_from_anthropic(turns, known.count, known.names)
    except (CtxwardenError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, CtxwardenError):
            raise from_library(exc) from exc
        raise ServiceError(400, f"messages are malformed: {exc!r}") from None
    converted = _Turns(
        len(turns),
        (*known.messages, *new),
        (*known.keys, *(message_key(m) for m in new)),
        names,
    )
    if reading is not None:
        hub.bodies.keep(reading, converted)
    parsed = [*head, *converted.messages]
    keys = [*(message_key(m) for m in head), *converted.keys]
    first_user = next((m.text for m in parsed if m.role == "user"), "")
    system_text = next((m.text for m in parsed if m.role == "system"), "")
    call = Call(
        api="anthropic",
        tenant=tenant,
        client_id=client_session_id(request, tenant, system_text, first_user),
        model=model,
        keys=keys,
        parse=lambda start: parsed[start:],
        max_input_tokens=max_input_tokens_header(request),
        tools=_tools_as_openai(data.get("tools")),
        request=request_digest(data),
        retry=is_retry(request.headers),
    )
    stream = bool(data.get("stream"))
    # NaN and Infinity can only come from the client's text: its body, the history it
    # resends (the memo looks only at the text it had not seen before)
    nonfinite = reading.nonfinite if reading is not None else b"NaN" in raw or b"Infinity" in raw
    wire = AnthropicWire(data, nonfinite)
    return await forward(request, hub, upstream, wire, call, stream=stream)


@router.post("/v1/messages/count_tokens", responses=PROXY_ERRORS, openapi_extra=COUNT_BODY)
async def count_tokens(request: Request, tenant: CurrentTenant) -> Response:
    """Anthropic's count of the request as the client sent it — its whole history, not the
    context the proxy would build (that is ``X-Ctxwarden-Input-Tokens`` of each call) —
    from the Anthropic upstream with the server's key. Claude Code asks it often."""
    hub = hub_of(request)
    upstream = upstream_for(request, "anthropic")
    data = await read_json(request, hub.config.max_body_bytes)
    query = f"?{request.url.query}" if request.url.query else ""  # the SDK's ?beta=true
    headers = upstream.headers(tenant.record.anthropic_api_key, request.headers)
    body = json.dumps(data, ensure_ascii=False).encode()
    try:
        response = await upstream.open(f"/v1/messages/count_tokens{query}", body, headers)
    except UpstreamFailure as failure:
        raise ServiceError(failure.status, failure.message) from failure
    raw = await read_whole(upstream, response)
    media = response.headers.get("content-type", "application/json")
    return Response(raw, response.status_code, media_type=media)
