"""Anthropic Messages wire format <-> :class:`~ctxwarden.core.messages.Message`.

Anthropic differs from OpenAI in five ways that matter here:

* the system prompt is a separate parameter (we send it as a list of text blocks, one
  per system message, so cache breakpoints can sit between them). A system message
  *after* the conversation began (a layer the layout put after the task, a recall block
  before the newest user message, a client's own mid-conversation note) has no place
  there: it is sent where it stands, as a text block of the user turn it meets (merged
  with the turn before or after it). Hoisting it into ``system`` instead would make every
  change to it rewrite the whole cached prompt; in place, the prefix before it stays
  cached. Claude Code sends its own reminders the same way, as text in a user turn.
* tool calls are ``tool_use`` blocks inside the assistant turn and results are
  ``tool_result`` blocks inside the next *user* turn; consecutive results (and a user
  text that follows them) are merged into one user turn, as the API requires;
* ``tool_use`` ids must be unique in a request, while recorded traces reuse them: a
  reused id is sent with a ``__dupN`` suffix on both the call and its result, and the
  suffix is removed on the way back;
* ``cache_control`` marks the end of a cacheable prefix (at most 4 breakpoints);
* an assistant turn may carry ``thinking`` / ``redacted_thinking`` blocks (and server
  tool blocks) that must go back exactly as received, in their place, with their
  ``signature`` (Anthropic requires it in a tool-use loop). They are
  :class:`~ctxwarden.core.messages.RawPart` s of the assistant message, so they are counted
  in the budget and stay with the ``tool_use`` they precede; nothing rewrites them.
  OpenAI's chat wire has no such blocks: :func:`~ctxwarden.formats.messages_to_openai`
  writes the parts verbatim (its round trip is the identity), so a history holding
  them is for an Anthropic model.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from ctxwarden.core.checks import check_json_value
from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import ImagePart, Message, Part, RawPart, TextPart, ToolCall
from ctxwarden.core.pairing import group_blocks

__all__ = [
    "MAX_CACHE_BREAKPOINTS",
    "messages_from_anthropic",
    "messages_to_anthropic",
    "system_from_anthropic",
    "turns_from_anthropic",
]

MAX_CACHE_BREAKPOINTS = 4
_DUP = re.compile(r"__dup\d+$")
_DATA_URI = re.compile(r"^data:(?P<media>[\w/+.-]+);base64,(?P<data>.*)$", re.DOTALL)
_CACHE = {"type": "ephemeral"}
_UNMARKED = ("thinking", "redacted_thinking")  # the API refuses cache_control on these
_ORDER = "anthropic_order"  # meta key: an assistant turn's block order, "c" content, "t" call


def _image_block(part: ImagePart) -> dict[str, Any]:
    match = _DATA_URI.match(part.url)
    if match:
        source = {"type": "base64", "media_type": match["media"], "data": match["data"]}
    else:
        source = {"type": "url", "url": part.url}
    return {"type": "image", "source": source}


def _content_blocks(content: str | tuple[Part, ...] | None) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, TextPart):
            blocks.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            blocks.append(_image_block(part))
        else:
            blocks.append(dict(part.data))
    return blocks


def _tool_input(call: ToolCall) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments) if call.arguments.strip() else {}
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's limit
        return {"_raw_arguments": call.arguments}
    return value if isinstance(value, dict) else {"_value": value}


def _in_order(
    content: list[dict[str, Any]], uses: list[dict[str, Any]], message: Message
) -> list[dict[str, Any]]:
    """Content blocks then ``tool_use`` blocks, or the order the turn came in (a block
    after a call, as interleaved thinking writes) when ``meta`` kept it and it still fits."""
    order = message.meta.get(_ORDER)
    if (
        not isinstance(order, str)
        or order.count("c") != len(content)
        or order.count("t") != len(uses)
    ):
        return content + uses
    blocks, calls = iter(content), iter(uses)
    return [next(blocks) if kind == "c" else next(calls) for kind in order]


def tool_use_blocks(message: Message, ids: Sequence[str]) -> list[dict[str, Any]]:
    """An assistant message's blocks: its content and its calls as ``tool_use`` blocks
    (with ``ids``, each call's id as sent), in the order it came in."""
    uses = [
        {"type": "tool_use", "id": new_id, "name": call.name, "input": _tool_input(call)}
        for call, new_id in zip(message.tool_calls, ids, strict=True)
    ]
    return _in_order(_content_blocks(message.content), uses, message)


def tool_result_block(message: Message, tool_use_id: str) -> dict[str, Any]:
    """A tool result as the ``tool_result`` block of the user turn after the call."""
    item: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": _content_blocks(message.content) or "",
    }
    if message.meta.get("is_error"):
        item["is_error"] = True
    return item


def user_blocks(message: Message) -> list[dict[str, Any]]:
    """A user message's content as blocks (none for empty content)."""
    return _content_blocks(message.content)


