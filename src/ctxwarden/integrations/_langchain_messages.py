"""LangChain messages <-> :class:`~ctxwarden.core.messages.Message`, without loss.

Tool calls (``args`` as JSON text), ids, multimodal content blocks (text and
``image_url`` parts as ours, any other block kept verbatim as a raw part) and every
other field (under ``meta["langchain"]``, JSON-safe so a session can store it). Within
one model call, the built messages map back to the very objects the request held
(:func:`message_back`); a masked or truncated tool result is a copy with its new content,
and an AI message whose call the build cut (its last resort) a copy with the cut arguments.

An AI message may hold each call twice: in ``tool_calls`` and as a block of its content
(Anthropic's chat model: ``tool_use``; LangChain's standard ``v1`` content: ``tool_call``;
OpenAI's Responses API in ``responses/v1``: ``function_call``). The call is ours once (a
tool call: counted once, its arguments the eviction can cut); the block waits under
``meta["langchain"]["call_blocks"]`` and goes back in its place, holding the call's
arguments as built.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ctxwarden.core.errors import InvalidMessageError, MissingDependencyError
from ctxwarden.core.kinds import load_json
from ctxwarden.core.messages import ImagePart, Message, Part, RawPart, TextPart, ToolCall
from ctxwarden.integrations._common import stable_id

try:
    from langchain_core.messages import (
        AIMessage,
        AIMessageChunk,
        BaseMessage,
        ChatMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxwarden.integrations.langchain", "langchain") from exc

__all__ = ["convert_history", "message_back", "message_from_langchain", "message_to_langchain"]

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
_CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "human": "user"}
_CHAT_ROLES |= {"assistant": "assistant", "ai": "assistant"}
_CLASSES: dict[str, type[BaseMessage]] = {
    "system": SystemMessage,
    "human": HumanMessage,
    "ai": AIMessage,
    "AIMessageChunk": AIMessageChunk,
    "tool": ToolMessage,
    "chat": ChatMessage,
}
_BY_ROLE = {"system": "system", "user": "human", "assistant": "ai", "tool": "tool"}
_MODELLED = {"content", "id", "name", "tool_calls", "tool_call_id", "type"}
#: Content blocks that repeat a call of ``tool_calls``: type -> (the key of the call's id,
#: the key of its arguments, JSON text or an object).
_CALL_BLOCKS = {
    "tool_use": ("id", "input"),
    "tool_call": ("id", "args"),
    "function_call": ("call_id", "arguments"),
}


# -- conversion -----------------------------------------------------------------------------


def _part(block: Any) -> Part:
    if isinstance(block, str):
        return TextPart(block)
    if isinstance(block, Mapping):
        kind, keys = block.get("type"), set(block)
        if kind == "text" and keys == {"type", "text"} and isinstance(block["text"], str):
            return TextPart(block["text"])
        image = block.get("image_url")
        if (
            kind == "image_url"
            and keys == {"type", "image_url"}
            and isinstance(image, Mapping)
            and set(image) <= {"url", "detail"}
            and isinstance(image.get("url"), str)
        ):
            return ImagePart(url=image["url"], detail=image.get("detail"))
        return RawPart(dict(block))
    raise InvalidMessageError(f"content blocks must be strings or dicts, got {type(block)}")


def _content_from(content: Any) -> str | tuple[Part, ...]:
    if isinstance(content, str):
        return content
    return tuple(_part(b) for b in content)


def _content_to(content: str | tuple[Part, ...] | None) -> str | list[str | dict[str, Any]]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out: list[str | dict[str, Any]] = []
    for p in content:
        if isinstance(p, TextPart):
            out.append({"type": "text", "text": p.text})
        elif isinstance(p, ImagePart):
            url: dict[str, Any] = {"url": p.url}
            if p.detail is not None:
                url["detail"] = p.detail
            out.append({"type": "image_url", "image_url": url})
        else:
            out.append(dict(p.data))
    return out


def message_from_langchain(message: BaseMessage, *, index: int = 0) -> Message:
    """One LangChain message as ours; ``index`` names it in errors and in a made-up id
    (a message without an id gets one from its position and content)."""
    kind = message.type
    role = _ROLES.get(kind)
    if isinstance(message, ChatMessage):
        role = _CHAT_ROLES.get(message.role)
    if role is None:
        raise InvalidMessageError(
            f"{type(message).__name__} cannot be converted: use System/Human/AI/ToolMessage",
            index=index,
        )
    fields = message.model_dump(mode="json", exclude_defaults=True, exclude=_MODELLED)
    calls: tuple[ToolCall, ...] = ()
    content: Any = message.content
    info: dict[str, Any] = {"type": kind, "id": message.id, "fields": fields}
    if isinstance(message, AIMessage):
        calls = tuple(
            ToolCall(id=c.get("id") or "", name=c["name"], arguments=json.dumps(c["args"]))
            for c in message.tool_calls
        )
        content, blocks = _without_call_blocks(content, {c.id for c in calls if c.id})
        if blocks:
            info["call_blocks"] = blocks
    try:
        return Message(
            role=role,  # type: ignore[arg-type]
            content=_content_from(content),
            id=message.id or stable_id("lc", index, message.model_dump(mode="json")),
            name=message.name,
            tool_calls=calls,
            tool_call_id=getattr(message, "tool_call_id", None) if role == "tool" else None,
            meta={"langchain": info},
        )
    except InvalidMessageError as exc:
        raise InvalidMessageError(exc.reason, index=index, field=exc.field) from None


def _call_block_id(block: Any) -> str | None:
    """The id of the call a content block repeats (None: the block is no call)."""
    if not isinstance(block, Mapping):
        return None
    keys = _CALL_BLOCKS.get(str(block.get("type")))
    found = block.get(keys[0]) if keys else None
    return found if isinstance(found, str) else None


def _without_call_blocks(content: Any, ids: set[str]) -> tuple[Any, list[list[Any]]]:
    """``content`` without its blocks that repeat the calls ``ids`` names, and those
    blocks with their places (``[index, block]``: JSON, a session stores them)."""
    if isinstance(content, str) or not ids:
        return content, []
    kept: list[Any] = []
    blocks: list[list[Any]] = []
    for i, block in enumerate(content):
        if _call_block_id(block) in ids:
            blocks.append([i, dict(block)])
        else:
            kept.append(block)
    if not blocks:
        return content, []
    return (kept or ""), blocks


def _content_back(message: Message) -> str | list[str | dict[str, Any]]:
    """The LangChain content of ``message``: its parts, and each call's block set aside
    on the way in back in its place, holding the arguments of the call as built (the
    eviction may have cut them; a block whose call is gone stays out)."""
    content = _content_to(message.content)
    blocks = (message.meta.get("langchain") or {}).get("call_blocks")
    if not blocks:
        return content
    out: list[str | dict[str, Any]]
    if isinstance(content, str):  # (the text a cut left, or none beside the calls)
        out = [{"type": "text", "text": content}] if content else []
    else:
        out = list(content)
    built = {c.id: c for c in message.tool_calls}
    for at, block in blocks:
        call = built.get(_call_block_id(block) or "")
        if call is None:
            continue
        key = _CALL_BLOCKS[block["type"]][1]
        held, arguments = block.get(key), call.parsed_arguments()
        as_text = isinstance(held, str)  # (OpenAI's JSON text; the others an object)
        if (load_json(held)[1] if as_text else held) != arguments:  # else: as it came
            block = {**block, key: call.arguments if as_text else arguments}
        out.insert(min(at, len(out)), block)
    return out


def message_to_langchain(message: Message) -> BaseMessage:
    """Ours as a LangChain message: the exact inverse of :func:`message_from_langchain`;
    a message from elsewhere (a ctxwarden layer) becomes the class its role names."""
    info = message.meta.get("langchain") or {}
    kind = info.get("type") or _BY_ROLE[message.role]
    data: dict[str, Any] = dict(info.get("fields") or {})
    data["content"] = _content_back(message)
    data["id"] = info["id"] if "langchain" in message.meta else message.id
    if message.name is not None:
        data["name"] = message.name
    if kind in ("ai", "AIMessageChunk"):
        data["tool_calls"] = [
            {"name": c.name, "args": c.parsed_arguments(), "id": c.id, "type": "tool_call"}
            for c in message.tool_calls
        ]
    if kind == "tool":
        data["tool_call_id"] = message.tool_call_id
    if kind == "chat" and "role" not in data:
        data["role"] = message.role
    return _CLASSES[kind](**data)


def convert_history(
    system: SystemMessage | None, messages: Sequence[BaseMessage]
) -> tuple[list[Message], dict[str, tuple[BaseMessage, Message]]]:
    """Ours for ``[system, *messages]``, and each id's original and first conversion."""
    ours: list[Message] = []
    originals: dict[str, tuple[BaseMessage, Message]] = {}
    items: Iterable[BaseMessage] = [system, *messages] if system is not None else messages
    for i, lc in enumerate(items):
        m = message_from_langchain(lc, index=i)
        if m.id in originals:  # the same id twice: keep both, apart
            m = replace(m, id=stable_id("lc", i, m.id))
        originals[m.id] = (lc, m)
        ours.append(m)
    return ours, originals


