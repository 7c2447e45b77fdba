"""``POST /v1beta/models/{model}:{method}`` (and ``/v1/...``): the Gemini API proxy.

``generateContent`` (JSON) and ``streamGenerateContent?alt=sse`` (streamed) build the
context like the other routes (:func:`~ctxwarden.service.forward.forward`: the same
sync, build, audit and store) and send the client's request with ``contents`` and
``systemInstruction`` replaced by the built context
(:func:`~ctxwarden.formats.gemini.messages_to_gemini`). Streams pass through byte for
byte; a parsed copy of each ``data:`` frame gives the stored reply (its parts joined
as one turn, :func:`~ctxwarden.formats.gemini.merge_streamed_parts`) and the usage
(``usageMetadata``, the last frame's). ``countTokens`` is Gemini's count of the request
as sent, forwarded with the server's key; nothing is stored.

The tenant key comes in ``x-goog-api-key`` (google-genai) or ``?key=``
(:mod:`~ctxwarden.service.auth`); it is never forwarded: upstream gets the tenant's own
Gemini key (``tenant add --gemini-key``), else ``CTXWARDEN_GEMINI_API_KEY``. Errors are
in Gemini's shape, ``{"error": {"code", "message", "status"}}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Any
from urllib.parse import urlencode

import orjson
from fastapi import APIRouter, Path
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response

from ctxwarden import Usage
from ctxwarden.core.errors import CtxwardenError
from ctxwarden.core.messages import Message
from ctxwarden.formats.gemini import (
    contents_from_gemini,
    merge_streamed_parts,
    messages_to_gemini,
    reply_from_gemini,
    system_from_gemini,
)
from ctxwarden.service.auth import CurrentTenant, hub_of
from ctxwarden.service.body import max_input_tokens_header, parse_json, read_body
from ctxwarden.service.calls import client_session_id, tenant_key, upstream_for
from ctxwarden.service.errors import ServiceError, from_library
from ctxwarden.service.forward import forward, read_whole
from ctxwarden.service.gemini_schema import GEMINI_BODY, GEMINI_ERRORS
from ctxwarden.service.history import message_key
from ctxwarden.service.hub import Tenant
from ctxwarden.service.prepared import Call, Prepared
from ctxwarden.service.sse import parse_frame
from ctxwarden.service.upstream import UpstreamFailure
from ctxwarden.session.recall import recall_tool

__all__ = ["GeminiWire", "gemini_usage", "router"]

router = APIRouter()

_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class _Target(Convertor[str]):
    """``MODEL:METHOD`` in a route's path: only such a segment matches, so another path
    under ``/v1/models/`` (a model id the OpenAI route looks up) is not taken for this
    route's (a near miss would be a 405 instead of that route's 404)."""

    regex = r"[A-Za-z0-9][A-Za-z0-9._-]*:[A-Za-z]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("gemini_target", _Target())
_TargetParam = Annotated[
    str, Path(pattern=f"^{_Target.regex}$", examples=["gemini-2.5-flash:generateContent"])
]


_SYSTEM_KEYS = ("systemInstruction", "system_instruction")


def gemini_usage(raw: Any) -> Usage | None:
    """``usageMetadata`` as a :class:`Usage`: ``promptTokenCount`` includes the cached
    content's tokens (``cachedContentTokenCount``); output is the candidates' tokens
    plus the thinking tokens (billed as output)."""
    if not isinstance(raw, Mapping) or not raw:
        return None
    try:
        prompt = int(raw.get("promptTokenCount") or 0) + int(
            raw.get("toolUsePromptTokenCount") or 0
        )
        output = int(raw.get("candidatesTokenCount") or 0) + int(raw.get("thoughtsTokenCount") or 0)
        cached = int(raw.get("cachedContentTokenCount") or 0)
    except (TypeError, ValueError):
        return None
    return Usage.from_openai(prompt, output, cached)


def _candidate_content(data: Mapping[str, Any]) -> Any:
    candidates = data.get("candidates")
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], Mapping):
        return candidates[0].get("content"), candidates[0].get("finishReason")
    return None, None


class _Reader:
    """A streamed reply's frames: parts gathered, the last ``usageMetadata`` kept, done
    once a candidate names its ``finishReason``."""

    def __init__(self, turn: int) -> None:
        self.turn = turn
        self.parts: list[Mapping[str, Any]] = []
        self.usage: Any = None
        self.error: Any = None
        self.done = False
        self.tokens_seen = False

    @property
    def finished(self) -> bool:
        return self.done

    def frame(self, frame: bytes) -> bytes | None:
        _, data = parse_frame(frame)
        if data is None:
            return frame
        try:
            chunk = json.loads(data)
        except ValueError:
            return frame
        if not isinstance(chunk, dict):
            return frame
        if "error" in chunk:
            self.error = chunk["error"]
            return frame
        content, finish = _candidate_content(chunk)
        parts = content.get("parts") if isinstance(content, Mapping) else None
        if isinstance(parts, list):
            self.parts.extend(p for p in parts if isinstance(p, Mapping))
            self.tokens_seen = self.tokens_seen or bool(parts)
        if chunk.get("usageMetadata"):
            self.usage = chunk["usageMetadata"]
        if finish:
            self.done = True
        return frame

    def result(self, complete: bool) -> tuple[Message | None, Usage | None, str]:
        done = complete and self.done and self.error is None
        reply = None
        if self.parts:
            try:
                turn = {"role": "model", "parts": merge_streamed_parts(self.parts)}
                reply = reply_from_gemini(turn, self.turn)
            except CtxwardenError:
                reply = None
        if reply is not None and not done:
            reply = replace(reply, meta={**reply.meta, "partial": True})
        status = "complete" if done else ("upstream_error" if self.error else "partial")
        return reply, gemini_usage(self.usage), status


def _tools_as_openai(tools: Any) -> list[dict[str, Any]] | None:
    """Gemini tool definitions in OpenAI's shape, to count them in the budget: each
    function declaration, and each other tool (``googleSearch``, ``codeExecution``) by
    its key."""
    if not isinstance(tools, list):
        return None
    out: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        for key, value in tool.items():
            if key in ("functionDeclarations", "function_declarations") and isinstance(value, list):
                for fn in value:
                    if isinstance(fn, Mapping):
                        params = fn.get("parameters", fn.get("parametersJsonSchema", {}))
                        function = {
                            "name": fn.get("name", ""),
                            "description": fn.get("description", ""),
                            "parameters": params,
                        }
                        out.append({"type": "function", "function": function})
            else:
                out.append({"type": "function", "function": {"name": key, "parameters": value}})
    return out


def _recall_declaration() -> dict[str, Any]:
    fn = recall_tool("openai")["function"]
    return {"functionDeclarations": [fn]}


class GeminiWire:
    """The Gemini request of one call: its body upstream, its reply read back."""

    api = "gemini"

    def __init__(self, data: dict[str, Any], path: str, turns: int, system_key: str) -> None:
        self.data = data
        self.path = path
        self.turns = turns  # the reply is turn number `turns` of the next request
        self.system_key = system_key

    def body(
        self, prepared: Prepared, extra: tuple[Message, ...] = (), recall: bool = False
    ) -> bytes:
        """The client's request with the built context (and the recall rounds' ``extra``
        messages; the recall tool declared with ``recall``)."""
        system, contents = messages_to_gemini([*prepared.built.messages, *extra])
        out = dict(self.data)
        out["contents"] = contents
        for key in _SYSTEM_KEYS:
            out.pop(key, None)
        if system is not None:
            out[self.system_key] = system
        if recall:
            tools = self.data.get("tools")
            out["tools"] = [*(tools if isinstance(tools, list) else ()), _recall_declaration()]
        try:
            return orjson.dumps(out)
        except (orjson.JSONEncodeError, TypeError):  # NaN, a huge int: the stdlib writes them
            return json.dumps(out, ensure_ascii=False).encode()

    def from_json(self, data: Any) -> tuple[Message | None, Usage | None]:
        content, _ = _candidate_content(data)
        reply = reply_from_gemini(content, self.turns) if content is not None else None
        return reply, gemini_usage(data.get("usageMetadata"))

    def reader(self) -> _Reader:
        return _Reader(self.turns)


def _upstream_query(request: Request) -> str:
    """The client's query without its ``key`` (the tenant key is never forwarded)."""
    kept = [(k, v) for k, v in request.query_params.multi_items() if k != "key"]
    return f"?{urlencode(kept)}" if kept else ""


