"""Errors the service answers before any byte is streamed, in each provider's shape.

The SDKs raise their own typed errors from these bodies (``openai.BadRequestError``,
``anthropic.AuthenticationError``...), so a client sees a ctxwarden refusal the way it
sees a provider's. Library errors map to statuses here, in one place.
"""

from __future__ import annotations

import json
from typing import Any

from ctxwarden.core.errors import (
    BudgetError,
    ConfigError,
    CtxwardenError,
    InvalidMessageError,
    StoreUnavailable,
    UnknownModelError,
    UsageError,
    VersionConflict,
)

__all__ = ["ServiceError", "error_body", "from_library"]

_GEMINI_STATUSES = {  # google.rpc.Code names, as the Gemini API writes them
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    408: "timeout_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "request_too_large",
    502: "api_error",
    503: "service_unavailable",
    504: "timeout_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "request_too_large",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


class ServiceError(Exception):
    """An HTTP error with a message; ``extra`` fields join the error object
    (``minimum_budget`` for a budget too small)."""

    def __init__(self, status: int, message: str, *, code: str | None = None, **extra: Any):
        self.status = status
        self.message = message
        self.code = code
        self.extra = extra
        super().__init__(message)


def error_body(exc: ServiceError, api: str) -> bytes:
    """The error as the provider would send it (``api`` is ``openai``, ``anthropic`` or
    ``gemini``)."""
    if api == "gemini":
        status = _GEMINI_STATUSES.get(exc.status, "UNKNOWN")
        error_g: dict[str, Any] = {"code": exc.status, "message": exc.message, "status": status}
        if exc.code or exc.extra:  # ours, where Google puts machine-readable detail
            error_g["details"] = [{"reason": exc.code, **exc.extra}]
        return json.dumps({"error": error_g}).encode()
    if api == "anthropic":
        kind = _ANTHROPIC_TYPES.get(exc.status, "api_error")
        error: dict[str, Any] = {"type": kind, "message": exc.message}
        if exc.code:
            error["code"] = exc.code
        error.update(exc.extra)
        return json.dumps({"type": "error", "error": error}).encode()
    error = {
        "message": exc.message,
        "type": _OPENAI_TYPES.get(exc.status, "api_error"),
        "param": None,
        "code": exc.code,
    }
    error.update(exc.extra)
    return json.dumps({"error": error}).encode()


def from_library(exc: CtxwardenError) -> ServiceError:
    """The status a library error answers with: user mistakes 400, the rest 500."""
    if isinstance(exc, BudgetError):
        return ServiceError(
            400, str(exc), code="context_budget_too_small", minimum_budget=exc.minimum
        )
    if isinstance(exc, InvalidMessageError):
        return ServiceError(400, str(exc), code="invalid_messages")
    if isinstance(exc, UnknownModelError | ConfigError):
        return ServiceError(400, str(exc), code="invalid_configuration")
    if isinstance(exc, UsageError):
        return ServiceError(400, str(exc))
    if isinstance(exc, VersionConflict):  # concurrent calls of one session kept colliding
        return ServiceError(409, str(exc), code="session_conflict")
    if isinstance(exc, StoreUnavailable):
        return ServiceError(
            503,
            f"the session store is unavailable; retry later ({exc})",
            code="store_unavailable",
        )
    return ServiceError(500, f"ctxwarden failed: {exc}", code="ctxwarden_error")
