"""The session-id grammar: one rule for the proxy, the session API, the page and the store.

A new session id is 1 to :data:`MAX_ID` characters of ``A-Z a-z 0-9 . _ : @ -``, not
starting with ``.`` (so never ``.`` or ``..``): it fits in a URL path segment as it is,
so every id the proxy takes the session API and the page can name. ``~`` is the
proxy's own branch mark (``chat-1~b2``, :data:`BRANCH`): an id with it is readable,
never given by a client. ``/`` is refused: ids with it, which versions before this rule
took from the proxy, stay readable and deletable through the API (its routes take the
id as the rest of the path) but no new one is made.

The store refuses only what it cannot hold (:func:`storable_id_problem`: NUL, invalid
Unicode, more than :data:`MAX_STORED_ID` characters), so a library caller's own ids and
every id stored before the rule keep working.
"""

from __future__ import annotations

import re

__all__ = [
    "BRANCH",
    "GRAMMAR",
    "MAX_ID",
    "MAX_STORED_ID",
    "new_id_problem",
    "readable_id_problem",
    "storable_id_problem",
]

MAX_ID = 200
MAX_STORED_ID = 1000
BRANCH = "~b"
GRAMMAR = f"1-{MAX_ID} characters of A-Z a-z 0-9 . _ : @ -, not starting with '.'"
_FIRST, _REST = "[A-Za-z0-9_:@-]", "[A-Za-z0-9._:@-]"
_NEW = re.compile(f"{_FIRST}{_REST}{{0,{MAX_ID - 1}}}")
_READABLE = re.compile(f"{_FIRST}{_REST}{{0,{MAX_ID - 1}}}(?:~b[0-9]{{1,9}})*")


def storable_id_problem(session_id: str) -> str | None:
    """Why the store cannot hold ``session_id`` (PostgreSQL text takes no NUL, no
    database a lone surrogate), or None."""
    if not session_id:
        return "a session id must not be empty"
    if len(session_id) > MAX_STORED_ID:
        return f"a session id must be at most {MAX_STORED_ID} characters, got {len(session_id):,}"
    if "\x00" in session_id:
        return "a session id must not contain NUL"
    if not session_id.isascii():
        try:
            session_id.encode()
        except UnicodeEncodeError:
            return "a session id must be valid Unicode (it holds a lone surrogate)"
    return None


def new_id_problem(session_id: str) -> str | None:
    """Why a client may not name a session ``session_id`` (see the module), or None."""
    if _NEW.fullmatch(session_id):
        return None
    return f"a session id must be {GRAMMAR}; got {session_id[:60]!r}"


def readable_id_problem(session_id: str) -> str | None:
    """Why ``session_id`` names no session anyone could have made through the service
    now (a new id or one of its branches); None when it could. An id that fails may
    still be stored (made before the rule): readers look it up before refusing."""
    if _READABLE.fullmatch(session_id):
        return None
    return new_id_problem(session_id)