def message_back(m: Message, originals: Mapping[str, tuple[BaseMessage, Message]]) -> BaseMessage:
    found = originals.get(m.id)
    if found is None:
        return message_to_langchain(m)
    lc, first = found
    if m.content == first.content and m.tool_calls == first.tool_calls:
        return lc
    update: dict[str, Any] = {"content": _content_back(m)}
    if m.tool_calls != first.tool_calls and isinstance(lc, AIMessage):
        update.update(_calls_back(lc, m))
    return lc.model_copy(update=update)


def _calls_back(lc: AIMessage, m: Message) -> dict[str, Any]:
    """An AI message's calls as the build sent them (the eviction's last resort cuts the
    newest call's arguments): in ``tool_calls``, and in OpenAI's raw ``additional_kwargs``
    where a client reads them instead (a block of the content that repeats a call:
    :func:`_content_back`)."""
    built = {c.id: c for c in m.tool_calls}
    update: dict[str, Any] = {
        "tool_calls": [
            {**tc, "args": built[tc["id"]].parsed_arguments()}
            if tc["id"] is not None and tc["id"] in built
            else tc
            for tc in lc.tool_calls
        ]
    }
    raw = lc.additional_kwargs.get("tool_calls")
    if isinstance(raw, list):
        update["additional_kwargs"] = {
            **lc.additional_kwargs,
            "tool_calls": [
                {**r, "function": {**r["function"], "arguments": built[r["id"]].arguments}}
                if isinstance(r, dict)
                and r.get("id") in built
                and isinstance(r.get("function"), dict)
                else r
                for r in raw
            ],
        }
    return update
