"""OpenAI chat-completions wire format <-> :class:`~ctxwarden.core.messages.Message`.

The round trip is the identity: keys we do not model (``refusal``, ``audio``, a
``developer`` role, provider extensions) are kept in ``Message.extra`` and written
back. Our own metadata may ride along under one key, ``"ctxwarden"`` (``pinned``,
``priority``, ``kind``, ``id``, ``created_at``, ``meta``); it is written back only when
asked, because providers reject unknown keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from ctxwarden.core.checks import check_json_value, parse_created_at
from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import (
    ROLES,
    ImagePart,
    Message,
    Part,
    RawPart,
    TextPart,
    ToolCall,
    register_codec,
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
        if (
            isinstance(image, Mapping)
            and set(image) <= {"url", "detail"}
            and isinstance(image.get("url"), str)
            and isinstance(image.get("detail", ""), str)
        ):
            return ImagePart(url=image["url"], detail=image.get("detail"))
    check_json_value(raw, index=index, field="content")
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
    role = _ROLE_ALIASES.get(wire_role, wire_role) if isinstance(wire_role, str) else None
    if role not in ROLES:
        raise InvalidMessageError(
            f"role must be one of {', '.join(ROLES)}, got {_short(wire_role)}",
            index=index,
            field="role",
        )
    extra = {k: v for k, v in data.items() if k not in _MODELLED}
    for key, value in extra.items():
        if not isinstance(key, str):
            raise InvalidMessageError("keys must be strings", index=index, field=repr(key))
        check_json_value(value, index=index, field=key)
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

    meta = data.get(META_KEY)
    meta = {} if meta is None else meta
    if not isinstance(meta, Mapping):
        raise InvalidMessageError(
            f"must be an object, got {type(meta).__name__}", index=index, field=META_KEY
        )
    return _with_meta(meta, index, default_id, role, content, name, calls, call_id, extra)


def _meta_field(meta: Mapping[str, Any], key: str, kinds: Any, what: str, index: int | None) -> Any:
    value = meta.get(key)
    if value is not None and (
        isinstance(value, bool) != (kinds is bool) or not isinstance(value, kinds)
    ):
        raise InvalidMessageError(
            f"must be {what}, got {_short(value)}", index=index, field=f"{META_KEY}.{key}"
        )
    return value


def _with_meta(
    meta: Mapping[str, Any],
    index: int | None,
    default_id: str,
    role: str,
    content: str | tuple[Part, ...] | None,
    name: str | None,
    calls: tuple[ToolCall, ...],
    call_id: Any,
    extra: dict[str, Any],
) -> Message:
    """The message, with our metadata (``ctxwarden`` key) checked field by field."""
    message_id = _meta_field(meta, "id", str | int, "a string", index)
    kind = _meta_field(meta, "kind", str, "a string", index)
    priority = _meta_field(meta, "priority", str, "a string", index)
    pinned = _meta_field(meta, "pinned", bool, "true or false", index)
    own = _meta_field(meta, "meta", Mapping, "an object", index)
    if own is not None:
        check_json_value(own, index=index, field=f"{META_KEY}.meta")
    try:
        return Message(
            role=cast(Any, role),
            content=content,
            name=name,
            tool_calls=calls,
            tool_call_id=call_id if role == "tool" else None,
            id=str(message_id) if message_id not in (None, "") else default_id,
            kind=cast(Any, kind),
            pinned=bool(pinned),
            priority=cast(Any, priority if priority is not None else "medium"),
            created_at=parse_created_at(meta.get("created_at"), index=index),
            meta=dict(own or {}),
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
    if items is None or isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        got = "None" if items is None else type(items).__name__
        raise InvalidMessageError(f"messages must be a list of message objects, got {got}")
    out: list[Message] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        if isinstance(item, Message):
            message = item
        else:
            message = message_from_openai(item, index=i, default_id=f"{id_prefix}{i}")
        first = seen.setdefault(message.id, i)
        if first != i and not _derived_id(message):
            raise InvalidMessageError(
                f"duplicate id {message.id!r}: messages {first} and {i} both have it; ids "
                "must be unique (leave them out and ctxwarden numbers the messages)",
                index=i,
                field=f"{META_KEY}.id",
            )
        out.append(message)
    return out


def _derived_id(message: Message) -> bool:
    """An id ctxwarden made from the content (two equal messages share it by design)."""
    return message.id == "h" + message.fingerprint[:12]


def _short(value: Any, limit: int = 60) -> str:
    """``repr`` of a value for an error message, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def messages_to_openai(
    messages: Sequence[Message], *, with_meta: bool = False
) -> list[dict[str, Any]]:
    """Write a list of messages in OpenAI chat format."""
    return [message_to_openai(m, with_meta=with_meta) for m in messages]


register_codec("from_openai", message_from_openai)  # Message.from_openai
register_codec("to_openai", message_to_openai)  # Message.to_openai
