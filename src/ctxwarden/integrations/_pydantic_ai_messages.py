"""pydantic-ai messages <-> :class:`~ctxwarden.core.messages.Message`, part by part.

A ``ModelRequest`` holds several parts; each system prompt, user prompt and tool
return becomes its own message, so the window can keep a tool return with its call
and drop the rest of the request; parts we do not model (instruction deltas and the
like) travel with their neighbour. A ``ModelResponse`` is one assistant message
(text, tool calls, thinking counted as a raw part). Going back (:func:`messages_back`),
kept parts are put back into copies of their own requests; an unchanged message is the
very object. A message holding a ``CompactionPart`` is pinned, so it is always sent,
unchanged. ctxwarden's layers become system prompt parts after the system prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from ctxwarden.core.errors import MissingDependencyError
from ctxwarden.core.messages import ImagePart, Message, Part, RawPart, TextPart, ToolCall
from ctxwarden.integrations._common import is_layer, stable_id

try:
    from pydantic_ai import messages as pm
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxwarden.integrations.pydantic_ai", "pydantic-ai") from exc

__all__ = ["Converted", "instructions_of", "messages_back", "messages_from_pydantic"]

_Origin = tuple[int, tuple[int, ...]]  # (message index, part indices)


@dataclass(frozen=True)
class Converted:
    """Our messages for a pydantic-ai history, and where each one came from."""

    messages: list[Message]
    origins: dict[str, _Origin]


def _user_part(item: Any) -> Part:
    if isinstance(item, str):
        return TextPart(item)
    if isinstance(item, pm.ImageUrl):
        return ImagePart(url=item.url)
    return RawPart({"type": type(item).__name__, "text": str(getattr(item, "url", ""))})


def _request_message(part: Any, k: int, j: int) -> Message | None:
    key = stable_id("pai", k, [j, part.part_kind, repr(part)[:400]])
    if isinstance(part, pm.SystemPromptPart):
        return Message.system(part.content, id=key)
    if isinstance(part, pm.UserPromptPart):
        content = part.content
        if isinstance(content, str):
            return Message.user(content, id=key)
        return Message.user(tuple(_user_part(c) for c in content), id=key)
    if isinstance(part, pm.BaseToolReturnPart) and part.tool_call_id:
        text = part.model_response_str()
        return Message.tool(text, part.tool_call_id, name=part.tool_name, id=key)
    if isinstance(part, pm.RetryFeedbackPart):
        return Message.user(str(part.model_response()), id=key)
    if isinstance(part, pm.CompactionPart):
        raw = RawPart({"type": "compaction", "text": str(part.content or "")})
        return Message.user((raw,), id=key, pinned=True)
    return None  # travels with its neighbour


def _response_message(response: pm.ModelResponse, k: int) -> Message:
    parts: list[Part] = []
    calls: list[ToolCall] = []
    pinned = False
    for p in response.parts:
        if isinstance(p, pm.TextPart):
            parts.append(TextPart(p.content))
        elif isinstance(p, pm.ToolCallPart):
            calls.append(ToolCall(p.tool_call_id, p.tool_name, p.args_as_json_str()))
        else:
            pinned = pinned or isinstance(p, pm.CompactionPart)
            text = getattr(p, "content", "")
            text = text if isinstance(text, str) else ""
            parts.append(RawPart({"type": p.part_kind, "text": text}))
    content: str | tuple[Part, ...] | None = tuple(parts) or None
    if content and len(parts) == 1 and isinstance(parts[0], TextPart):
        content = parts[0].text
    key = stable_id("pai", k, [repr(p)[:400] for p in response.parts])
    return Message(
        role="assistant", content=content, tool_calls=tuple(calls), id=key, pinned=pinned
    )


def messages_from_pydantic(history: Sequence[pm.ModelMessage]) -> Converted:
    """Our messages for ``history``, each with the message and parts it came from."""
    out: list[Message] = []
    origins: dict[str, _Origin] = {}
    for k, message in enumerate(history):
        if isinstance(message, pm.ModelResponse):
            m = _response_message(message, k)
            out.append(m)
            origins[m.id] = (k, tuple(range(len(message.parts))))
            continue
        pending: list[int] = []  # parts that travel with the next message
        for j, part in enumerate(message.parts):
            m_or_none = _request_message(part, k, j)
            if m_or_none is None:
                if out and origins[out[-1].id][0] == k:
                    last = out[-1].id
                    origins[last] = (k, (*origins[last][1], j))
                else:
                    pending.append(j)
                continue
            out.append(m_or_none)
            origins[m_or_none.id] = (k, (*pending, j))
            pending = []
        if pending and out and origins[out[-1].id][0] == k:
            origins[out[-1].id] = (k, (*origins[out[-1].id][1], *pending))
    return Converted(out, origins)


def messages_back(
    built: Sequence[Message], history: Sequence[pm.ModelMessage], conv: Converted
) -> list[pm.ModelMessage]:
    firsts = {m.id: m for m in conv.messages}
    layers = [pm.SystemPromptPart(m.text) for m in built if is_layer(m) and m.text]
    groups: list[tuple[int, list[Any]]] = []  # (message index, parts)
    for m in built:
        if m.id not in conv.origins:
            continue
        k, indices = conv.origins[m.id]
        original = history[k]
        parts = [original.parts[j] for j in indices]
        first = firsts[m.id]
        if m.content != first.content and isinstance(original, pm.ModelRequest):
            parts = [
                replace(cast(Any, p), content=m.text) if type(p) is pm.ToolReturnPart else p
                for p in parts
            ]
        elif m != first and isinstance(original, pm.ModelResponse):
            parts = _response_parts(m, parts)
        if groups and groups[-1][0] == k:
            groups[-1][1].extend(parts)
        else:
            groups.append((k, parts))
    out: list[pm.ModelMessage] = []
    for k, parts in groups:
        original = history[k]
        same = len(parts) == len(original.parts) and all(
            a is b for a, b in zip(parts, original.parts, strict=True)
        )
        out.append(original if same else replace(cast(Any, original), parts=parts))
    if layers:
        out = _with_layers(out, layers)
    return out


def _response_parts(m: Message, parts: list[Any]) -> list[Any]:
    """A response's parts as the build sent ``m`` (the eviction's last resort cuts the
    newest call's text or arguments): its one text part with the built text, each call
    with its built arguments in the form it came in (a JSON string or a dict)."""
    calls = {c.id: c for c in m.tool_calls}
    texts = [p for p in parts if isinstance(p, pm.TextPart)]
    out: list[Any] = []
    for p in parts:
        if isinstance(p, pm.ToolCallPart) and p.tool_call_id in calls:
            built = calls[p.tool_call_id]
            if built.arguments != p.args_as_json_str():
                args = built.arguments if isinstance(p.args, str) else built.parsed_arguments()
                p = replace(p, args=args)
        elif isinstance(p, pm.TextPart) and len(texts) == 1 and p.content != m.text:
            p = replace(p, content=m.text)
        out.append(p)
    return out


def _with_layers(out: list[pm.ModelMessage], layers: list[pm.SystemPromptPart]) -> list[Any]:
    """ctxwarden's layers as system prompt parts right after the system prompt."""
    if out and isinstance(out[0], pm.ModelRequest):
        first = out[0]
        n = 0
        while n < len(first.parts) and isinstance(first.parts[n], pm.SystemPromptPart):
            n += 1
        parts = [*first.parts[:n], *layers, *first.parts[n:]]
        return [replace(first, parts=parts), *out[1:]]
    return [pm.ModelRequest(parts=layers), *out]


def instructions_of(history: Sequence[pm.ModelMessage]) -> str | None:
    for message in reversed(history):
        if isinstance(message, pm.ModelRequest):
            return message.instructions
    return None
