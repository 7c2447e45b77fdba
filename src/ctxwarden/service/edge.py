"""What every route checks once, at the service edge, in the body it was sent.

**The text rule.** A request whose JSON holds a lone surrogate (``"\\ud800"``: a
truncated UTF-16 pair from a JavaScript tool, a cut emoji) is refused with a 400 that
names the message and the field (``messages[3].content[0].text``), code
``invalid_unicode``; nothing of it is stored. It is never replaced: a provider refuses
such text too, and a silent U+FFFD would make the client's next call (which sends the
original again) differ from what the store holds. NUL is valid Unicode and is kept in
message text (the store writes messages as JSON, where it is escaped, and reads it back
exactly); it is refused where a value goes to a plain text column: a session id
(:mod:`ctxwarden.store.ids`) and the model name. ``NaN`` and ``Infinity``, which are
not JSON, are refused too (``invalid_json``).

**Nesting.** Deep nesting is refused (400, ``nesting_too_deep``) by a limit before a
recursive parser can fail: orjson refuses past its own 1,024 levels, and the stdlib's
parser (used only for what orjson refuses) runs after :func:`json_depth` measured the
body against :data:`MAX_PARSE_DEPTH`. Message values are held to
:data:`ctxwarden.core.checks.MAX_DEPTH` (100) when parsed; a value elsewhere in the
body nested deep enough to exhaust a later recursive step (the stdlib's encoder) is
answered with the same 400 (:func:`ctxwarden.service.failures.unexpected`).

The checks cost nothing on a clean body: orjson refuses exactly lone surrogates,
``NaN`` and deep nesting, so the walk that names the field runs only on a body orjson
refused; a body read through :class:`~ctxwarden.service.body_memo.BodyMemo` is checked
by :func:`check_raw` (a search of the raw bytes, and orjson on a hit).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import orjson

from ctxwarden.service.errors import ServiceError

__all__ = [
    "MAX_PARSE_DEPTH",
    "check_model",
    "check_raw",
    "json_depth",
    "lone_surrogate",
    "parse_checked",
    "readable",
    "too_deep",
]

MAX_PARSE_DEPTH = 512
"""How deep a request body may nest (objects and arrays): well above any real request,
well below what the stdlib's recursive parser and encoder can take."""

#: a surrogate escape in JSON text (``\ud83d``): half of a pair, or alone
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE_PAIR = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_STRUCTURE = bytes(range(256)).translate(None, b'[]{}"\\')  # every byte but these
_ESCAPED = re.compile(rb"\\.", re.S)


def too_deep(limit: int = MAX_PARSE_DEPTH) -> ServiceError:
    return ServiceError(
        400,
        f"the request nests objects and arrays more than {limit} deep; send flatter JSON",
        code="nesting_too_deep",
    )


def json_depth(raw: bytes) -> int:
    """How deep the JSON text ``raw`` nests, counted without parsing it (strings and
    their escapes left out): the guard in front of the stdlib's recursive parser."""
    s = raw.translate(None, _STRUCTURE)
    if b"\\" in s:
        s = _ESCAPED.sub(b"", s)
    outside = b"".join(s.split(b'"')[::2])  # what is not inside a string
    best = depth = 0
    for c in outside:
        if c in b"[{":
            depth += 1
            best = max(best, depth)
        else:
            depth -= 1
    return best


def _refuse_constant(name: str) -> Any:
    raise ServiceError(
        400, f"request body is not JSON: {name} is not a JSON value", code="invalid_json"
    )


def parse_checked(raw: bytes) -> Any:
    """``raw`` parsed under the edge's rules (see the module): orjson, and for what it
    refuses the stdlib's parser behind the depth guard, then the text rule."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "recursion" in str(exc).lower():
            raise too_deep() from None
    if json_depth(raw) > MAX_PARSE_DEPTH:
        raise too_deep()
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except ValueError as exc:  # (UnicodeDecodeError too)
        raise ServiceError(400, f"request body is not JSON: {exc}", code="invalid_json") from None
    found = lone_surrogate(data)
    if found is not None:
        path, text, at = found
        raise ServiceError(
            400,
            f"{path}: invalid Unicode, a lone surrogate U+{ord(text[at]):04X} at character "
            f"{at} (a cut UTF-16 pair); send the text as valid UTF-8",
            code="invalid_unicode",
            param=path,
        )
    return data


def check_raw(raw: bytes, *, start: int = 0, nonfinite: bool = False) -> None:
    """Apply :func:`parse_checked`'s refusals to a body another reader parsed (the body
    memo, which reads only the text after ``start``: what came before was checked when
    it was new): parsed again only when that text may hold a lone surrogate escape, or
    ``nonfinite`` says it may hold ``NaN``/``Infinity``."""
    if nonfinite or _lone_escape(raw, start):
        parse_checked(raw)


def _lone_escape(raw: bytes, start: int = 0) -> bool:
    """Whether ``raw`` after ``start`` may hold a lone surrogate escape: what is left of
    its surrogate escapes once the pairs (one character written the ASCII way) are
    taken out. At C speed; a false "may" (an escaped backslash before ``ud800``) costs
    a parse by orjson, which refuses exactly the lone ones."""
    if raw.find(b"\\u", start) < 0:
        return False
    text = raw[start:] if start else raw
    if len(text) > 64 * 1024:  # a whole body (a session's first): orjson is faster
        return _SURROGATE_ESCAPE.search(text) is not None
    return _SURROGATE_ESCAPE.search(_SURROGATE_PAIR.sub(b"", text)) is not None


def check_model(model: str) -> None:
    """The model name goes to text columns (the build log): no NUL."""
    if "\x00" in model:
        raise ServiceError(400, "model must not contain NUL", code="invalid_unicode", param="model")


def lone_surrogate(value: Any) -> tuple[str, str, int] | None:
    """The first text in ``value`` (keys included) holding a lone surrogate: its path
    (``messages[3].content``), the text and the character's index; None when all is
    valid Unicode. Iterative (any depth)."""
    for path, text in _texts(value):
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            return path, text, exc.start
    return None


def _texts(value: Any) -> Iterator[tuple[str, str]]:
    stack: list[tuple[str, Any]] = [("body", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            yield path, item
        elif isinstance(item, dict):
            for key, sub in reversed(item.items()):
                where = f"{path}.{key}" if path != "body" else str(key)
                yield where + " (a key)", key
                stack.append((where, sub))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", sub) for i, sub in reversed(list(enumerate(item))))


_SURROGATE = re.compile("[\ud800-\udfff]")


def readable(value: Any) -> Any:
    """``value`` with every lone surrogate read as U+FFFD, for an answer that must be
    UTF-8: a session stored before the text rule may hold one, and reading it never
    fails (the stored value is unchanged). Copies only the containers that change."""
    if isinstance(value, str):
        if value.isascii():
            return value
        try:
            value.encode()
        except UnicodeEncodeError:
            return _SURROGATE.sub("\ufffd", value)
        return value
    if isinstance(value, dict):
        pairs = [(readable(k), readable(v)) for k, v in value.items()]
        same = all(k is a and v is b for (k, v), (a, b) in zip(pairs, value.items(), strict=True))
        return value if same else dict(pairs)
    if isinstance(value, list | tuple):
        items = [readable(v) for v in value]
        return (
            value if all(a is b for a, b in zip(items, value, strict=True)) else type(value)(items)
        )
    return value
