"""OpenAI Responses API input items <-> :class:`~ctxwarden.core.messages.Message`.

A Responses request is ``instructions`` (the system prompt) and ``input``: a string, or
a flat list of items. Ours is a list of chat messages. The mapping keeps what a build
needs to decide and what the API needs to accept:

* ``instructions`` is a system message (marked, so it goes back as ``instructions``);
* a ``message`` item of role ``user`` / ``system`` / ``developer`` is that message
  (``input_text`` as text parts, ``input_image`` by URL as image parts, any other part
  raw); a string ``input`` is one user message;
* a run of consecutive model-side items (an assistant ``message``, ``reasoning``,
  ``compaction``, ``function_call`` and every other item with a ``call_id`` that is not
  an output, the hosted tools' ``*_call`` items) is **one** assistant message: its text
  is the assistant text, its tool calls the items with a ``call_id``, the rest raw parts
  (counted, not shown as text). So reasoning is kept or dropped with the call or answer
  it came with, as the API requires, and parallel calls stay one block with their
  outputs (pair safety by ``call_id``);
* an item ending in ``_output`` with a ``call_id`` is a tool result of that call;
* any other item (a type ctxwarden does not know, ``item_reference``) belongs to the
  turn it sits in: it joins the message before it (as a raw part), or stands alone as a
  user-side raw message when nothing precedes it. After a tool result it rides on that
  result's items only (a block of call and results is never split).

**Lossless.** Each message keeps the exact items it came from under
``meta["responses"]["items"]`` when the plain writer would not give them back as they
came (an item ``id``, ``status``, annotations, ``encrypted_content``, ``developer``...),
with the fingerprint of the message as converted. :func:`messages_to_responses` sends
those items back byte for byte while the message is unchanged; a message the build
changed (a truncated or masked tool result) goes back as its items with the new
content in place; a message the build made (a summary, the ledger) is written plainly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ctxwarden.core.checks import check_json_value
from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import ImagePart, Message, Part, RawPart, TextPart, ToolCall

__all__ = [
    "META",
    "call_item",
    "convert_items",
    "instructions_message",
    "message_items",
    "messages_from_responses",
    "messages_to_responses",
    "reply_from_output",
    "tools_as_openai",
]

META = "responses"
"""The ``meta`` key of a message's Responses items (and of a stored reply's response)."""

_MODEL_SIDE = {
    "reasoning",
    "compaction",
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "tool_search_call",
}
_PAIRED = {  # call items that need a call_id (their outputs too)
    "function_call",
    "custom_tool_call",
    "computer_call",
    "local_shell_call",
    "shell_call",
    "apply_patch_call",
}
_ROLES = {"user": "user", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")
_CONTENT_PARTS = ("output_text", "refusal")  # an assistant message item's parts


def item_kind(item: Mapping[str, Any]) -> str:
    """An input item's type; an item with a ``role`` and no ``type`` is a message (the
    easy input message form)."""
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return str(kind)


def _side(item: Mapping[str, Any]) -> str:
    """``assistant``, ``tool``, ``input`` (a user/system message) or ``other``."""
    kind = item_kind(item)
    if kind == "message":
        return "assistant" if item.get("role") == "assistant" else "input"
    if isinstance(item.get("call_id"), str):
        return "tool" if kind.endswith("_output") else "assistant"
    return "assistant" if kind in _MODEL_SIDE else "other"


def _part(raw: Any, index: int) -> Part:
    if not isinstance(raw, Mapping):
        raise InvalidMessageError(
            "each content part must be an object", index=index, field="input.content"
        )
    kind = raw.get("type")
    if kind in _TEXT_PARTS and set(raw) == {"type", "text"} and isinstance(raw["text"], str):
        return TextPart(raw["text"])
    image = raw.get("image_url")
    if kind == "input_image" and isinstance(image, str) and set(raw) <= {"type", "image_url",
                                                                        "detail"}:  # fmt: skip
        detail = raw.get("detail")
        return ImagePart(url=image, detail=detail if isinstance(detail, str) else None)
    return RawPart(dict(raw))


def _content(raw: Any, index: int) -> str | tuple[Part, ...]:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        return tuple(_part(p, index) for p in raw)
    raise InvalidMessageError(
        "content must be a string or a list of parts", index=index, field="input.content"
    )


def _simple(parts: list[Part]) -> str | tuple[Part, ...] | None:
    if not parts:
        return None
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return parts[0].text
    return tuple(parts)


def _call(item: Mapping[str, Any]) -> ToolCall:
    kind = item_kind(item)
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        payload = item.get("input", item.get("action", arguments if arguments else {}))
        arguments = payload if isinstance(payload, str) else json.dumps(payload, sort_keys=True)
    name = item.get("name")
    return ToolCall(id=item["call_id"], name=name if isinstance(name, str) else kind,
                    arguments=arguments)  # fmt: skip


def call_item(item: Mapping[str, Any], arguments: str) -> dict[str, Any]:
    """``item`` (a call item) carrying ``arguments``, our call's JSON text: as it came when
    they are the ones it gave (:func:`_call`), else with a function call's ``arguments``,
    or the ``input`` or ``action`` of another kind in the form it came in (text, or the
    JSON parsed), replaced (the eviction's last resort cuts a call's arguments)."""
    if _call(item).arguments == arguments:
        return dict(item)
    if isinstance(item.get("arguments"), str):
        return {**item, "arguments": arguments}
    key = "input" if "input" in item else "action"
    if isinstance(item.get(key), str):
        return {**item, key: arguments}
    try:
        payload = json.loads(arguments)
    except ValueError:
        return dict(item)
    return {**item, key: payload}


def _assistant(items: Sequence[Mapping[str, Any]], index: int) -> Message:
    parts: list[Part] = []
    calls: list[ToolCall] = []
    for item in items:
        kind = item_kind(item)
        if kind == "message":
            content = item.get("content")
            if isinstance(content, str):
                parts.append(TextPart(content))
            elif isinstance(content, list):
                for p in content:
                    if isinstance(p, Mapping) and p.get("type") == "output_text":
                        parts.append(TextPart(str(p.get("text", ""))))
                    elif isinstance(p, Mapping):
                        parts.append(RawPart(dict(p)))
        elif _side(item) == "assistant" and isinstance(item.get("call_id"), str):
            calls.append(_call(item))
        else:
            parts.append(RawPart(dict(item)))
    return Message(role="assistant", content=_simple(parts), tool_calls=tuple(calls))


def _tool(items: Sequence[Mapping[str, Any]], index: int) -> Message:
    item = items[0]
    output = item.get("output", "")
    content: str | tuple[Part, ...]
    if isinstance(output, str | list):
        content = _content(output, index)
    else:
        content = json.dumps(output, sort_keys=True)
    return Message(role="tool", content=content, tool_call_id=item["call_id"])


def _input(items: Sequence[Mapping[str, Any]], index: int) -> Message:
    item = items[0]
    if _side(item) == "other":  # an item nothing precedes: a user-side raw message
        return Message(role="user", content=tuple(RawPart(dict(i)) for i in items))
    role = item.get("role")
    if role not in _ROLES:
        raise InvalidMessageError(
            f"a message item's role must be user, system, developer or assistant, got {role!r}",
            index=index,
            field="input.role",
        )
    content = _content(item.get("content", ""), index)
    if len(items) > 1:  # unknown items after it, in its turn
        parts = [TextPart(content)] if isinstance(content, str) else list(content)
        content = tuple(parts + [RawPart(dict(i)) for i in items[1:]])
    return Message(role=_ROLES[role], content=content)  # type: ignore[arg-type]


def _with_items(message: Message, items: list[dict[str, Any]], **more: Any) -> Message:
    """``message`` keeping ``items`` (and ``more``) in its meta when the plain writer would
    not give them back as they came."""
    if not more and message_items(message) == items:
        return message
    kept = {"items": items, "fp": message.fingerprint, **more}
    return replace(message, meta={**message.meta, META: kept})


def _groups(items: Sequence[Any], start: int) -> list[tuple[str, int, list[dict[str, Any]]]]:
    """``items[start:]`` in groups of one message each: ``(side, first index, items)``."""
    groups: list[tuple[str, int, list[dict[str, Any]]]] = []
    for i in range(start, len(items)):
        item = items[i]
        if not isinstance(item, Mapping):
            raise InvalidMessageError(
                f"an input item must be an object, got {type(item).__name__}", index=i
            )
        check_json_value(item, index=i, field="input")
        kind = item_kind(item)
        if (kind in _PAIRED or kind.endswith("_call_output")) and not (
            isinstance(item.get("call_id"), str) and item["call_id"]
        ):
            raise InvalidMessageError(f"a {kind} item needs a call_id", index=i, field="call_id")
        side = _side(item)
        item = dict(item)
        if side == "tool" or side == "input":
            groups.append((side, i, [item]))
        elif side == "assistant" and groups and groups[-1][0] == "assistant":
            groups[-1][2].append(item)
        elif side == "assistant":
            groups.append((side, i, [item]))
        elif groups:  # another item: in the turn it sits in
            groups[-1][2].append(item)
        else:
            groups.append(("input", i, [item]))
    return groups


def convert_items(items: Sequence[Any], start: int = 0) -> list[tuple[int, int, Message]]:
    """The messages of the input items ``items[start:]``, each with the span of items it
    came from, ``(first, end)``. A message depends only on its own items and on which
    items follow it in its turn, so converting from the first item of any message gives
    that message and the ones after it as converting the whole list does (the proxy
    converts only what a client added since its last call)."""
    out: list[tuple[int, int, Message]] = []
    groups = _groups(items, start)
    for n, (side, index, group) in enumerate(groups):
        try:
            if side == "assistant":
                message = _assistant(group, index)
            elif side == "tool":
                message = _tool(group, index)
            else:
                message = _input(group, index)
        except InvalidMessageError as exc:
            raise InvalidMessageError(exc.reason, index=index, field=exc.field) from None
        end = groups[n + 1][1] if n + 1 < len(groups) else len(items)
        out.append((index, end, _with_items(message, group)))
    return out


def instructions_message(instructions: str) -> Message:
    """``instructions`` as the system message that goes back as ``instructions``."""
    if not isinstance(instructions, str):
        raise InvalidMessageError("instructions must be a string", field="instructions")
    return replace(Message.system(instructions), meta={META: {"instructions": True}})


def messages_from_responses(input: Any, instructions: Any = None) -> list[Message]:
    """A Responses request's ``instructions`` and ``input`` (a string or a list of
    items) as our messages (see the module docstring); a malformed item is an
    :class:`~ctxwarden.core.errors.InvalidMessageError` naming its index."""
    out = [instructions_message(instructions)] if instructions is not None else []
    if isinstance(input, str):
        out.append(Message.user(input))
        return out
    if not isinstance(input, list):
        raise InvalidMessageError(
            f"input must be a string or a list of items, got {type(input).__name__}",
            field="input",
        )
    return out + [message for _, _, message in convert_items(input)]


def reply_from_output(output: Any, response: Mapping[str, Any] | None = None) -> Message | None:
    """A response's ``output`` items as one assistant message (the reply to store), with
    ``response`` (its id, whether upstream stored it) in its meta; ``None`` for no items."""
    if not isinstance(output, list) or not output:
        return None
    items = [dict(i) for i in output if isinstance(i, Mapping)]
    if not items:
        return None
    message = _assistant(items, 0)
    if message.content is None and not message.tool_calls:
        message = replace(message, content="")
    return _with_items(message, items, **({"response": dict(response)} if response else {}))


# -- writing ------------------------------------------------------------------------------


def _parts_out(content: str | tuple[Part, ...] | None, text_type: str) -> str | list[Any]:
    if content is None or isinstance(content, str):
        return content or ""
    out: list[Any] = []
    for p in content:
        if isinstance(p, TextPart):
            out.append({"type": text_type, "text": p.text})
        elif isinstance(p, ImagePart):
            image: dict[str, Any] = {"type": "input_image", "image_url": p.url}
            if p.detail is not None:
                image["detail"] = p.detail
            out.append(image)
        else:
            out.append(dict(p.data))
    return out


def _plain_assistant(message: Message) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    text: list[Any] = []

    def flush() -> None:
        if text:
            items.append({"type": "message", "role": "assistant", "content": list(text)})
            text.clear()

    content = message.content
    parts = (TextPart(content),) if isinstance(content, str) and content else content or ()
    for p in parts:
        if isinstance(p, TextPart):
            text.append({"type": "output_text", "text": p.text, "annotations": []})
        elif isinstance(p, RawPart) and p.data.get("type") in _CONTENT_PARTS:
            text.append(dict(p.data))
        elif isinstance(p, RawPart):
            flush()
            items.append(dict(p.data))
    flush()
    for c in message.tool_calls:
        items.append({"type": "function_call", "call_id": c.id, "name": c.name,
                      "arguments": c.arguments})  # fmt: skip
    return items


def _plain(message: Message) -> list[dict[str, Any]]:
    role = message.role
    if role == "assistant":
        return _plain_assistant(message)
    if role == "tool":
        output = _parts_out(message.content, "input_text")
        return [{"type": "function_call_output", "call_id": message.tool_call_id or "",
                 "output": output}]  # fmt: skip
    content = message.content
    raw = isinstance(content, tuple) and all(isinstance(p, RawPart) for p in content)
    if role == "user" and raw and content:  # a raw message: its items, as they came
        return [dict(p.data) for p in content if isinstance(p, RawPart)]
    wire_role = "developer" if role == "system" else role
    return [{"role": wire_role, "content": _parts_out(content, "input_text")}]


def _changed(message: Message, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items of a message the build changed: its own items with the new content in
    place where the items allow it, else the plain items."""
    if message.role == "tool" and isinstance(items[0].get("output"), str | list):
        output = _parts_out(message.content, "input_text")
        return [{**items[0], "output": output}, *items[1:]]
    if message.role in ("user", "system") and item_kind(items[0]) == "message":
        return _changed_input(message.content, items)
    if message.role == "assistant":
        calls = {c.id: c for c in message.tool_calls}
        raws = [dict(p.data) for p in message.content or () if isinstance(p, RawPart)]
        out: list[dict[str, Any]] = []
        text_done = False
        for item in items:
            call_id = item.get("call_id")
            call = calls.pop(call_id, None) if isinstance(call_id, str) else None
            if call is not None:
                out.append(call_item(item, call.arguments))
            elif item_kind(item) == "message" and not text_done:
                text_done = True
                plain = _plain_assistant(replace(message, content=message.text, tool_calls=()))
                out += [{**item, "content": p["content"]} for p in plain[:1]]
            elif item in raws:
                out.append(item)
        out += _plain_assistant(Message.assistant(None, tuple(calls.values())))
        return out
    return _plain(message)


