"""Which value of a model's JSON answer the end of the text cut off.

A fact extractor's answer can stop mid-value (``max_tokens``, a dropped connection):
``{"budget": "1,500 EUR", "order": "ORD-``. ``json_repair`` closes it and returns
``"order": "ORD-"``, a wrong order id that would be stored verbatim and kept until a
newer one replaces it. :func:`cut_value_path` scans the answer once (linear, no
recursion) and names the path of the value the text ended inside, so the parser drops
that one value and keeps the complete ones.

A value is cut when the text ends inside a string (a key or a value), or, when the
answer is known to be truncated (``finish_reason`` ``length``), inside a bare number
or literal. An answer that only lacks its closing brackets (``{"size": "L", "budget":
1500``) loses nothing: small models do that when they are done.
"""

from __future__ import annotations

from typing import Any

__all__ = ["cut_value_path", "drop_path"]

Path = tuple[str | int, ...]


class _Frame:
    """One open container: an object (``key`` is the current key) or an array."""

    __slots__ = ("index", "is_object", "key", "want_key")

    def __init__(self, is_object: bool) -> None:
        self.is_object = is_object
        self.want_key = is_object
        self.key: str | None = None
        self.index = 0

    def here(self) -> str | int | None:
        return self.key if self.is_object else self.index


def _path(stack: list[_Frame]) -> Path | None:
    """The keys and indices down to the value being read. A list is one value (a cart,
    a list of ids): cut inside, it is dropped whole, except a top-level list whose items
    are separate facts (``[{"key": ..., "value": ...}, ...]``)."""
    parts = [frame.here() for frame in stack]
    if any(p is None for p in parts):
        return None
    path = tuple(p for p in parts if p is not None)
    if path and isinstance(path[0], int):  # a top-level list: drop the cut item whole
        return path[:1]
    for i, part in enumerate(path):
        if isinstance(part, int):
            return path[:i]
    return path


def cut_value_path(text: str, *, truncated: bool = False) -> Path | None:
    """The path (keys and indices) of the value ``text`` ends inside, or ``None``."""
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return None
    stack: list[_Frame] = []
    quote: str | None = None
    escaped = False
    chars: list[str] = []  # the string being read (a key needs its text)
    bare = False  # inside a number or literal
    for ch in text[start:]:
        if quote is not None:
            if escaped:
                escaped = False
                chars.append(ch)
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
                if stack and stack[-1].want_key:
                    stack[-1].key, stack[-1].want_key = "".join(chars), False
            else:
                chars.append(ch)
            continue
        if ch in "\"'":
            quote, chars, bare = ch, [], False
        elif ch in "{[":
            stack.append(_Frame(ch == "{"))
            bare = False
        elif ch in "}]":
            if stack:
                stack.pop()
            bare = False
            if not stack:
                return None  # the first object is complete: later text is not ours
        elif ch == ",":
            if stack:
                frame = stack[-1]
                frame.index += 1
                frame.want_key = frame.is_object
            bare = False
        elif ch == ":":
            if stack and stack[-1].want_key and bare:  # the end of an unquoted key
                stack[-1].key, stack[-1].want_key = "".join(chars), False
            bare = False
        elif ch.isspace():
            bare = False
        elif stack:
            if stack[-1].want_key:  # an unquoted key (``{size: 'L'}``)
                chars = [*chars, ch] if bare else [ch]
                bare = True
                continue
            bare = True
    if quote is not None:
        if stack and stack[-1].want_key:  # cut inside a key: json_repair may keep it
            return (*(_path(stack[:-1]) or ()), "".join(chars))
        return _path(stack)
    if bare and truncated and stack and not stack[-1].want_key:
        return _path(stack)
    return None


def drop_path(value: Any, path: Path) -> bool:
    """Remove the entry at ``path`` from nested dicts/lists; whether it was there."""
    node = value
    for part in path[:-1]:
        in_dict = isinstance(node, dict) and isinstance(part, str) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and part < len(node)
        if not (in_dict or in_list):
            return False
        node = node[part]
    last = path[-1] if path else None
    if isinstance(node, dict) and isinstance(last, str) and last in node:
        del node[last]
        return True
    if isinstance(node, list) and isinstance(last, int) and last < len(node):
        del node[last]
        return True
    return False
