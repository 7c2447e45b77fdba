"""``POST /v1/responses``: the OpenAI Responses API proxy (JSON and streamed).

The request is the client's, with ``instructions`` and ``input`` replaced by the built
context (:mod:`ctxwarden.formats.responses`: items the build left unchanged go back
byte for byte); every other key (``store``, ``include``, ``reasoning``, ``tools``,
``tool_choice``, ``parallel_tool_calls``, ``max_output_tokens``, ``metadata``...)
passes as the client wrote it. Streams pass through whole, every ``event:`` frame as
upstream wrote it; a parsed copy gives the stored reply (the finished output items of
``response.completed``, or the text that arrived before a cut) and the usage.

**previous_response_id.** A client may send only its new items and name the response
they follow. When that response is a reply the proxy stored in the session
(``X-Ctxwarden-Session``, or the derived id), the session's history up to it plus the
new items is the conversation, built as any other. Upstream holds that response's
context itself when it said it stored it (``"store": true`` in the response) and the
context it holds is the whole history (every request of the chain sent it whole). Then,
if this build keeps the whole history too, the request goes as the client wrote it,
``previous_response_id`` and all (upstream's state and prompt cache stay in use).
Otherwise the proxy rebuilds: it sends the full built input without
``previous_response_id`` and says why in the build's audit (a warning). A response the
proxy never saw is forwarded as sent (upstream holds a history the proxy does not
know), and the audit says so too. A client that chains calls by ``previous_response_id``
should name its session: without ``X-Ctxwarden-Session`` the session id is derived from
the instructions and the first user message of the request, which a call carrying only
new items does not hold, so the proxy would not find the response it follows.

Usage is recorded as on the chat route: ``input_tokens`` with
``input_tokens_details.cached_tokens``, and ``output_tokens``, of which
``output_tokens_details.reasoning_tokens`` are a part (priced as output).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ctxwarden import BuiltContext, Usage
from ctxwarden.core.errors import CtxwardenError
from ctxwarden.core.messages import Message
from ctxwarden.formats.responses import (
    META,
    message_items,
    messages_from_responses,
    reply_from_output,
    tools_as_openai,
)
from ctxwarden.service.anthropic_json import object_bytes
from ctxwarden.service.auth import CurrentTenant, hub_of
from ctxwarden.service.body import max_input_tokens_header, read_body, read_chat
from ctxwarden.service.calls import SESSION_HEADER, client_session_id, upstream_for
from ctxwarden.service.errors import ServiceError, from_library
from ctxwarden.service.forward import forward
from ctxwarden.service.history import message_key
from ctxwarden.service.hub import Hub, Tenant
from ctxwarden.service.prepared import Call, Prepared
from ctxwarden.service.responses_memo import ItemsMemo
from ctxwarden.service.responses_stream import ResponsesReader, responses_usage
from ctxwarden.service.schema import PROXY_ERRORS, RESPONSES_BODY
from ctxwarden.session.recall import recall_tool
from ctxwarden.store.service_tables import get_head

__all__ = ["ResponsesWire", "router"]

router = APIRouter()

WHOLE, CUT, FOREIGN = "whole", "cut", "foreign"
"""What upstream holds for a response (kept with the stored reply): the whole history,
a built cut of it, or a history that started at a response the proxy never saw."""


@dataclass
class _Plan:
    """How this call's context goes upstream, decided once the build is known."""

    previous: str | None  # the client's previous_response_id
    found: Mapping[str, Any] | None  # the stored reply's response (id, store, state)
    history: Sequence[Message] = ()
    forward_previous: bool = False
    state: str = WHOLE
    notes: list[str] = field(default_factory=list)

    def decide(self, built: BuiltContext) -> BuiltContext:
        """Forward ``previous_response_id`` or rebuild (see the module docstring); the
        reason goes into the audit's warnings."""
        sent, audit = built.messages, built.audit
        whole = (  # the audit first: what it reports cut needs no comparing
            not audit.actions
            and len(sent) == len(self.history)
            and all(a is b or a.fingerprint == b.fingerprint
                    for a, b in zip(sent, self.history, strict=True))
        )  # fmt: skip
        self.state = WHOLE if whole else CUT
        if self.previous is None:
            return built
        found = self.found
        if found is None or found.get("state") == FOREIGN:
            self.forward_previous, self.state = True, FOREIGN
            why = "is not a reply stored in this session" if found is None else (
                "follows a response the proxy never saw")  # fmt: skip
            note = (f"previous_response_id {self.previous!r} {why}: forwarded as sent; the "
                    "history upstream holds for it is not managed by ctxwarden")  # fmt: skip
        elif found.get("store") and found.get("state") == WHOLE and whole:
            self.forward_previous = True
            note = (f"previous_response_id {self.previous!r} forwarded: upstream holds the "
                    "whole history and the build kept all of it")  # fmt: skip
        else:
            if not found.get("store"):
                reason = "upstream did not store that response"
            elif found.get("state") != WHOLE:
                reason = "upstream holds a cut of the history an earlier build made"
            else:
                reason = "the build cut the history to fit the budget"
            note = (f"previous_response_id {self.previous!r} not forwarded ({reason}): the "
                    f"proxy rebuilt the context and sent the full built input "
                    f"({len(sent)} messages)")  # fmt: skip
        return replace(built, audit=replace(audit, warnings=(*audit.warnings, note)))


