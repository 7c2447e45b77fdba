"""OpenAI chat-completions wire format <-> :class:`~ctxwarden.messages.Message`.

The round trip is the identity: keys we do not model (``refusal``, ``audio``, a
``developer`` role, provider extensions) are kept in ``Message.extra`` and written
back. Our own metadata may ride along under one key, ``"ctxwarden"`` (``pinned``,
``priority``, ``kind``, ``id``, ``created_at``, ``meta``); it is written back only when
asked, because providers reject unknown keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from ctxwarden.errors import InvalidMessageError
from ctxwarden.messages import (
    ROLES,
    ImagePart,
    Message,
    Part,
    RawPart,
    TextPart,
    ToolCall,
    wire_dict,
)

__all__ = ["message_from_openai", "message_to_openai", "messages_from_openai", "messages_to_openai"]

_MODELLED = {"role", "content", "name", "tool_calls", "tool_call_id", "ctxwarden"}
_ROLE_ALIASES = {"developer": "system"}
META_KEY = "ctxwarden"


def _part_from_openai(raw: Any, index: int | None) -> Part:
    if not isinstance(raw, Mapping) or "type" not in raw:
        raise InvalidMessageError(
            "each content part must be an object with a 'type'", index=index, field="content"
        )
    kind = raw["type"]
    if kind == "text" and set(raw) == {"type", "text"} and isinstance(raw["text"], str):
        return TextPart(raw["text"])
    if kind == "image_url" and set(raw) == {"type", "image_url"}:
        image = raw["image_url"]
        if isinstance(image, Mapping) and set(image) <= {"url", "detail"} and "url" in image:
            return ImagePart(url=str(image["url"]), detail=image.get("detail"))
    return RawPart(dict(raw))


def _tool_call_from_openai(raw: Any, index: int | None) -> ToolCall:
    fn = raw.get("function") if isinstance(raw, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise InvalidMessageError(
            "each tool call needs function.name", index=index, field="tool_calls"
        )
    call_id = raw.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidMessageError("each tool call needs an id", index=index, field="tool_calls")
    arguments = fn.get("arguments", "")
    if not isinstance(arguments, str):
        raise InvalidMessageError(
            "function.arguments must be a JSON-encoded string", index=index, field="tool_calls"
        )
    return ToolCall(id=call_id, name=fn["name"], arguments=arguments)


def message_from_openai(
    data: Mapping[str, Any], *, index: int | None = None, default_id: str = ""
) -> Message:
    """Parse one OpenAI chat message; raise :class:`InvalidMessageError` naming the field."""
    if not isinstance(data, Mapping):
        raise InvalidMessageError(
            f"a message must be a JSON object, got {type(data).__name__}", index=index
        )
    if "role" not in data:
        raise InvalidMessageError("missing role", index=index, field="role")
    wire_role = data["role"]
    role = _ROLE_ALIASES.get(wire_role, wire_role)
    if role not in ROLES:
        raise InvalidMessageError(
            f"role must be one of {', '.join(ROLES)}, got {wire_role!r}", index=index, field="role"
        )
    extra = {k: v for k, v in data.items() if k not in _MODELLED}
    if wire_role != role:
        extra["__role__"] = wire_role
    if "content" not in data:
        extra["__no_content__"] = True

    raw_content = data.get("content")
    content: str | tuple[Part, ...] | None
    if raw_content is None or isinstance(raw_content, str):
        content = raw_content
    elif isinstance(raw_content, list):
        content = tuple(_part_from_openai(p, index) for p in raw_content)
    else:
        raise InvalidMessageError(
            "content must be a string, a list of parts or null", index=index, field="content"
        )
    if content is None and role in ("system", "user", "tool"):
        raise InvalidMessageError(f"a {role} message needs content", index=index, field="content")

    raw_calls = data.get("tool_calls")
    calls: tuple[ToolCall, ...] = ()
    if raw_calls is not None:
        if role != "assistant" or not isinstance(raw_calls, list):
            raise InvalidMessageError(
                "tool_calls must be a list on an assistant message", index=index, field="tool_calls"
            )
        calls = tuple(_tool_call_from_openai(c, index) for c in raw_calls)
        if not calls:
            extra["__empty_tool_calls__"] = True

    name = data.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidMessageError("name must be a string", index=index, field="name")
    call_id = data.get("tool_call_id")
    if role == "tool" and (not isinstance(call_id, str) or not call_id):
        raise InvalidMessageError(
            "a tool result needs the tool_call_id of its call", index=index, field="tool_call_id"
        )

    meta = data.get(META_KEY) or {}
    if not isinstance(meta, Mapping):
        raise InvalidMessageError("must be an object", index=index, field=META_KEY)
    try:
        return Message(
            role=cast(Any, role),
            content=content,
            name=name,
            tool_calls=calls,
            tool_call_id=call_id if role == "tool" else None,
            id=str(meta.get("id") or default_id),
            kind=meta.get("kind"),
            pinned=bool(meta.get("pinned", False)),
            priority=meta.get("priority", "medium"),
            created_at=meta.get("created_at"),
            meta=dict(meta.get("meta", {})),
            extra=extra,
        )
    except InvalidMessageError as exc:
        raise InvalidMessageError(exc.reason, index=index, field=exc.field) from None


def message_to_openai(message: Message, *, with_meta: bool = False) -> dict[str, Any]:
    """Write one message as an OpenAI chat dict (the exact inverse of the parser)."""
    out = wire_dict(message)
    if with_meta:
        out[META_KEY] = {
            "id": message.id,
            "kind": message.kind,
            "pinned": message.pinned,
            "priority": message.priority,
            "created_at": message.created_at,
            "meta": dict(message.meta),
        }
    return out


def messages_from_openai(
    items: Iterable[Mapping[str, Any] | Message], *, id_prefix: str = "m"
) -> list[Message]:
    """Parse a transcript; a message without an explicit id gets ``m<position>``.

    Position ids stay stable while a history only grows, so decisions keyed by id
    (masked, truncated) carry from one build to the next.
    """
    out: list[Message] = []
    for i, item in enumerate(items):
        if isinstance(item, Message):
            out.append(item)
            continue
        out.append(message_from_openai(item, index=i, default_id=f"{id_prefix}{i}"))
    return out


def messages_to_openai(
    messages: Sequence[Message], *, with_meta: bool = False
) -> list[dict[str, Any]]:
    """Write a list of messages in OpenAI chat format."""
    return [message_to_openai(m, with_meta=with_meta) for m in messages]
