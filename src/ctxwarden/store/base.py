"""What a session store is: records, one protocol, and the JSON codec both backends share (R13).

A store keeps, per ``(tenant, session_id)``: the messages in order (each with a sequence
number allocated inside the appending transaction, so concurrent appenders never collide),
the rolling summary and the facts written by the summarisation cycle, the sticky decisions
of the last build, the entity-ledger checkpoint, and the usage so far. Every operation is
one short transaction; none stays open across a model call (seed 000: a transaction held
through a 5–30 s LLM call is the production bug that exhausts the connection pool).

The build path only ever asks for :meth:`SessionStore.pinned`, :meth:`SessionStore.tail`
and :meth:`SessionStore.unpinned_between` (the messages that left the slice since the
ledger's checkpoint), which are indexed reads bounded by the budget and by how far the
window moved, so a build costs the same at 100 and at 100,000 messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ctxwarden.core.errors import StoreError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.formats.openai import message_from_openai, message_to_openai
from ctxwarden.formats.openai_json import dumps

__all__ = [
    "SessionStore",
    "StoredMessage",
    "StoredSession",
    "SummaryInput",
    "decode_message",
    "decode_usage",
    "encode_message",
    "encode_usage",
    "read_as_pinned",
    "unstorable",
]


@dataclass(frozen=True)
class StoredSession:
    """A session row. ``version`` counts summary writes (the optimistic-lock token);
    ``summary_upto`` is the last sequence number the summary covers (-1: none);
    ``next_seq`` is the number of messages ever appended; ``summary_levels`` are the
    tiers ``summary`` is made of (level-one summaries and the meta-summary; ``{}`` for
    a summary written without them)."""

    tenant: str
    session_id: str
    summary: str | None
    facts: Mapping[str, Any]
    sticky: Mapping[str, Any]
    version: int
    created_at: float
    updated_at: float
    summary_upto: int = -1
    next_seq: int = 0
    usage: Mapping[str, Usage] = field(default_factory=dict)
    dollars: float = 0.0
    summary_levels: Mapping[str, Any] = field(default_factory=dict)

    @property
    def total_usage(self) -> Usage:
        """Every recorded call summed over models."""
        total = Usage(calls=0)
        for usage in self.usage.values():
            total = total + usage
        return total


@dataclass(frozen=True)
class StoredMessage:
    """One stored message with its place in the session and its token counts per encoding."""

    seq: int
    message: Message
    token_counts: Mapping[str, int]


@dataclass(frozen=True)
class SummaryInput:
    """Step 1 of the summarisation cycle: a snapshot to summarise, read in one short
    transaction. ``messages`` are those after ``session.summary_upto`` and before the
    ``keep_recent`` newest; ``session.version`` is what the write must still find."""

    session: StoredSession
    messages: tuple[StoredMessage, ...]

    @property
    def up_to_seq(self) -> int:
        """The last sequence number this batch covers (the old mark when it is empty)."""
        return self.messages[-1].seq if self.messages else self.session.summary_upto


@runtime_checkable
class SessionStore(Protocol):
    """Storage for sessions; SQLite and PostgreSQL implement it with one schema.

    Every method is a short transaction of its own. ``release()`` gives back whatever
    connection the calling thread holds, so a caller about to wait on a model holds none.
    """

    url: str

    def create_session(self, tenant: str, session_id: str) -> StoredSession: ...

    def get_session(self, tenant: str, session_id: str) -> StoredSession | None: ...

    def list_sessions(self, tenant: str) -> list[StoredSession]: ...

    def append(
        self,
        tenant: str,
        session_id: str,
        messages: Sequence[Message],
        token_counts: Sequence[Mapping[str, int]],
        *,
        expect_next: int | None = None,
    ) -> list[int]: ...

    def tail(
        self,
        tenant: str,
        session_id: str,
        max_tokens: int,
        encoding: str,
        *,
        after_seq: int = -1,
        min_messages: int = 1,
        count: Callable[[Message], int] | None = None,
        cache: MutableMapping[int, Message] | None = None,
        cap: int | None = None,
    ) -> list[StoredMessage]: ...

    def pinned(self, tenant: str, session_id: str) -> list[StoredMessage]:
        """The session's pinned messages and system prompts, in order (a session
        remembers them and adds those it appends itself)."""
        ...

    def count(self, tenant: str, session_id: str) -> int: ...

    def range(
        self, tenant: str, session_id: str, seq_from: int, seq_to: int
    ) -> list[StoredMessage]: ...

    def iter_messages(
        self, tenant: str, session_id: str, *, batch: int = 500
    ) -> Iterator[StoredMessage]: ...

    def read_for_summary(
        self, tenant: str, session_id: str, *, keep_recent: int = 0, max_messages: int = 1000
    ) -> SummaryInput: ...

    def write_summary(
        self,
        tenant: str,
        session_id: str,
        *,
        expected_version: int,
        summary: str | None,
        facts: Mapping[str, Any],
        covered_up_to_seq: int,
        levels: Mapping[str, Any] | None = None,
    ) -> StoredSession: ...

    def save_sticky(
        self,
        tenant: str,
        session_id: str,
        sticky: Mapping[str, Any],
        *,
        ledger: tuple[int, str] | None = None,
    ) -> None: ...

    def load_ledger(self, tenant: str, session_id: str) -> tuple[int, str | None]: ...

    def unpinned_between(
        self,
        tenant: str,
        session_id: str,
        after_seq: int,
        before_seq: int,
        *,
        limit: int = 1000,
        cache: MutableMapping[int, Message] | None = None,
    ) -> list[tuple[int, Message]]: ...

    def record_usage(
        self, tenant: str, session_id: str, usage: Usage, *, model: str, dollars: float = 0.0
    ) -> StoredSession: ...

    def connections_in_use(self) -> int: ...

    def release(self) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> SessionStore: ...

    def __exit__(self, *exc: object) -> None: ...


# -- codec shared by the backends ------------------------------------------------------------


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def json_text(value: Any) -> str:
    """``value`` as JSON text any database stores: UTF-8 as is, except that a text with a
    lone surrogate ("\\ud800", which SQLite and PostgreSQL cannot encode) is written
    with ASCII escapes. NUL is always escaped by JSON. Lossless either way."""
    text = dumps(value)  # json.dumps(value, ensure_ascii=False)
    if not text.isascii() and unstorable(text):
        return json.dumps(value, ensure_ascii=True)
    return text


def unstorable(text: str) -> bool:
    """Whether ``text`` holds what a database cannot store as is (NUL, a lone surrogate):
    :data:`_UNSTORABLE`'s test, by the UTF-8 encoder (which refuses exactly the
    surrogates) rather than the regex, 50x faster on a long text."""
    if "\x00" in text:
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def storable_text(text: str | None) -> str | None:
    """A plain text column's value: NUL (PostgreSQL rejects it) and lone surrogates become
    U+FFFD. Only derived texts (a summary) are stored this way; messages go as JSON."""
    if text is None or (text.isascii() and "\x00" not in text):
        return text
    return _UNSTORABLE.sub("\ufffd", text)


def encode_message(message: Message) -> str:
    """The stored form: the OpenAI dict with our metadata, so the round trip is lossless."""
    return json_text(message_to_openai(message, with_meta=True))


def read_as_pinned(message: Message) -> bool:
    """Whether a store reads ``message`` back among the pinned ones
    (:meth:`SessionStore.pinned`): a pinned message or a system prompt, which every build
    reads whatever the tail holds."""
    return message.pinned or message.role == "system"


def decode_message(text: str, seq: int) -> Message:
    try:
        return message_from_openai(json.loads(text), index=seq)
    except (ValueError, TypeError) as exc:  # InvalidMessageError is a ValueError too
        raise StoreError(f"stored message {seq} cannot be read back: {exc}") from exc


def _usage_dict(usage: Usage) -> dict[str, int]:
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cached_input_tokens": usage.cached_input_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "calls": usage.calls,
    }


def encode_usage(by_model: Mapping[str, Usage], dollars: float) -> str:
    """Usage per model (so cost can use each model's prices) and the dollars so far."""
    return json.dumps(
        {"by_model": {m: _usage_dict(u) for m, u in by_model.items()}, "dollars": dollars}
    )


def decode_usage(text: str | None) -> tuple[dict[str, Usage], float]:
    data = json.loads(text) if text else {}
    by_model = {m: Usage(**u) for m, u in data.get("by_model", {}).items()}
    return by_model, float(data.get("dollars", 0.0))
