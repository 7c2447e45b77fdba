"""Every failure is a JSON error in the route's own wire format, and ends no connection.

A route's own refusals are :class:`~ctxwarden.service.errors.ServiceError` s, answered by
the app's handlers. What no route expected (a bug, a recursion limit) would reach the
server as an exception: Starlette then answers ``Internal Server Error`` as plain text
and raises again, and uvicorn, seeing an exception after the response, closes the
connection, so the client's next request on it is reset. :func:`install` answers such
an exception as a JSON 500 in the provider's shape (logged with its traceback), and
:class:`Failures`, outermost, keeps it from reaching the server once the answer is
complete; one that happens mid-stream still ends the connection (the only way a client
can tell a cut stream).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from ctxwarden.service.auth import is_gemini_path
from ctxwarden.service.edge import too_deep
from ctxwarden.service.errors import ServiceError, error_body

__all__ = ["Failures", "api_of", "install", "unexpected"]

log = logging.getLogger("ctxwarden.service")


def api_of(scope: Scope) -> str:
    """Whose shape the answer takes: Gemini's on the Gemini routes, Anthropic's for
    ``/v1/messages`` and for the model routes when the request carries
    ``anthropic-version`` (the anthropic SDK's always does); OpenAI's everywhere else."""
    path: str = scope.get("path", "")
    if is_gemini_path(path, scope.get("method", "")):
        return "gemini"
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/models") and "anthropic-version" in Headers(scope=scope):
        return "anthropic"
    return "openai"


def answer(exc: ServiceError, scope: Scope) -> Response:
    headers = {"connection": "close"} if exc.status == 431 else None
    return Response(
        error_body(exc, api_of(scope)), exc.status, headers=headers, media_type="application/json"
    )


def unexpected(exc: BaseException) -> ServiceError:
    """What an exception no route expected answers: a value nested too deep for a
    recursive step is the client's (400); anything else is ours (500, logged)."""
    if isinstance(exc, RecursionError):
        return too_deep()
    log.error("unexpected failure", exc_info=exc)
    return ServiceError(500, f"ctxwarden failed: {type(exc).__name__}", code="internal_error")


def install(app: object) -> None:
    """Answer every exception the app's routes raise as JSON (see the module); the
    app's handlers for its own errors stay as they are."""

    async def failed(request: Request, exc: Exception) -> Response:
        return answer(unexpected(exc), request.scope)

    add = app.exception_handler  # type: ignore[attr-defined]
    add(Exception)(failed)


class Failures:
    """The outermost layer: an exception after a complete answer is kept from the server
    (which would close the connection); one before any answer is answered here."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = {"started": False, "done": False}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                state["done"] = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if state["done"]:
                return  # answered (the handlers log what they did not expect)
            if state["started"]:
                raise  # cut mid-answer: the connection must end
            await answer(unexpected(exc), scope)(scope, receive, send)
