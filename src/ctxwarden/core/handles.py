"""Stable handles: how a placeholder, a truncation marker or a recalled passage names the
message it stands for, so the agent (or the proxy) can get the original back.

A handle is ``cw:msg:`` followed by the message's id. Ids never change (an explicit id,
the ``m<seq>`` a session store gives, or one derived from the content), so a handle is
byte-identical at every turn and the prompt prefix that shows it stays cached.
:data:`RECALL_TOOL_NAME` is the tool that takes a handle and returns the original
(:mod:`ctxwarden.session.recall`); a step that names it (truncation's marker) reads it here.
"""

from __future__ import annotations

from ctxwarden.core.errors import UnknownHandleError

__all__ = ["HANDLE_PREFIX", "RECALL_TOOL_NAME", "handle_for", "message_id_of"]

HANDLE_PREFIX = "cw:msg:"
RECALL_TOOL_NAME = "ctxwarden_recall"


def handle_for(message_id: str) -> str:
    """The handle of the message with ``message_id``."""
    return HANDLE_PREFIX + message_id


def message_id_of(handle: str) -> str:
    """The message id a handle names; :class:`~ctxwarden.core.errors.UnknownHandleError` for
    anything that is not ``cw:msg:<id>`` (surrounding spaces and quotes, which models
    sometimes add, are ignored)."""
    if not isinstance(handle, str):
        raise UnknownHandleError(repr(handle), f"a handle is a string, got {type(handle).__name__}")
    text = handle.strip().strip("\"'`[]").strip()
    if not text.startswith(HANDLE_PREFIX) or len(text) == len(HANDLE_PREFIX):
        raise UnknownHandleError(handle, "handles look like cw:msg:<message id>, e.g. cw:msg:m12")
    return text[len(HANDLE_PREFIX) :]
