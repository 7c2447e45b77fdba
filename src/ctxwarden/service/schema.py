"""What the OpenAPI schema says of the routes beyond their models: error responses and
the proxy's request bodies (read raw, so FastAPI cannot infer them)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

__all__ = [
    "ANTHROPIC_BODY",
    "COUNT_BODY",
    "ERRORS",
    "OPENAI_BODY",
    "PROXY_ERRORS",
    "RESPONSES_BODY",
    "ErrorBody",
]


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str | None = None


class ErrorBody(BaseModel):
    """OpenAI's error shape (Anthropic's for ``/v1/messages``: ``{"type": "error", "error"}``)."""

    error: ErrorDetail


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    text = {
        400: "Bad input (a budget too small, malformed messages, an unknown model)",
        401: "Missing, unknown or revoked API key",
        404: "No such session (or it belongs to another tenant), or no upstream",
        413: "Body over the configured size",
        422: "Parameters outside their bounds",
        429: "The tenant's spend cap is reached (or upstream's rate limit)",
        502: "Upstream unreachable",
        504: "Upstream timed out",
    }
    return {code: {"model": ErrorBody, "description": text[code]} for code in codes}


ERRORS = _errors(400, 401, 404, 422)
PROXY_ERRORS = _errors(400, 401, 404, 413, 429, 502, 504)

_MESSAGE = {"type": "object", "required": ["role"], "properties": {"role": {"type": "string"}}}


def _body(system: bool, *, count: bool = False) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "model": {"type": "string", "minLength": 1},
        "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
    }
    if not count:
        properties["stream"] = {"type": "boolean"}
    if system:
        properties["system"] = {"type": "string"}
    if system and not count:
        properties["max_tokens"] = {"type": "integer", "minimum": 1}
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["model", "messages"],
                        "properties": properties,
                        "additionalProperties": True,
                    }
                }
            },
        }
    }


OPENAI_BODY = _body(system=False)
ANTHROPIC_BODY = _body(system=True)
COUNT_BODY = _body(system=True, count=True)

RESPONSES_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["model"],
                    "properties": {
                        "model": {"type": "string", "minLength": 1},
                        "input": {"oneOf": [{"type": "string"}, {"type": "array"}]},
                        "instructions": {"type": "string"},
                        "previous_response_id": {"type": "string"},
                        "stream": {"type": "boolean"},
                    },
                    "additionalProperties": True,
                }
            }
        },
    }
}
