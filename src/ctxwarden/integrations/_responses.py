"""Responses-API input items <-> :class:`~ctxwarden.core.messages.Message` (for openai-agents).

A Responses history is a flat list of items; ours is a list of chat messages. The
mapping keeps what the build needs to decide and what the API needs to accept:

- a run of consecutive model-side items (``reasoning``, an assistant ``message``,
  ``function_call`` and the other ``*_call`` items) becomes **one** assistant message:
  its text is the assistant text, its tool calls are the calls (``call_id``, name,
  arguments), and reasoning and hosted-tool items ride along as raw parts (counted,
  not shown as text). So a reasoning item is kept or dropped with the item after it,
  which the API requires, and parallel calls stay one block with their outputs;
- a ``*_call_output`` item becomes a tool result carrying its ``call_id``;
- a user / system / developer message becomes that message (``input_text`` as text
  parts, ``input_image`` by URL as image parts, anything else a raw part);
- any other item stands alone as a user-side raw part.

Every message keeps its exact items under ``meta["openai_agents"]["items"]``, so going
back returns the items as given; a tool result the build masked or truncated goes back
as its item with the new ``output``, and an assistant message whose text or call the build
cut (its last resort) as its items with the new text and arguments.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import (
    ImagePart,
    Message,
    Part,
    RawPart,
    TextPart,
    ToolCall,
    sole_text,
)
from ctxwarden.formats.responses import call_item
from ctxwarden.formats.responses import item_kind as _kind
from ctxwarden.integrations._common import stable_id

__all__ = ["item_dict", "items_from_message", "messages_from_items"]

META = "openai_agents"
_CALLS = {
    "function_call",
    "custom_tool_call",
    "computer_call",
    "local_shell_call",
    "shell_call",
    "apply_patch_call",
}
_HOSTED = {
    "reasoning",
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "tool_search_call",
    "compaction",
}
_OUTPUTS = {f"{c}_output" for c in _CALLS} | {"tool_search_output"}
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def item_dict(item: Any) -> dict[str, Any]:
    """An input item as a plain dict (the SDK passes dicts; models are dumped)."""
    if isinstance(item, Mapping):
        return dict(item)
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        return dict(dump(mode="json", exclude_unset=True))
    raise InvalidMessageError(f"an input item must be a dict, got {type(item).__name__}")


def _model_side(item: Mapping[str, Any]) -> bool:
    kind = _kind(item)
    if kind == "message":
        return item.get("role") == "assistant"
    return kind in _CALLS or kind in _HOSTED


def _part(raw: Any) -> Part:
    if isinstance(raw, Mapping):
        kind, keys = raw.get("type"), set(raw)
        if kind in ("input_text", "output_text") and isinstance(raw.get("text"), str):
            return TextPart(raw["text"])
        image = raw.get("image_url")
        plain = keys <= {"type", "image_url", "detail"}
        if kind == "input_image" and isinstance(image, str) and plain:
            return ImagePart(url=image, detail=raw.get("detail"))
        return RawPart(dict(raw))
    return TextPart(str(raw))


def _content(raw: Any) -> str | tuple[Part, ...]:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, Sequence):
        return tuple(_part(p) for p in raw)
    return ""


def _call(item: Mapping[str, Any]) -> ToolCall:
    kind = _kind(item)
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidMessageError(f"a {kind} item needs a call_id", field="call_id")
    if kind == "function_call":
        return ToolCall(id=call_id, name=str(item.get("name", "")), arguments=item["arguments"])
    payload = item.get("input", item.get("action", {}))
    args = payload if isinstance(payload, str) else json.dumps(payload, sort_keys=True)
    return ToolCall(id=call_id, name=str(item.get("name") or kind), arguments=args)


def _assistant(run: list[dict[str, Any]], index: int) -> Message:
    parts: list[Part] = []
    calls: list[ToolCall] = []
    for item in run:
        if _kind(item) == "message":
            c = _content(item.get("content"))
            parts.extend((TextPart(c),) if isinstance(c, str) else c)
        elif _kind(item) in _CALLS:
            calls.append(_call(item))
        else:
            parts.append(RawPart(item))
    content: str | tuple[Part, ...] | None = tuple(parts) or None
    if content and len(parts) == 1 and isinstance(parts[0], TextPart):
        content = parts[0].text
    return Message(
        role="assistant",
        content=content,
        tool_calls=tuple(calls),
        id=_id(run, index),
        meta={META: {"items": run}},
    )


def _single(item: dict[str, Any], index: int) -> Message:
    kind = _kind(item)
    meta = {META: {"items": [item]}}
    if kind in _OUTPUTS:
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidMessageError(f"a {kind} item needs a call_id", index=index)
        output = item.get("output", "")
        content = _content(output) if not isinstance(output, Mapping) else json.dumps(output)
        return Message(
            role="tool", content=content, tool_call_id=call_id, id=_id([item], index), meta=meta
        )
    if kind == "message" and item.get("role") in _ROLES:
        return Message(
            role=_ROLES[item["role"]],  # type: ignore[arg-type]
            content=_content(item.get("content")),
            id=_id([item], index),
            meta=meta,
        )
    return Message(role="user", content=(RawPart(item),), id=_id([item], index), meta=meta)


def _id(run: Sequence[Mapping[str, Any]], index: int) -> str:
    return stable_id("oa", index, list(run))


def messages_from_items(items: Sequence[Any]) -> list[Message]:
    """Input items as our messages (model-side runs grouped, see the module docstring)."""
    dicts = [item_dict(i) for i in items]
    out: list[Message] = []
    i = 0
    while i < len(dicts):
        if _model_side(dicts[i]):
            j = i
            while j < len(dicts) and _model_side(dicts[j]):
                j += 1
            out.append(_assistant(dicts[i:j], i))
            i = j
        else:
            out.append(_single(dicts[i], i))
            i += 1
    return out


def _output(content: str | tuple[Part, ...] | None) -> str | list[dict[str, Any]]:
    if content is None or isinstance(content, str):
        return content or ""
    out: list[dict[str, Any]] = []
    for p in content:
        if isinstance(p, TextPart):
            out.append({"type": "input_text", "text": p.text})
        elif isinstance(p, ImagePart):
            image: dict[str, Any] = {"type": "input_image", "image_url": p.url}
            if p.detail is not None:
                image["detail"] = p.detail
            out.append(image)
        else:
            out.append(dict(p.data))
    return out


def items_from_message(message: Message, first: Message | None = None) -> list[dict[str, Any]]:
    """The items of one of our messages: as given when ``message`` is unchanged from its
    conversion ``first``; a changed tool result or input message gets its new content, a
    changed assistant message its text and its calls' arguments as built."""
    items: list[dict[str, Any]] = list(message.meta.get(META, {}).get("items", []))
    if not items:  # not from the SDK: an input message of its role
        role = "developer" if message.role == "system" else message.role
        return [{"role": role, "content": _output(message.content)}]
    unchanged = first is None or (
        message.content == first.content and message.tool_calls == first.tool_calls
    )
    if unchanged:
        return items
    if message.role == "assistant":
        return _assistant_items(message, items)
    if len(items) != 1:
        return items
    item = items[0]
    if _kind(item) in _OUTPUTS:
        return [{**item, "output": _output(message.content)}]
    if _kind(item) == "message":
        return [{**item, "content": _output(message.content)}]
    return items


def _assistant_items(message: Message, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A changed assistant message's items (the eviction's last resort cuts the newest
    call's text or its arguments): each call with its arguments as built, its text item
    with the text as built; reasoning and hosted-tool items as given."""
    calls = {c.id: c.arguments for c in message.tool_calls}
    text = sole_text(message)  # (beside reasoning items: the one text part)
    out: list[dict[str, Any]] = []
    for item in items:
        kind = _kind(item)
        if kind in _CALLS and item.get("call_id") in calls:
            out.append(call_item(item, calls[item["call_id"]]))
        elif kind == "message" and text is not None:
            parts = [p for p in item.get("content") or () if isinstance(p, Mapping)]
            part = parts[0] if len(parts) == 1 else {"type": "output_text", "annotations": []}
            out.append({**item, "content": [{**part, "text": text}]})
        else:
            out.append(item)
    return out