@router.post(
    "/v1beta/models/{target:gemini_target}", responses=GEMINI_ERRORS, openapi_extra=GEMINI_BODY
)
async def models_call(target: _TargetParam, request: Request, tenant: CurrentTenant) -> Response:
    """``generateContent``, ``streamGenerateContent`` or ``countTokens`` of ``model``
    (``target`` is ``MODEL:METHOD``; see the module)."""
    return await _models_call("v1beta", target, request, tenant)


@router.post(
    "/v1/models/{target:gemini_target}", responses=GEMINI_ERRORS, openapi_extra=GEMINI_BODY
)
async def models_call_v1(target: _TargetParam, request: Request, tenant: CurrentTenant) -> Response:
    """The same on the ``v1`` API (google-genai's default), forwarded to ``v1``."""
    return await _models_call("v1", target, request, tenant)


async def _models_call(version: str, target: str, request: Request, tenant: Tenant) -> Response:
    model, _, method = target.rpartition(":")
    if method not in ("generateContent", "streamGenerateContent", "countTokens"):
        raise ServiceError(404, f"unknown method {method!r}: this proxy serves generateContent, "
                           "streamGenerateContent and countTokens")  # fmt: skip
    if not _MODEL.match(model):
        raise ServiceError(400, f"invalid model name {model!r}")
    hub = hub_of(request)
    upstream = upstream_for(request, "gemini")
    raw = await read_body(request, hub.config.max_body_bytes)
    data = parse_json(raw)
    query = _upstream_query(request)
    path = f"/{version}/models/{model}:{method}{query}"
    if method == "countTokens":
        return await _count_tokens(request, tenant, upstream, path, raw)
    stream = method == "streamGenerateContent"
    if stream and request.query_params.get("alt") != "sse":
        raise ServiceError(400, "streamGenerateContent is proxied with alt=sse only")
    contents = data.get("contents")
    if not isinstance(contents, list) or not contents:
        raise ServiceError(400, "contents must be a non-empty list")
    system_key = next((k for k in _SYSTEM_KEYS if k in data), _SYSTEM_KEYS[0])
    try:
        parsed = system_from_gemini(data.get(system_key)) + contents_from_gemini(contents)[0]
    except CtxwardenError as exc:
        raise from_library(exc) from exc
    first_user = next((m.text for m in parsed if m.role == "user"), "")
    system_text = next((m.text for m in parsed if m.role == "system"), "")
    call = Call(
        api="gemini",
        tenant=tenant,
        client_id=client_session_id(request, tenant, system_text, first_user),
        model=model,
        keys=[message_key(m) for m in parsed],
        parse=lambda start: parsed[start:],
        max_input_tokens=max_input_tokens_header(request),
        tools=_tools_as_openai(data.get("tools")),
    )
    wire = GeminiWire(data, path, len(contents), system_key)
    return await forward(request, hub, upstream, wire, call, stream=stream)


async def _count_tokens(
    request: Request, tenant: Tenant, upstream: Any, path: str, raw: bytes
) -> Response:
    """Gemini's count of the request as the client sent it, from upstream with the
    tenant's or the server's key (nothing built, nothing stored)."""
    headers = upstream.headers(tenant_key(tenant.record, "gemini"), request.headers)
    try:
        response = await upstream.open(path, raw, headers)
    except UpstreamFailure as failure:
        raise ServiceError(failure.status, failure.message) from failure
    body = await read_whole(upstream, response)
    media = response.headers.get("content-type", "application/json")
    return Response(body, response.status_code, media_type=media)
