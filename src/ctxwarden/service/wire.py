"""What each wire format (OpenAI, Anthropic) gives the forwarding code: the body sent
upstream, reading a JSON reply, reading a stream frame by frame."""

from __future__ import annotations

from typing import Any, Protocol

from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.service.prepared import Prepared

__all__ = ["StreamReader", "Wire"]


class StreamReader(Protocol):
    @property
    def tokens_seen(self) -> bool:
        """A text or tool delta arrived (time to first token)."""

    @property
    def finished(self) -> bool:
        """The stream's own end marker arrived (``[DONE]``, ``message_stop``)."""

    def frame(self, frame: bytes) -> bytes | None:
        """Account for one frame; return what the client gets (``None``: drop it)."""

    def result(self, complete: bool) -> tuple[Message | None, Usage | None, str]:
        """The reply to store, the usage, and the build's final status."""


class Wire(Protocol):
    api: str
    path: str

    def body(
        self, prepared: Prepared, extra: tuple[Message, ...] = (), recall: bool = False
    ) -> bytes: ...

    def from_json(self, data: Any) -> tuple[Message | None, Usage | None]: ...

    def reader(self) -> StreamReader: ...
