"""What the agent was looking for when it called a tool: the terms a cut keeps.

A code listing, a log or a diff is read for something: the function a ``grep -n`` looked
for, the file a ``sed -n`` printed, the name the assistant said it would check. Those
*terms* come from the request that produced the result — the call's arguments and the
assistant's text around the call — never from later messages, so a result is cut the
same way at every turn (the cached prefix holds) and the cut is a function of the
result and its request only.
"""

from __future__ import annotations

import re
from typing import Any

from ctxwarden.core.kinds import load_json
from ctxwarden.core.messages import Message

__all__ = ["argument_values", "request_terms", "stated_terms"]

_SPLIT = re.compile(r"[^\w./-]+")
_QUOTED = re.compile(r"""["'`]([^"'`\n]{3,80})["'`]""")
_CAMEL = re.compile(r"[a-z][A-Z]")
_MAX_TERMS = 48
_LETTER, _DIGIT = re.compile(r"[A-Za-z]"), re.compile(r"\d")


def _distinctive(token: str) -> bool:
    """A path, a dotted name or an identifier (``_``, a camelCase step, a digit)."""
    return len(token) >= 4 and (
        any(c in token for c in "/._") or bool(_CAMEL.search(token)) or token.isdigit()
    )


def _strings(value: Any) -> list[str]:
    """The string leaves of a parsed JSON value (iteratively)."""
    out: list[str] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))
    return out


def _arguments(arguments: str) -> list[str]:
    """A call's argument values; its raw text when that is not JSON (or too deep)."""
    ok, doc = load_json(arguments)
    return _strings(doc) if ok else [arguments]


def request_terms(request: Message | None, call_id: str | None = None) -> tuple[str, ...]:
    """The terms a result was asked for: the quoted words of the call's arguments, and
    the distinctive tokens (paths, dotted names, identifiers) of its arguments and of the
    assistant's text around the call. First seen first, at most 48."""
    if request is None:
        return ()
    arguments = [
        value
        for c in request.tool_calls
        if call_id is None or c.id == call_id
        for value in _arguments(c.arguments)
    ]
    found: dict[str, None] = {}
    for text in arguments:  # a quoted word of a call is searched for: grep -n "def run"
        for quoted in _QUOTED.findall(text):
            for token in _SPLIT.split(quoted):
                token = token.strip("./-")
                if len(token) >= 3 and not token.isdigit():
                    found.setdefault(token, None)
    for text in [*arguments, request.text]:
        for token in _SPLIT.split(text):
            token = token.strip(".-")
            if _distinctive(token):
                found.setdefault(token, None)
    return tuple(found)[:_MAX_TERMS]


def argument_values(request: Message | None, call_id: str | None = None) -> tuple[str, ...]:
    """The values a call's arguments name, whole (3 to 80 characters; numbers too): what
    a JSON result is searched for (``{"reservation_id": "ZFA04Y"}`` asks for the item
    holding ``ZFA04Y``, which no token rule would call distinctive). First seen first."""
    if request is None:
        return ()
    found: dict[str, None] = {}
    for call in request.tool_calls:
        if call_id is not None and call.id != call_id:
            continue
        ok, doc = load_json(call.arguments)
        leaves = _leaves(doc) if ok else []
        for value in leaves:
            if 3 <= len(value) <= 80:
                found.setdefault(value, None)
    return tuple(found)[:_MAX_TERMS]


def _leaves(value: Any) -> list[str]:
    """String and number leaves of a parsed JSON value, as text (booleans left out)."""
    out: list[str] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, int | float) and not isinstance(node, bool):
            out.append(str(node))
        elif isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))
    return out


def stated_terms(text: str) -> tuple[str, ...]:
    """What a user message names that a tool result may hold: its quoted phrases and its
    identifiers — a token with letters and digits (``ORD-10117``, ``ZFA04Y``), a path, a
    dotted or snake name. Used for the results the model has not answered yet, which are
    read for this message (results already answered are cut by their request only, so
    their cut stays the same at every turn)."""
    found: dict[str, None] = {}
    for quoted in _QUOTED.findall(text):
        found.setdefault(quoted.strip(), None)
    for token in _SPLIT.split(text):
        token = token.strip(".-/")
        mixed = len(token) >= 4 and bool(_LETTER.search(token)) and bool(_DIGIT.search(token))
        if mixed or _distinctive(token):
            found.setdefault(token, None)
    return tuple(found)[:_MAX_TERMS]
