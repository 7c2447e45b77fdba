"""What the OpenAPI schema says of the Gemini routes: Gemini's error shape and the
request body (read raw, so FastAPI cannot infer it)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ctxwarden.service.schema import PROXY_ERRORS

__all__ = ["GEMINI_BODY", "GEMINI_ERRORS", "GeminiErrorBody"]


class GeminiErrorDetail(BaseModel):
    code: int
    message: str
    status: str
    details: list[dict[str, Any]] | None = None


class GeminiErrorBody(BaseModel):
    """Gemini's error shape (``google.rpc.Status``)."""

    error: GeminiErrorDetail


GEMINI_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": GeminiErrorBody, "description": spec["description"]}
    for code, spec in PROXY_ERRORS.items()
}
GEMINI_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["contents"],
                    "properties": {
                        "contents": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "object", "required": ["parts"]},
                        },
                        "systemInstruction": {"type": "object"},
                        "tools": {"type": "array"},
                    },
                    "additionalProperties": True,
                }
            }
        },
    }
}