def system_block(message: Message) -> dict[str, Any]:
    """A system message as one text block of ``system``."""
    return {"type": "text", "text": message.text}


def mark_cached(blocks: list[dict[str, Any]]) -> None:
    """Put ``cache_control`` on the last block that takes one (not thinking), in place."""
    marked = [i for i, b in enumerate(blocks) if b.get("type") not in _UNMARKED]
    if marked:
        blocks[marked[-1]] = {**blocks[marked[-1]], "cache_control": dict(_CACHE)}


def check_breakpoints(cache_breakpoints: Collection[str]) -> None:
    """Anthropic takes at most :data:`MAX_CACHE_BREAKPOINTS` of them."""
    if len(cache_breakpoints) > MAX_CACHE_BREAKPOINTS:
        raise InvalidMessageError(
            f"Anthropic allows at most {MAX_CACHE_BREAKPOINTS} cache breakpoints, "
            f"got {len(cache_breakpoints)}"
        )


def messages_to_anthropic(
    messages: Sequence[Message], *, cache_breakpoints: Collection[str] = ()
) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """Convert to ``(system, messages)`` for ``client.messages.create``.

    ``cache_breakpoints`` holds message ids whose last block gets ``cache_control``.
    """
    check_breakpoints(cache_breakpoints)
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    seen_ids: dict[str, int] = {}

    def unique(call_id: str) -> str:
        count = seen_ids.get(call_id, 0) + 1
        seen_ids[call_id] = count
        return call_id if count == 1 else f"{call_id}__dup{count}"

    def add(role: str, blocks: list[dict[str, Any]], msg: Message) -> None:
        if msg.id in cache_breakpoints:
            mark_cached(blocks)
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for block in group_blocks(messages):
        head = block.head
        if head.role == "system" and not turns:
            blocks: list[dict[str, Any]] = [system_block(head)]
            if head.id in cache_breakpoints:
                mark_cached(blocks)
            system.extend(blocks)
        elif head.role == "system":  # after the conversation began: in place, as user text
            add("user", [system_block(head)], head)
        elif head.role in ("user", "tool"):
            if head.role == "tool":  # a tool result outside a call block is an orphan
                raise InvalidMessageError(
                    f"tool result for call {head.tool_call_id!r} has no tool call before it",
                    index=block.start,
                    field="tool_call_id",
                )
            add("user", user_blocks(head), head)
        else:
            renamed: dict[str, list[str]] = {c.id: [] for c in head.tool_calls}
            ids = []
            for call in head.tool_calls:
                new_id = unique(call.id)
                renamed[call.id].append(new_id)
                ids.append(new_id)
            add("assistant", tool_use_blocks(head, ids), head)
            for result in block.messages[1:]:
                tool_use_id = renamed[result.tool_call_id or ""].pop(0)
                add("user", [tool_result_block(result, tool_use_id)], result)
    return (system or None), turns


def _parts_from_blocks(blocks: Iterable[Mapping[str, Any]]) -> tuple[Part, ...]:
    parts: list[Part] = []
    for b in blocks:
        if b.get("type") == "text":
            parts.append(TextPart(str(b.get("text", ""))))
        elif b.get("type") == "image":
            src = b.get("source", {})
            src = src if isinstance(src, Mapping) else {}
            fields = (src.get("media_type"), src.get("data"))
            if src.get("type") == "base64" and all(isinstance(f, str) for f in fields):
                parts.append(ImagePart(url=f"data:{src['media_type']};base64,{src['data']}"))
            elif src.get("type") == "url" and isinstance(src.get("url"), str):
                parts.append(ImagePart(url=src["url"]))
            else:
                parts.append(RawPart(dict(b)))
        else:
            parts.append(RawPart(dict(b)))
    return tuple(parts)


def _simplify(parts: tuple[Part, ...]) -> str | tuple[Part, ...]:
    """A single text part becomes a plain string (OpenAI's usual shape)."""
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return parts[0].text
    if not parts:
        return ""
    return parts


def _assistant(blocks: Sequence[Mapping[str, Any]], calls: tuple[ToolCall, ...]) -> Message:
    """An assistant turn: ``tool_use`` blocks become calls; text alone is a string; any
    other block (``thinking``, ``redacted_thinking``, server tool blocks) stays a
    :class:`RawPart` in its place among the text parts, sent back byte for byte. Blocks
    that came after a ``tool_use`` have their order kept in ``meta`` (:data:`_ORDER`)."""
    rest = [b for b in blocks if b.get("type") != "tool_use"]
    if all(b.get("type") == "text" for b in rest):
        text = "".join(str(b.get("text", "")) for b in rest)
        return Message.assistant(text or None, calls)
    parts = tuple(
        TextPart(str(b.get("text", ""))) if b.get("type") == "text" else RawPart(dict(b))
        for b in rest
    )
    order = "".join("t" if b.get("type") == "tool_use" else "c" for b in blocks)
    meta = {} if "tc" not in order else {_ORDER: order}
    return Message(role="assistant", content=parts, tool_calls=calls, meta=meta)