def _changed_input(
    content: str | tuple[Part, ...] | None, items: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A changed input message: its item with the new content, then the items that rode
    with it (raw parts of its content) where they still are."""
    riding = items[1:]
    parts = content if isinstance(content, tuple) else None
    if parts is not None and riding:
        kept = [dict(p.data) for p in parts if isinstance(p, RawPart) and p.data in riding]
        rest = [p for p in parts if not (isinstance(p, RawPart) and p.data in riding)]
        if isinstance(items[0].get("content"), str) and all(isinstance(p, TextPart) for p in rest):
            new: str | list[Any] = "".join(p.text for p in rest if isinstance(p, TextPart))
        else:
            new = _parts_out(tuple(rest), "input_text")
        return [{**items[0], "content": new}, *kept]
    return [{**items[0], "content": _parts_out(content, "input_text")}]


def message_items(message: Message) -> list[dict[str, Any]]:
    """The Responses items of one of our messages (see the module docstring)."""
    kept = message.meta.get(META)
    if not isinstance(kept, Mapping) or not kept.get("items"):
        return _plain(message)
    items = kept["items"]
    if kept.get("fp") == message.fingerprint:
        return [dict(i) for i in items]
    return _changed(message, [dict(i) for i in items])


def messages_to_responses(
    messages: Sequence[Message],
) -> tuple[str | None, list[dict[str, Any]]]:
    """``(instructions, input)`` for a Responses request: the leading system message
    that came as ``instructions`` goes back there, every message else as items."""
    instructions: str | None = None
    start = 0
    if messages and messages[0].role == "system":
        kept = messages[0].meta.get(META)
        if isinstance(kept, Mapping) and kept.get("instructions"):
            instructions, start = messages[0].text, 1
    items: list[dict[str, Any]] = []
    for message in messages[start:]:
        items += message_items(message)
    return instructions, items


def tools_as_openai(tools: Any) -> list[dict[str, Any]] | None:
    """A Responses request's function tools in chat shape, to count them in the budget
    (built-in tools such as ``web_search`` have no schema to count)."""
    if not isinstance(tools, list):
        return None
    out = []
    for t in tools:
        if isinstance(t, Mapping) and t.get("type") == "function" and "name" in t:
            fn = {k: t[k] for k in ("name", "description", "parameters") if k in t}
            out.append({"type": "function", "function": fn})
    return out
