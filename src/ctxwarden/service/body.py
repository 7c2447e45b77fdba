"""Reading a request body within the configured size, as JSON.

An agent's body is its whole history (hundreds of kilobytes each call), so it is parsed
with ``orjson`` (a few times faster than :mod:`json`); what orjson refuses and
:mod:`json` takes (a lone surrogate escape, ``NaN``, an integer beyond 64 bits, UTF-16)
is parsed by :mod:`json`, so the result and every error are the stdlib's.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from starlette.requests import Request

from ctxwarden.service.errors import ServiceError

__all__ = ["max_input_tokens_header", "model_and_messages", "parse_json", "read_body", "read_json"]


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object (:func:`read_body`, then :func:`parse_json`)."""
    return parse_json(await read_body(request, limit))


async def read_body(request: Request, limit: int) -> bytes:
    """The body; 413 above ``limit`` bytes (checked before reading when the client says
    its length, and while reading otherwise)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ServiceError(413, f"request body of {int(declared):,} bytes is over {limit:,}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ServiceError(413, f"request body is over {limit:,} bytes")
        if chunk:  # (the stream ends with b""): a body read at once is not copied again
            chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object; 400 if it is not JSON or not an object."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    try:
        if data is None:
            data = json.loads(raw)
    except ValueError as exc:
        raise ServiceError(400, f"request body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ServiceError(400, "request body must be a JSON object")
    return data


def model_and_messages(data: dict[str, Any]) -> tuple[str, list[Any]]:
    """A chat request's ``model`` (a non-empty string) and ``messages`` (a non-empty
    list): 400 otherwise. Both wire formats name them alike."""
    model, messages = data.get("model"), data.get("messages")
    if not isinstance(model, str) or not model:
        raise ServiceError(400, "model must be a non-empty string")
    if not isinstance(messages, list) or not messages:
        raise ServiceError(400, "messages must be a non-empty list")
    return model, messages


def max_input_tokens_header(request: Request) -> int | None:
    """``X-Ctxwarden-Max-Input-Tokens``: the client's budget for this call (the tenant's
    cap still applies)."""
    raw = request.headers.get("x-ctxwarden-max-input-tokens")
    if raw is None:
        return None
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ServiceError(400, f"X-Ctxwarden-Max-Input-Tokens must be a positive integer: {raw!r}")
    return int(raw)
