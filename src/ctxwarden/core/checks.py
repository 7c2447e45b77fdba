"""Checks of untrusted wire values, shared by the OpenAI and Anthropic parsers.

A message that crosses the edge must be something every later step can hash, count,
store and send: JSON values only (objects with string keys, arrays, strings, numbers,
booleans, null), nested at most :data:`MAX_DEPTH` deep (``json.dumps`` and the stores
recurse), and timestamps that PostgreSQL can store. Each check walks iteratively (a
value nested 10,000 deep is an error, not a ``RecursionError``) and raises
:class:`~ctxwarden.core.errors.InvalidMessageError` with the message index and the field.

Text itself is never refused: lone surrogates (``"\\ud800"``, which ``json.loads``
produces from ``"\\\\ud800"``), NUL and any mix of scripts are kept as they are. Hashing
encodes them with ``surrogatepass`` and the stores write JSON with such characters
escaped, so nothing is lost on the way to SQLite or PostgreSQL.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ctxwarden.core.errors import InvalidMessageError

__all__ = ["MAX_DEPTH", "check_json_value", "parse_created_at"]

MAX_DEPTH = 100
"""How deep a structured value (an unmodelled key, a raw content part, ``meta``) may nest."""


def check_json_value(value: Any, *, index: int | None, field: str) -> None:
    """Raise unless ``value`` is plain JSON data at most :data:`MAX_DEPTH` deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if item is None or isinstance(item, str | bool | int):
            continue
        if isinstance(item, float):
            continue  # NaN/inf are what Python's json writes and reads back
        if depth > MAX_DEPTH:
            raise InvalidMessageError(
                f"nested more than {MAX_DEPTH} levels deep", index=index, field=field
            )
        if isinstance(item, Mapping):
            for key, sub in item.items():
                if not isinstance(key, str):
                    raise InvalidMessageError(
                        f"object keys must be strings, got {type(key).__name__}",
                        index=index,
                        field=field,
                    )
                stack.append((sub, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((sub, depth + 1) for sub in item)
        else:
            raise InvalidMessageError(
                f"must hold JSON values only, got {type(item).__name__}", index=index, field=field
            )


def parse_created_at(value: Any, *, index: int | None = None) -> float | None:
    """A timestamp as POSIX seconds: a finite number, or an ISO-8601 date-time string
    (``2026-12-01T10:00:00Z``; one without a zone is taken as UTC)."""
    field = "ctxwarden.created_at"
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidMessageError(
            "must be a number or an ISO-8601 string", index=index, field=field
        )
    if isinstance(value, int | float):
        seconds = float(value)
        if not math.isfinite(seconds):
            raise InvalidMessageError(
                f"must be a finite timestamp, got {value!r}", index=index, field=field
            )
        return seconds
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            raise InvalidMessageError(
                f"must be an ISO-8601 date-time (such as 2026-12-01T10:00:00Z) or POSIX "
                f"seconds, got {value[:60]!r}",
                index=index,
                field=field,
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    raise InvalidMessageError(
        f"must be a number or an ISO-8601 string, got {type(value).__name__}",
        index=index,
        field=field,
    )
