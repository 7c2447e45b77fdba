"""A retried call answered with the reply the store already holds (no fork, no second
upstream call).

A client whose call timed out on its side sends the same request again; the proxy may
have finished the first one meanwhile and stored its reply. The retry's history is then
the stored session minus that reply, which does not extend the session, and used to be
served as a new branch (``chat-1~b1``): the session forked and upstream was paid twice.
:func:`~ctxwarden.service.history.sync_history` recognises the case exactly (the
client's history plus the stored last reply hashes to the session's head, that reply
is complete, and the rest of the request (model, parameters, tools) is the one that
reply answered: :func:`request_digest`, kept in the reply's metadata), and the route
answers with the stored reply in the client's wire
format, JSON or streamed, marked ``x-ctxwarden-replayed: 1``, with zero usage (nothing
was called). A reply cut short (``partial``) is not given back: that retry is a new
call, as before.

Only a request that says it is a retry is answered so (:func:`is_retry`): the
``x-stainless-retry-count`` header of 1 or more that the openai and anthropic SDKs send
on their own retries, or ``x-ctxwarden-retry: 1`` for a client that retries by hand.
The same request sent again without it is a new call (a new branch), never a stale
answer: an evaluation that samples one prompt several times, or an agent run again from
its start, gets fresh replies from upstream.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

from ctxwarden.core.messages import Message
from ctxwarden.formats import message_to_openai
from ctxwarden.formats.anthropic import messages_to_anthropic

__all__ = [
    "REPLAYED_HEADER",
    "REQUEST_META",
    "RETRY_HEADER",
    "is_retry",
    "replayed",
    "request_digest",
]

REPLAYED_HEADER = "x-ctxwarden-replayed"
REQUEST_META = "request"
"""The key of a stored reply's metadata that holds :func:`request_digest` of its call."""
RETRY_HEADER = "x-ctxwarden-retry"
"""``1``: this request repeats one the client sent before (see the module docstring)."""
_SDK_RETRY_HEADER = "x-stainless-retry-count"


def is_retry(headers: Mapping[str, str]) -> bool:
    """Whether the request says it repeats an earlier one: the SDKs' retry count of 1 or
    more, or :data:`RETRY_HEADER` ``1``."""
    if headers.get(RETRY_HEADER, "").strip() == "1":
        return True
    count = headers.get(_SDK_RETRY_HEADER, "").strip()
    return count.isdigit() and int(count) > 0


def request_digest(data: Mapping[str, Any]) -> str:
    """A digest of a request apart from its messages (which the session's hash chain
    covers): equal for a request sent again unchanged."""
    rest = {k: v for k, v in data.items() if k != "messages"}
    try:  # (orjson: a tenth of json's time on a request's tools)
        text = orjson.dumps(rest, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):  # a huge int, NaN's kin: the stdlib's
        text = json.dumps(rest, sort_keys=True, default=repr).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(text, digest_size=12).hexdigest()


def replayed(
    api: str, reply: Message, model: str, *, stream: bool, session_id: str
) -> Response | None:
    """The stored ``reply`` as ``api``'s answer (``None`` for a wire format without a
    replay: the call then goes on as a new one)."""
    headers = {REPLAYED_HEADER: "1", "x-ctxwarden-session": session_id}
    if api == "openai":
        if stream:
            return _sse(_openai_frames(reply, model), headers)
        return Response(json.dumps(_openai_json(reply, model)), 200, headers, "application/json")
    if api == "anthropic":
        blocks = _anthropic_blocks(reply)
        if stream:
            return _sse(_anthropic_frames(blocks, model), headers)
        body = _anthropic_json(blocks, model)
        return Response(json.dumps(body), 200, headers, "application/json")
    return None


def _sse(frames: Iterator[bytes], headers: dict[str, str]) -> Response:
    return StreamingResponse(
        frames, 200, {**headers, "cache-control": "no-cache"}, "text/event-stream"
    )


def _openai_json(reply: Message, model: str) -> dict[str, Any]:
    message = message_to_openai(reply)
    return {
        "id": f"chatcmpl-replay-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(reply.created_at or 0),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": _finish(message), "logprobs": None}
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _finish(message: dict[str, Any]) -> str:
    return "tool_calls" if message.get("tool_calls") else "stop"


def _openai_frames(reply: Message, model: str) -> Iterator[bytes]:
    message = message_to_openai(reply)
    head = {"id": f"chatcmpl-replay-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk",
            "created": int(reply.created_at or 0), "model": model}  # fmt: skip
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    first = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    last = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": _finish(message)}]}
    for chunk in (first, last):
        yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def _anthropic_blocks(reply: Message) -> list[dict[str, Any]]:
    _, turns = messages_to_anthropic([reply])
    content = turns[-1]["content"] if turns else []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [dict(b) for b in content]


def _anthropic_json(blocks: list[dict[str, Any]], model: str) -> dict[str, Any]:
    return {
        "id": f"msg_replay_{uuid.uuid4().hex[:12]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": "tool_use"
        if any(b.get("type") == "tool_use" for b in blocks)
        else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


def _stop_reason(blocks: list[dict[str, Any]]) -> str:
    return "tool_use" if any(b.get("type") == "tool_use" for b in blocks) else "end_turn"


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _anthropic_frames(blocks: list[dict[str, Any]], model: str) -> Iterator[bytes]:
    whole = _anthropic_json(blocks, model)
    opening = {**whole, "content": [], "stop_reason": None}
    yield _event("message_start", {"type": "message_start", "message": opening})
    for i, block in enumerate(blocks):
        kind = block.get("type")
        start: dict[str, Any] = block  # thinking and other blocks: given whole at their start
        delta: dict[str, Any] | None = None
        if kind == "text":
            start, delta = (
                {"type": "text", "text": ""},
                {"type": "text_delta", "text": block["text"]},
            )
        elif kind == "tool_use":
            partial = json.dumps(block.get("input", {}))
            start, delta = (
                {**block, "input": {}},
                {"type": "input_json_delta", "partial_json": partial},
            )
        opened = {"type": "content_block_start", "index": i, "content_block": start}
        yield _event("content_block_start", opened)
        if delta is not None:
            moved = {"type": "content_block_delta", "index": i, "delta": delta}
            yield _event("content_block_delta", moved)
        yield _event("content_block_stop", {"type": "content_block_stop", "index": i})
    stop = {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    ending = {"type": "message_delta", "delta": stop, "usage": {"output_tokens": 0}}
    yield _event("message_delta", ending)
    yield _event("message_stop", {"type": "message_stop"})
