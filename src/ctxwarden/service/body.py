"""Reading a request body within the configured size, as JSON.

An agent's body is its whole history (hundreds of kilobytes each call), so it is parsed
with ``orjson`` (a few times faster than :mod:`json`); what orjson refuses and
:mod:`json` takes (an integer beyond 64 bits, UTF-16) is parsed by :mod:`json`, under the
edge's rules (:mod:`.edge`): a lone surrogate, ``NaN`` and nesting past
:data:`~.edge.MAX_PARSE_DEPTH` are a 400 naming what was wrong. Every route that takes a
body reads it here (:func:`read_json`), so the size cap and those rules hold on each.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from starlette.requests import Request

from ctxwarden.service.body_memo import BodyMemo, Reading
from ctxwarden.service.edge import check_model, check_raw, parse_checked
from ctxwarden.service.errors import ServiceError

__all__ = [
    "max_input_tokens_header",
    "model_and_messages",
    "parse_json",
    "read_body",
    "read_chat",
    "read_json",
]


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
    """``raw`` as a JSON object; 400 if it is not JSON (under the edge's rules,
    :func:`~.edge.parse_checked`) or not an object."""
    data = parse_checked(raw)
    if not isinstance(data, dict):
        raise ServiceError(400, "request body must be a JSON object")
    return data


def read_chat(
    memo: BodyMemo, scope: Hashable, raw: bytes, field: str = "messages"
) -> tuple[Reading | None, dict[str, Any]]:
    """A chat body read through the proxy's body memo (``scope``: route, tenant, session
    header; ``field``: the list the client resends, ``input`` on ``/v1/responses``), under
    the same rules as :func:`parse_json`: the memo's reading (or None when it did not read
    this body) and the body."""
    reading = memo.read(scope, raw, field=field)
    if reading is None:
        return None, parse_json(raw)
    # the front it reused was checked when it was new: only the text after it is
    start = reading.replaces.size if reading.replaces is not None else 0
    nonfinite = reading.nonfinite and (
        raw.find(b"NaN", start) >= 0 or raw.find(b"Infinity", start) >= 0
    )
    check_raw(raw, start=start, nonfinite=nonfinite)
    return reading, reading.data


def model_and_messages(data: dict[str, Any]) -> tuple[str, list[Any]]:
    """A chat request's ``model`` (a non-empty string) and ``messages`` (a non-empty
    list): 400 otherwise. Both wire formats name them alike."""
    model, messages = data.get("model"), data.get("messages")
    if not isinstance(model, str) or not model:
        raise ServiceError(400, "model must be a non-empty string")
    check_model(model)
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