class ResponsesWire:
    api = "responses"
    path = "/responses"

    def __init__(
        self, data: dict[str, Any], stream: bool, plan: _Plan, nonfinite: bool = False
    ) -> None:
        self.data = data
        self.stream = stream
        self.plan = plan
        self.nonfinite = nonfinite  # the client's body holds NaN or Infinity

    def body(
        self, prepared: Prepared, extra: tuple[Message, ...] = (), recall: bool = False
    ) -> bytes:
        """The request upstream gets: the client's, with the built context as its
        ``instructions`` and ``input`` (or, forwarding ``previous_response_id``, the
        client's own input), the recall rounds' ``extra`` messages after it and the
        recall tool offered with ``recall``."""
        out = dict(self.data)
        if recall:
            tools = self.data.get("tools")
            chat = recall_tool("openai")["function"]
            out["tools"] = [*(tools if isinstance(tools, list) else ()), {"type": "function",
                                                                           **chat}]  # fmt: skip
        given: list[Any] = []  # the client's own items, forwarding previous_response_id
        if self.plan.forward_previous:
            raw = self.data.get("input")
            given = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw or ())
            context: Sequence[Message] = extra
        else:
            out.pop("previous_response_id", None)
            context = [*prepared.built.messages, *extra]
            if context and _is_instructions(context[0]):
                out["instructions"] = context[0].text
                context = context[1:]
            else:
                out.pop("instructions", None)
        out["input"] = None  # written in its place
        if not self.nonfinite:  # orjson would write NaN as null: only without any
            try:
                # the memo read inline: a context is hundreds of messages, each kept
                pieces = [*map(orjson.dumps, given)]
                pieces += [m._memo.get(_ITEMS_ATTR) or _item_bytes(m) for m in context]
                return object_bytes(out, {"input": b"[" + b",".join(pieces) + b"]"})
            except (orjson.JSONEncodeError, TypeError):  # a huge int: the stdlib writes it
                pass
        out["input"] = [*given, *(i for m in context for i in message_items(m))]
        return json.dumps(out, ensure_ascii=False).encode()

    def _response(self, data: Mapping[str, Any]) -> dict[str, Any]:
        return {"id": data.get("id"), "store": bool(data.get("store")), "state": self.plan.state}

    def from_json(self, data: Any) -> tuple[Message | None, Usage | None]:
        reply = reply_from_output(data["output"], self._response(data))
        return reply, responses_usage(data.get("usage"))

    def reader(self) -> ResponsesReader:
        return ResponsesReader(self._response)


def _is_instructions(message: Message) -> bool:
    kept = message.meta.get(META)
    return message.role == "system" and isinstance(kept, Mapping) and bool(kept.get("instructions"))


_ITEMS_ATTR = "_cw_responses_items"


def _item_bytes(message: Message) -> bytes:
    """A message's items as compact JSON without the list's brackets, kept on the message
    (a message never changes; the proxy sends the same ones call after call)."""
    found: bytes | None = message._memo.get(_ITEMS_ATTR)
    if found is None:
        found = b",".join(orjson.dumps(i) for i in message_items(message))
        message._memo[_ITEMS_ATTR] = found
    return found


