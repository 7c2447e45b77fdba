"""Reading a conversation from a JSON file: what every CLI command starts from.

A transcript is either a list of OpenAI chat messages or an object with ``messages``
and optional ``tools`` (and ``model``) — the body of a chat-completions request, so a
logged request can be fed in unchanged. Other keys of such an object are ignored.
Every problem is an :class:`InvalidMessageError` that names the source and, for a bad
message, its index and field; the pairing of tool calls and results is checked too,
because a provider would reject the request anyway.

Example transcripts ship in the package (``ctxwarden/examples/*.json``) so the main
commands run on a fresh machine with no data of one's own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import Message
from ctxwarden.core.pairing import validate_pairing
from ctxwarden.formats.openai import messages_from_openai

__all__ = [
    "Transcript",
    "decode_json",
    "example_names",
    "load_example",
    "parse_transcript",
    "read_text",
    "read_transcript",
]


@dataclass(frozen=True)
class Transcript:
    """Messages, tool definitions (OpenAI ``tools=`` shape) and the model named in the file."""

    messages: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    model: str | None = None
    source: str = "<transcript>"


def decode_json(text: str, *, source: str) -> Any:
    """JSON text decoded; a syntax error names ``source``, the line and the column."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidMessageError(
            f"{source} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None


def read_text(path: str | Path) -> str:
    """A transcript file's text; a missing or unreadable file is an InvalidMessageError."""
    try:
        return Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise InvalidMessageError(f"cannot read transcript {path}: {reason}") from None


def parse_transcript(text: str, *, source: str = "<transcript>") -> Transcript:
    """Parse transcript JSON text; errors name ``source``, the message index and field."""
    return transcript_from_data(decode_json(text, source=source), source=source)


def transcript_from_data(data: Any, *, source: str = "<transcript>") -> Transcript:
    """Build a :class:`Transcript` from already-decoded JSON."""
    tools: Any = []
    model: Any = None
    if isinstance(data, Mapping):
        if "messages" not in data:
            raise _located(source, "an object transcript needs a 'messages' list", "messages")
        raw, tools, model = data["messages"], data.get("tools") or [], data.get("model")
    else:
        raw = data
    if not isinstance(raw, list):
        raise _located(
            source,
            "expected a list of chat messages or an object with 'messages', "
            f"got {type(raw).__name__}",
            "messages",
        )
    if model is not None and not isinstance(model, str):
        raise _located(source, "'model' must be a string", "model")
    try:
        messages = messages_from_openai(raw)
        validate_pairing(messages)
    except InvalidMessageError as exc:
        raise _located(source, str(exc), exc.field, exc.index) from None
    return Transcript(tuple(messages), _check_tools(tools, source), model, source)


def _located(
    source: str, reason: str, field: str | None = None, index: int | None = None
) -> InvalidMessageError:
    """An error whose text starts with the source; ``index`` and ``field`` kept as data."""
    error = InvalidMessageError(f"{source}: {reason}")
    error.index, error.field = index, field
    return error


def _check_tools(tools: Any, source: str) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(tools, list):
        raise _located(source, "'tools' must be a list", "tools")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise _located(
                source,
                f"tool {i} must look like "
                '{"type": "function", "function": {"name": ..., "parameters": {...}}}',
                "tools",
            )
    return tuple(tools)


def read_transcript(path: str | Path) -> Transcript:
    """Read a transcript file; a missing or unreadable file is an :class:`InvalidMessageError`."""
    return parse_transcript(read_text(path), source=str(path))


def example_names() -> list[str]:
    """Names of the transcripts shipped in ``ctxwarden/examples``."""
    folder = resources.files("ctxwarden").joinpath("examples")
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def load_example(name: str = "support_chat") -> Transcript:
    """A transcript shipped with the package (see :func:`example_names`)."""
    if name not in example_names():
        raise InvalidMessageError(
            f"no example transcript {name!r}; available: {', '.join(example_names())}"
        )
    text = resources.files("ctxwarden").joinpath("examples", f"{name}.json").read_text("utf-8")
    return parse_transcript(text, source=f"example:{name}")
