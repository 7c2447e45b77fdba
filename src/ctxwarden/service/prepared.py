"""One proxied call's values: what a route parsed (:class:`Call`) and what the build made
of it (:class:`Prepared`). Their own module, so the wire formats, the pipeline and the
recall rounds all use them without importing each other."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden import BuiltContext
from ctxwarden.core.messages import Message
from ctxwarden.service.history import Synced
from ctxwarden.service.hub import Tenant
from ctxwarden.session.pending_log import PendingLog
from ctxwarden.telemetry import CallTrace

__all__ = ["Call", "Prepared", "Replay"]


@dataclass(frozen=True)
class Call:
    """What a route parsed from the request: ``keys`` are the client's messages as
    :func:`~ctxwarden.service.history.wire_key` s, ``parse(start)`` parses them from
    ``start`` on, ``tools`` are the request's tools in OpenAI shape (counted in the
    budget)."""

    api: str
    tenant: Tenant
    client_id: str
    model: str
    keys: Sequence[bytes]
    parse: Callable[[int], list[Message]]
    max_input_tokens: int | None = None
    tools: Sequence[Mapping[str, Any]] | None = None
    amend: Callable[[BuiltContext], BuiltContext] | None = None
    """The route's last word on the build before it is logged (a warning in its audit)."""
    #: the request apart from its messages (:func:`~ctxwarden.service.replay.request_digest`):
    #: kept with the reply, a retry's is the same; None gives no replay
    request: str | None = None
    #: the request says it repeats an earlier one (:func:`~ctxwarden.service.replay.is_retry`):
    #: only then may the stored reply be given back
    retry: bool = False
    trace: CallTrace | None = None  # the call's span, when the process traces


@dataclass(frozen=True)
class Prepared:
    call: Call
    synced: Synced
    pending: PendingLog  # the build, its log written once the context is on its way upstream

    @property
    def built(self) -> BuiltContext:
        return self.pending.built

    @property
    def build_id(self) -> str:
        return self.pending.build_id

    @property
    def history_tokens(self) -> int:
        return self.synced.head.history_tokens

    @property
    def saved_tokens(self) -> int:
        return max(0, self.history_tokens - self.built.input_tokens)

    def headers(self) -> dict[str, str]:
        return {
            "x-ctxwarden-input-tokens": str(self.built.input_tokens),
            "x-ctxwarden-saved-tokens": str(self.saved_tokens),
            "x-ctxwarden-build-id": self.build_id,
            "x-ctxwarden-session": self.synced.session.session_id,
        }


@dataclass(frozen=True)
class Replay:
    """A retried call whose reply the session already holds (:mod:`.replay`): nothing is
    built, stored or forwarded; ``reply`` is given back."""

    call: Call
    reply: Message
    session_id: str