def _stored_before(
    hub: Hub, tenant: Tenant, client_id: str, previous: str
) -> tuple[list[Message], Mapping[str, Any] | None]:
    """The session's history up to the stored reply to ``previous`` and that reply's
    response record; ``([], None)`` when the session holds no such reply."""
    head = get_head(hub.store, tenant.name, client_id)
    if head is None:
        return [], None
    stored = [r.message for r in hub.store.iter_messages(tenant.name, head.session_id)]
    for i in range(min(head.count, len(stored)) - 1, -1, -1):
        kept = stored[i].meta.get(META)
        response = kept.get("response") if isinstance(kept, Mapping) else None
        if isinstance(response, Mapping) and response.get("id") == previous:
            return stored[: i + 1], response
    return [], None


def _memo(request: Request) -> ItemsMemo:
    """The app's :class:`~ctxwarden.service.responses_memo.ItemsMemo` (made on first use)."""
    state = request.app.state
    memo: ItemsMemo | None = getattr(state, "responses_items", None)
    if memo is None:
        memo = state.responses_items = ItemsMemo()
    return memo


def _without_instructions(messages: list[Message]) -> list[Message]:
    return messages[1:] if messages and _is_instructions(messages[0]) else messages


@router.post("/v1/responses", responses=PROXY_ERRORS, openapi_extra=RESPONSES_BODY)
async def responses(request: Request, tenant: CurrentTenant) -> Response:
    """Build the context from the stored session and forward it (see the module)."""
    hub = hub_of(request)
    upstream = upstream_for(request, "openai")
    raw = await read_body(request, hub.config.max_body_bytes)
    scope = ("responses", tenant.name, request.headers.get(SESSION_HEADER))
    # the resent front is not parsed again; the text is checked under the edge's rules
    reading, data = read_chat(hub.bodies, scope, raw, field="input")
    model, given, previous = data.get("model"), data.get("input"), data.get("previous_response_id")
    if not isinstance(model, str) or not model:
        raise ServiceError(400, "model must be a non-empty string")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise ServiceError(400, "previous_response_id must be a non-empty string")
    if not (isinstance(given, str) or (isinstance(given, list) and (given or previous))):
        raise ServiceError(400, "input must be a string or a non-empty list of items")
    instructions = data.get("instructions")
    try:
        head: list[Message] = []
        keys: list[bytes] = []
        if instructions is not None:
            system, key = _memo(request).instructions(scope, instructions)
            head, keys = [system], [key]
        if isinstance(given, list):
            items, item_keys = _memo(request).convert(scope, given, len(raw))
        else:
            items = messages_from_responses(given)
            item_keys = [message_key(m) for m in items]
    except CtxwardenError as exc:
        raise from_library(exc) from exc
    if reading is not None:
        hub.bodies.keep(reading, None)
    parsed = [*head, *items]
    keys += item_keys
    system_text = next((m.text for m in parsed if m.role == "system"), "")
    first_user = next((m.text for m in parsed if m.role == "user"), "")
    client_id = client_session_id(request, tenant, system_text, first_user)
    plan = _Plan(previous, None)
    if previous is not None:
        earlier, plan.found = await hub.run(_stored_before, hub, tenant, client_id, previous)
        earlier = _without_instructions(earlier)
        parsed = [*head, *earlier, *items]
        keys = [*keys[: len(head)], *(message_key(m) for m in earlier), *item_keys]
    plan.history = parsed
    call = Call(
        api="responses",
        tenant=tenant,
        client_id=client_id,
        model=model,
        keys=keys,
        parse=lambda start: parsed[start:],
        max_input_tokens=max_input_tokens_header(request),
        tools=tools_as_openai(data.get("tools")),
        amend=plan.decide,
    )
    stream = bool(data.get("stream"))
    # NaN and Infinity can only come from the client's text (orjson would write them null)
    nonfinite = reading.nonfinite if reading is not None else b"NaN" in raw or b"Infinity" in raw
    wire = ResponsesWire(data, stream, plan, nonfinite)
    return await forward(request, hub, upstream, wire, call, stream=stream)
