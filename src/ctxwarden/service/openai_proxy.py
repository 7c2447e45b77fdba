"""``POST /v1/chat/completions``: the OpenAI-compatible proxy (JSON and streamed).

The request is the client's, with ``messages`` replaced by the built context. For a
stream the proxy always asks upstream for ``stream_options.include_usage`` (its own
accounting needs the usage); when the client did not ask for it, the usage-only chunk is
dropped, and a usage riding on a chunk with choices is removed from that chunk alone.
Every other frame — role chunk, text and tool-call deltas with their ``index``,
``data: [DONE]`` — reaches the client byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ctxwarden import Usage
from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import Message
from ctxwarden.formats import message_from_openai, message_to_openai
from ctxwarden.formats.openai_json import messages_json_pieces, object_json_bytes
from ctxwarden.service.auth import CurrentTenant, hub_of
from ctxwarden.service.body import (
    max_input_tokens_header,
    model_and_messages,
    read_body,
    read_chat,
)
from ctxwarden.service.calls import SESSION_HEADER, client_session_id, upstream_for
from ctxwarden.service.errors import ServiceError
from ctxwarden.service.forward import forward
from ctxwarden.service.history import content_text, wire_key
from ctxwarden.service.prepared import Call, Prepared
from ctxwarden.service.replay import is_retry, request_digest
from ctxwarden.service.schema import OPENAI_BODY, PROXY_ERRORS
from ctxwarden.service.sse import OpenAIReply, parse_frame
from ctxwarden.session.recall import recall_tool

__all__ = ["OpenAIWire", "router"]

router = APIRouter()


def openai_usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    details = raw.get("prompt_tokens_details") or {}
    try:
        return Usage.from_openai(
            int(raw.get("prompt_tokens") or 0),
            int(raw.get("completion_tokens") or 0),
            int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0,
        )
    except (TypeError, ValueError):
        return None


def _reply(message: dict[str, Any], *, partial: bool = False) -> Message | None:
    """The stored form of a reply: role, content and tool calls only (what the client
    echoes back), marked partial when the stream was cut."""
    clean = {k: message[k] for k in ("role", "content", "tool_calls") if message.get(k) is not None}
    clean.setdefault("role", "assistant")
    if "content" not in clean and "tool_calls" not in clean:
        clean["content"] = ""
    reply = message_from_openai(clean)
    return replace(reply, meta={**reply.meta, "partial": True}) if partial else reply


class _Reader:
    def __init__(self, strip_usage: bool) -> None:
        self.reply = OpenAIReply()
        self.strip_usage = strip_usage

    @property
    def tokens_seen(self) -> bool:
        return self.reply.tokens_seen

    @property
    def finished(self) -> bool:
        return self.reply.done

    def frame(self, frame: bytes) -> bytes | None:
        _, data = parse_frame(frame)
        if data is None:
            return frame
        chunk = self.reply.add(data)
        if self.strip_usage and chunk is not None and chunk.get("usage") is not None:
            if not chunk.get("choices"):
                return None
            rest = {k: v for k, v in chunk.items() if k != "usage"}
            return b"data: " + json.dumps(rest, ensure_ascii=False).encode() + b"\n\n"
        return frame

    def result(self, complete: bool) -> tuple[Message | None, Usage | None, str]:
        usage = openai_usage(self.reply.usage)
        message = self.reply.message(complete=complete)
        if not complete and not message.get("content"):
            return None, usage, "partial"  # nothing arrived worth storing
        return _reply(message, partial=not complete), usage, "complete" if complete else "partial"


class OpenAIWire:
    api = "openai"
    path = "/chat/completions"

    def __init__(self, data: dict[str, Any], stream: bool) -> None:
        self.data = data
        self.stream = stream
        options = data.get("stream_options")
        self.client_usage = isinstance(options, dict) and bool(options.get("include_usage"))

    def body(
        self, prepared: Prepared, extra: tuple[Message, ...] = (), recall: bool = False
    ) -> bytes:
        """The request upstream gets: the client's, with the built context (and the
        recall rounds' ``extra`` messages; the recall tool offered with ``recall``) as its
        messages, each message's JSON (and its UTF-8) written once across calls
        (:mod:`ctxwarden.formats.openai_json`)."""
        out = dict(self.data)
        out["messages"] = None  # written below, in its place
        if recall:
            tools = self.data.get("tools")
            out["tools"] = [*(tools if isinstance(tools, list) else ()), recall_tool("openai")]
        if self.stream:
            options = self.data.get("stream_options")
            out["stream_options"] = {**(options if isinstance(options, dict) else {})}
            out["stream_options"]["include_usage"] = True
        context = [*prepared.built.messages, *extra]
        try:
            messages = messages_json_pieces(context)
        except UnicodeEncodeError:  # a lone surrogate a session stored before the text rule
            out["messages"] = [message_to_openai(m) for m in context]
            return json.dumps(out).encode()  # (as an escape, as the client sent it)
        return object_json_bytes(out, {"messages": messages})

    def from_json(self, data: Any) -> tuple[Message | None, Usage | None]:
        message = data["choices"][0]["message"]
        return _reply(message), openai_usage(data.get("usage"))

    def reader(self) -> _Reader:
        return _Reader(strip_usage=not self.client_usage)


def _derived_parts(messages: list[Any]) -> tuple[str, str]:
    system = next((m for m in messages if m.get("role") in ("system", "developer")), None)
    user = next((m for m in messages if m.get("role") == "user"), None)
    return (
        content_text(system.get("content")) if system else "",
        content_text(user.get("content")) if user else "",
    )


@router.post("/v1/chat/completions", responses=PROXY_ERRORS, openapi_extra=OPENAI_BODY)
async def chat_completions(request: Request, tenant: CurrentTenant) -> Response:
    """Build the context from the stored session and forward it (see the module)."""
    hub = hub_of(request)
    upstream = upstream_for(request, "openai")
    raw = await read_body(request, hub.config.max_body_bytes)
    scope = ("openai", tenant.name, request.headers.get(SESSION_HEADER))
    reading, data = read_chat(hub.bodies, scope, raw)
    model, messages = model_and_messages(data)
    if {*map(type, messages)} != {dict}:  # (the common case checked in C: all parsed dicts)
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise ServiceError(400, str(InvalidMessageError("must be a JSON object", index=i)))

    def parse(start: int) -> list[Message]:
        return [message_from_openai(m, index=i) for i, m in enumerate(messages[start:], start)]

    tools = data.get("tools")
    client_id = client_session_id(request, tenant, *_derived_parts(messages))
    made = reading.made if reading is not None else None
    if reading is not None and isinstance(made, tuple) and len(made) == reading.reused:
        keys = [*made, *(wire_key(m) for m in messages[reading.reused :])]  # the front's, the new
    else:
        keys = hub.keys.keys((tenant.name, client_id), messages)
    if reading is not None:
        hub.bodies.keep(reading, tuple(keys))
    call = Call(
        api="openai",
        tenant=tenant,
        client_id=client_id,
        model=model,
        keys=keys,
        parse=parse,
        max_input_tokens=max_input_tokens_header(request),
        tools=tools if isinstance(tools, list) else None,
        request=request_digest(data),
        retry=is_retry(request.headers),
    )
    stream = bool(data.get("stream"))
    return await forward(request, hub, upstream, OpenAIWire(data, stream), call, stream=stream)
