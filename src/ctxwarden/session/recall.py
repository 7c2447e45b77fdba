"""Reversible compression: the recall tool, and recalling a message by its handle.

Every message a build masks, truncates or leaves out is named in the context by a stable
handle (``cw:msg:<id>``, :mod:`ctxwarden.core.handles`): in a masked result's
placeholder, after a truncated result's cut, before a recalled passage. Offer the model
:func:`recall_tool` and answer its calls with the original:

* :func:`recall` over the history you hold (``build_context`` users);
* :meth:`ctxwarden.Session.recall` from a session's store (SQLite, PostgreSQL), which also
  records the recall in the session's audit trail (the builds listing);
* ``ctxwarden serve`` with ``recall_tool = true`` in its policy answers the calls itself.

The original comes back byte for byte: a text content as it was appended; an assistant
message that only called tools as its calls in JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ctxwarden.core.errors import UnknownHandleError
from ctxwarden.core.handles import RECALL_TOOL_NAME, handle_for, message_id_of
from ctxwarden.core.messages import Message
from ctxwarden.steps.base import Action

if TYPE_CHECKING:
    from ctxwarden.store.base import SessionStore

__all__ = [
    "RECALL_TOOL_NAME",
    "Recalled",
    "audit_recall",
    "find_stored",
    "original_content",
    "recall",
    "recall_arguments",
    "recall_tool",
]

_STORE_ID = re.compile(r"m[0-9]{1,18}")  # the id a store gives a message without one
_DESCRIPTION = (
    "Get back, verbatim, an earlier message of this conversation that the context shows "
    "only in part (a masked or truncated tool result, a recalled passage, a message left "
    "out). Pass the handle shown with it, such as cw:msg:m12."
)
_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "handle": {
            "type": "string",
            "description": "The handle shown in the context, e.g. cw:msg:m12.",
        }
    },
    "required": ["handle"],
    "additionalProperties": False,
}


def recall_tool(shape: Literal["openai", "anthropic"] = "openai") -> dict[str, Any]:
    """The recall tool's definition, as the ``tools`` entry of an OpenAI chat request
    (``shape="openai"``) or of an Anthropic Messages request (``shape="anthropic"``)."""
    parameters = json.loads(json.dumps(_PARAMETERS))  # a fresh copy the caller may edit
    if shape == "openai":
        return {
            "type": "function",
            "function": {
                "name": RECALL_TOOL_NAME,
                "description": _DESCRIPTION,
                "parameters": parameters,
            },
        }
    if shape == "anthropic":
        return {"name": RECALL_TOOL_NAME, "description": _DESCRIPTION, "input_schema": parameters}
    raise ValueError(f"shape must be 'openai' or 'anthropic', got {shape!r}")


def recall_arguments(arguments: str | Mapping[str, Any]) -> str:
    """The handle in a recall call's arguments (JSON text, or the parsed object);
    :class:`~ctxwarden.core.errors.UnknownHandleError` when there is none."""
    value: Any = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise UnknownHandleError(arguments, "the call's arguments are not JSON") from None
    handle = value.get("handle") if isinstance(value, Mapping) else None
    if not isinstance(handle, str):
        raise UnknownHandleError(str(arguments), 'the call needs {"handle": "cw:msg:<id>"}')
    return handle


def original_content(message: Message) -> str:
    """What a recall returns for ``message``: its text content exactly; for an
    assistant message that only called tools, those calls as JSON."""
    if isinstance(message.content, str) and message.content:
        return message.content
    if message.tool_calls:
        calls = [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls]
        text = message.text
        return (text + "\n" if text else "") + json.dumps({"tool_calls": calls})
    return message.text


@dataclass(frozen=True)
class Recalled:
    """One recall: the handle asked for, the message it names, its original content and
    that content's tokens. :attr:`action` is its audit entry."""

    handle: str
    message: Message
    content: str
    tokens: int
    seq: int | None = None  # the stored sequence number, for a session's recall

    @property
    def action(self) -> Action:
        return Action(
            self.message.id,
            "recalled",
            "recalled by handle (the recall tool)",
            0,
            self.tokens,
            "recall_tool",
        )

    def to_dict(self) -> dict[str, Any]:
        """The audit record of this recall (JSON-ready)."""
        return {
            "handle": self.handle,
            "message_id": self.message.id,
            "seq": self.seq,
            "role": self.message.role,
            "tokens": self.tokens,
        }


def recalled(message: Message, model: str, seq: int | None = None) -> Recalled:
    """The :class:`Recalled` of ``message``, its content counted for ``model``."""
    from ctxwarden.core.tokens.counter import TokenCounter

    content = original_content(message)
    tokens = TokenCounter.for_model(model).count_text(content)
    return Recalled(handle_for(message.id), message, content, tokens, seq)


def recall(
    messages: Iterable[Message | Mapping[str, Any]], handle: str, *, model: str = "gpt-4o"
) -> Recalled:
    """The message ``handle`` names in ``messages`` (the history you built from), with
    its original content; :class:`~ctxwarden.core.errors.UnknownHandleError` when no message
    has that id. ``model`` counts its tokens for the audit entry."""
    from ctxwarden.formats.openai import messages_from_openai

    wanted = message_id_of(handle)
    items = list(messages)
    history: Sequence[Message] = (
        items  # type: ignore[assignment]
        if all(isinstance(m, Message) for m in items)
        else messages_from_openai(items)
    )
    for message in history:
        if message.id == wanted:
            return recalled(message, model)
    raise UnknownHandleError(handle, f"no message with id {wanted!r} in this history")


def find_stored(
    store: SessionStore, tenant: str, session_id: str, handle: str
) -> tuple[int, Message]:
    """The ``(seq, message)`` a handle names in a stored session: a store-given id
    (``m<seq>``) by one indexed read, any other id by reading the messages in batches."""
    wanted = message_id_of(handle)
    if _STORE_ID.fullmatch(wanted):
        seq = int(wanted[1:])
        rows = store.range(tenant, session_id, seq, seq + 1)
        if rows and rows[0].message.id == wanted:
            return rows[0].seq, rows[0].message
    for stored in store.iter_messages(tenant, session_id):
        if stored.message.id == wanted:
            return stored.seq, stored.message
    raise UnknownHandleError(handle, f"no message with id {wanted!r} in session {session_id!r}")


def audit_recall(store: SessionStore, tenant: str, session_id: str, found: Recalled) -> None:
    """Record a recall with the session's builds (a ``recalled`` row, on the SQL stores;
    another store has no builds table, and the caller has the :class:`Recalled`)."""
    import uuid
    from dataclasses import asdict

    from ctxwarden.store._sql import SqlStore
    from ctxwarden.store.service_tables import record_build

    if not isinstance(store, SqlStore):
        return
    record_build(
        store,
        tenant,
        session_id,
        build_id="recall-" + uuid.uuid4().hex,
        model="",
        history_tokens=0,
        input_tokens=found.tokens,
        audit={"recalled": [found.to_dict()], "actions": [asdict(found.action)]},
        status="recalled",
    )