def messages_from_anthropic(
    system: str | Sequence[Mapping[str, Any]] | None, messages: Sequence[Mapping[str, Any]]
) -> list[Message]:
    """Convert an Anthropic request (``system``, ``messages``) back to our messages."""
    out = system_from_anthropic(system)
    if not isinstance(messages, list | tuple):
        raise InvalidMessageError(f"messages must be a list, got {type(messages).__name__}")
    turns, _ = turns_from_anthropic(messages)
    return out + turns


def system_from_anthropic(system: str | Sequence[Mapping[str, Any]] | None) -> list[Message]:
    """The system messages of an Anthropic request's ``system`` (text or text blocks)."""
    out: list[Message] = []
    if isinstance(system, str):
        out.append(Message.system(system))
    elif system:
        if not isinstance(system, list) or not all(
            isinstance(b, Mapping) and isinstance(b.get("text", ""), str) for b in system
        ):
            raise InvalidMessageError(
                "system must be text or a list of text blocks", field="system"
            )
        for block in system:
            out.append(Message.system(block.get("text", "")))
    return out


def turns_from_anthropic(
    messages: Sequence[Mapping[str, Any]],
    start: int = 0,
    names: Mapping[str, str] | None = None,
) -> tuple[list[Message], dict[str, str]]:
    """Our messages from the turns ``messages[start:]``, and the tool names by
    ``tool_use`` id after them. A turn's messages depend on the turns before it only
    through those names (a ``tool_result`` is named after its ``tool_use``), so converting
    ``messages[:k]`` and then ``messages[k:]`` with the names the first part returned
    gives what converting all at once gives."""
    out: list[Message] = []
    names = dict(names or {})
    for index, turn in enumerate(messages[start:], start):
        if not isinstance(turn, Mapping):
            raise InvalidMessageError(
                f"a message must be an object, got {type(turn).__name__}", index=index
            )
        for key, value in turn.items():
            check_json_value(value, index=index, field=str(key))
        role = turn.get("role")
        content = turn.get("content")
        if not isinstance(role, str) or role not in ("user", "assistant"):
            raise InvalidMessageError(
                f"role must be user or assistant, got {role!r}", index=index, field="role"
            )
        blocks: list[Mapping[str, Any]]
        if isinstance(content, str):
            blocks = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            if not all(isinstance(b, Mapping) for b in content):
                raise InvalidMessageError(
                    "each content block must be an object", index=index, field="content"
                )
            blocks = list(content)
        else:
            raise InvalidMessageError(
                "content must be text or a list", index=index, field="content"
            )
        if role == "assistant":
            calls = []
            for b in blocks:
                if b.get("type") == "tool_use":
                    if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                        raise InvalidMessageError(
                            "a tool_use block needs a string id and name",
                            index=index,
                            field="content",
                        )
                    call_id = _DUP.sub("", b["id"])
                    names[b["id"]] = b["name"]
                    raw = b.get("input", {})
                    if not isinstance(raw, Mapping):
                        raise InvalidMessageError(
                            "a tool_use input must be an object", index=index, field="content"
                        )
                    args = (
                        raw["_raw_arguments"] if set(raw) == {"_raw_arguments"} else json.dumps(raw)
                    )
                    calls.append(ToolCall(id=call_id, name=str(b["name"]), arguments=args))
            out.append(_assistant(blocks, tuple(calls)))
            continue
        pending: list[Mapping[str, Any]] = []
        for b in blocks:
            if b.get("type") == "tool_result":
                use_id = str(b.get("tool_use_id", ""))
                inner = b.get("content", "")
                if isinstance(inner, list) and not all(isinstance(i, Mapping) for i in inner):
                    raise InvalidMessageError(
                        "each block of a tool_result's content must be an object",
                        index=index,
                        field="content",
                    )
                parts = (
                    _parts_from_blocks(inner)
                    if isinstance(inner, list)
                    else (TextPart(str(inner)),)
                )
                result = _simplify(parts)
                meta = {"is_error": True} if b.get("is_error") else {}
                out.append(
                    Message(
                        role="tool",
                        content=result,
                        tool_call_id=_DUP.sub("", use_id),
                        name=names.get(use_id),
                        meta=meta,
                    )
                )
            else:
                pending.append(b)
        if pending:
            out.append(Message.user(_simplify(_parts_from_blocks(pending))))
    return out, names


def decode_data_uri(url: str) -> bytes | None:
    """The bytes of a ``data:`` URI image (used to size images for token estimates)."""
    match = _DATA_URI.match(url)
    return base64.b64decode(match["data"]) if match else None
