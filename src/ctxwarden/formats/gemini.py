"""Gemini API wire format (``generateContent``) <-> :class:`~ctxwarden.core.messages.Message`.

A Gemini request holds ``contents``: turns ``{"role": "user" | "model", "parts": [...]}``,
and a ``systemInstruction`` (a content whose text parts are the system prompt). A part
is one of ``text``, ``inlineData``, ``functionCall``, ``functionResponse``, a thought
(``{"text": ..., "thought": true}``), and may carry a ``thoughtSignature`` that must go
back exactly as received (Gemini 3 refuses a function-calling turn without it). The
mapping, chosen so that :func:`messages_to_gemini` writes back exactly what
:func:`messages_from_gemini` read:

* a ``model`` turn is one assistant message. Its ``functionCall`` parts become
  :class:`~ctxwarden.core.messages.ToolCall` s, and each also leaves a *placeholder* in the
  content, in its place: the part without ``args`` (so its ``thoughtSignature`` and any
  other key are counted in the budget and go back in place). Plain text parts are
  :class:`TextPart` s; every other part (thoughts, signed text, code, unknown parts) is
  a :class:`RawPart`, byte for byte, as ``{"type": "gemini", "part": PART}`` (the
  stores keep raw parts by their ``type``).
* a ``user`` turn's ``functionResponse`` parts become tool messages, one per part, then
  its other parts one user message (an image as ``inlineData`` is an
  :class:`ImagePart`, so it is counted as an image). ``meta`` remembers what the
  message model has no field for: the part around the response (its ``id``, ``name``
  and other keys), the response's single text key (``{"output": "..."}`` is the text,
  so masking and truncation see text), which messages came in one turn, and where the
  other parts sat among the responses.
* a ``functionResponse`` is paired with its ``functionCall`` by ``id``, or, where
  Gemini gives none (its API usually does not), by name and order among the calls not
  yet answered. Calls without an id get a stable synthetic one, ``gemini-T-K`` (turn
  ``T`` of ``contents``, call ``K`` of the turn): the same contents give the same ids
  on every request, and a reply stored as turn ``T`` gets the ids its resent copy will
  get. Synthetic ids are never written upstream (the placeholder has no ``id``).
* each text part of ``systemInstruction`` is one system message, and so are the leading
  system messages the build adds (facts, a ledger), in order. A system message *after* the
  conversation began (a layer the layout put after the task, a recall block before the
  newest question) is sent where it stands, as text of the user turn it meets: appended
  to a user turn before it, or opening one that the next user message continues (Gemini
  wants user and model turns to alternate). In ``systemInstruction`` every change to it
  would rewrite the cached prefix from the start.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ctxwarden.core.checks import check_json_value
from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import ImagePart, Message, Part, RawPart, TextPart, ToolCall

__all__ = [
    "contents_from_gemini",
    "merge_streamed_parts",
    "messages_from_gemini",
    "messages_to_gemini",
    "reply_from_gemini",
    "system_from_gemini",
]

_DATA_URI = re.compile(r"^data:(?P<media>[\w/+.-]+);base64,(?P<data>.*)$", re.DOTALL)
_PART = "gemini_part"  # meta: a functionResponse part without its response
_KEY = "gemini_response_key"  # meta: the response was {KEY: text}; the text is the content
_JOINED = "gemini_joined"  # meta: the message continues the turn of the message before it
_NEW_TURN = "gemini_new_turn"  # meta: a tool message that started a user turn of its own
_ORDER = "gemini_order"  # meta: a user turn's order, "r" a response, "c" another part
_SYSTEM = "gemini_system"  # meta: systemInstruction's keys other than parts
_RAW = "gemini"  # the type of a RawPart that holds a Gemini part
_SYNTHETIC = re.compile(r"^gemini-\d+-\d+$")  # an id of ours (synthetic_id), not Gemini's
_SLOT: Any = None  # where a value removed from a part sat (its key keeps the place)


def _raw(part: Mapping[str, Any]) -> RawPart:
    """A Gemini part we keep verbatim, tagged (a stored raw part names its ``type``)."""
    return RawPart({"type": _RAW, "part": dict(part)})


def _unraw(part: RawPart) -> dict[str, Any]:
    """The part a :class:`RawPart` holds: a Gemini part as it came; another provider's
    raw part as it is."""
    inner = part.data.get("part")
    if part.data.get("type") == _RAW and isinstance(inner, Mapping):
        return dict(inner)
    return dict(part.data)


def _call_slot(part: Part) -> Mapping[str, Any] | None:
    """The ``functionCall`` placeholder ``part`` is, if it is one."""
    if not isinstance(part, RawPart) or part.data.get("type") != _RAW:
        return None
    inner = part.data.get("part")
    return inner if isinstance(inner, Mapping) and "functionCall" in inner else None


def _error(reason: str, index: int, field: str = "parts") -> InvalidMessageError:
    return InvalidMessageError(reason, index=index, field=f"contents.{field}")


def synthetic_id(turn: int, k: int) -> str:
    """The id of call ``k`` of turn ``turn`` when Gemini gave it none."""
    return f"gemini-{turn}-{k}"


# -- Gemini -> messages ---------------------------------------------------------------


def _user_part(part: Mapping[str, Any]) -> Part:
    if set(part) == {"text"} and isinstance(part["text"], str):
        return TextPart(part["text"])
    data = part.get("inlineData")
    if (
        set(part) == {"inlineData"}
        and isinstance(data, Mapping)
        and list(data) == ["mimeType", "data"]
        and isinstance(data["mimeType"], str)
        and data["mimeType"].startswith("image/")
        and isinstance(data["data"], str)
    ):
        return ImagePart(url=f"data:{data['mimeType']};base64,{data['data']}")
    return _raw(part)


def _content(parts: list[Part]) -> str | tuple[Part, ...]:
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return parts[0].text
    return tuple(parts)


def _parts_of(turn: Any, index: int) -> tuple[str, list[Mapping[str, Any]]]:
    if not isinstance(turn, Mapping):
        raise _error(f"a content must be an object, got {type(turn).__name__}", index, "")
    role = turn.get("role", "user")
    if role not in ("user", "model"):
        raise _error(f"role must be user or model, got {role!r}", index, "role")
    parts = turn.get("parts", [])
    if not isinstance(parts, list) or not all(isinstance(p, Mapping) for p in parts):
        raise _error("parts must be a list of objects", index)
    check_json_value(parts, index=index, field="contents.parts")
    return str(role), parts


def _model_turn(parts: list[Mapping[str, Any]], index: int) -> Message:
    content: list[Part] = []
    calls: list[ToolCall] = []
    for part in parts:
        call = part.get("functionCall")
        if call is None:
            plain = set(part) == {"text"} and isinstance(part["text"], str)
            content.append(TextPart(part["text"]) if plain else _raw(part))
            continue
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            raise _error("a functionCall needs a string name", index)
        args = call.get("args", {})
        if not isinstance(args, Mapping):
            raise _error("a functionCall's args must be an object", index)
        given = call.get("id")
        if given is not None and (not isinstance(given, str) or not given):
            raise _error("a functionCall's id must be a non-empty string", index)
        call_id = given or synthetic_id(index, len(calls))
        calls.append(ToolCall(id=call_id, name=call["name"], arguments=json.dumps(args)))
        slot = {k: _SLOT if k == "args" else v for k, v in call.items()}
        content.append(_raw({**part, "functionCall": slot}))
    if all(isinstance(p, TextPart) for p in content) and len(content) == 1:
        return Message.assistant(content[0].text, tuple(calls))  # type: ignore[union-attr]
    return Message(role="assistant", content=tuple(content) or None, tool_calls=tuple(calls))


def _response_message(
    part: Mapping[str, Any], index: int, pending: list[tuple[str, str]], meta: dict[str, Any]
) -> Message:
    response = part["functionResponse"]
    if not isinstance(response, Mapping) or not isinstance(response.get("name"), str):
        raise _error("a functionResponse needs a string name", index)
    name, given = response["name"], response.get("id")
    if given is not None:
        if not isinstance(given, str) or not given:
            raise _error("a functionResponse's id must be a non-empty string", index)
        call_id = given
        pending[:] = [p for p in pending if p[0] != given]
    else:
        found = next((i for i, (_, n) in enumerate(pending) if n == name), None)
        if found is None:
            raise _error(
                f"functionResponse {name!r} has no unanswered functionCall before it", index
            )
        call_id = pending.pop(found)[0]
    value = response.get("response", {})
    meta[_PART] = {
        **part,
        "functionResponse": {k: _SLOT if k == "response" else v for k, v in response.items()},
    }
    if isinstance(value, Mapping) and len(value) == 1:
        ((key, text),) = value.items()
        if isinstance(text, str):
            meta[_KEY] = key
            return Message(role="tool", content=text, tool_call_id=call_id, name=name, meta=meta)
    text = json.dumps(value, ensure_ascii=False)
    return Message(role="tool", content=text, tool_call_id=call_id, name=name, meta=meta)


def contents_from_gemini(
    contents: Sequence[Any], start: int = 0, pending: Sequence[tuple[str, str]] = ()
) -> tuple[list[Message], list[tuple[str, str]]]:
    """Our messages from ``contents[start:]``, and the ``(id, name)`` of the calls still
    unanswered after them (what converting the turns after needs: pass it back with the
    next ``start``)."""
    if not isinstance(contents, list | tuple):
        raise InvalidMessageError(
            f"contents must be a list, got {type(contents).__name__}", field="contents"
        )
    out: list[Message] = []
    open_calls = list(pending)
    previous_role = None
    for index in range(start, len(contents)):
        role, parts = _parts_of(contents[index], index)
        if role == "model":
            message = _model_turn(parts, index)
            open_calls = [(c.id, c.name) for c in message.tool_calls]
            out.append(message)
            previous_role = role
            continue
        first = True
        others: list[Part] = []
        order = ""
        for part in parts:
            if "functionResponse" not in part:
                others.append(_user_part(part))
                order += "c"
                continue
            meta: dict[str, Any] = {}
            if not first:
                meta[_JOINED] = True
            elif previous_role == "user" and out and out[-1].role == "tool":
                meta[_NEW_TURN] = True  # (the default would join the turn before)
            out.append(_response_message(part, index, open_calls, meta))
            order += "r"
            first = False
        if others or not parts:
            meta = {}
            if not first:
                meta[_JOINED] = True
                if order.rstrip("c") != order.replace("c", ""):  # a part before a response
                    meta[_ORDER] = order
            out.append(Message(role="user", content=_content(others), meta=meta))
        previous_role = role
    return out, open_calls


def reply_from_gemini(content: Any, turn: int) -> Message:
    """A candidate's ``content`` (a ``model`` turn) as the assistant message it is once
    the client sends it back as turn ``turn`` of ``contents`` (its synthetic call ids
    are those that turn will get)."""
    role, parts = _parts_of(content, turn)
    if role != "model":
        raise _error(f"a reply's role must be model, got {role!r}", turn, "role")
    return _model_turn(parts, turn)


def merge_streamed_parts(parts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The parts of a streamed reply as one turn: consecutive text pieces of the same
    kind (answer or thought) joined, the later piece's other keys (a
    ``thoughtSignature``) kept on the joined part; every other part as it came."""
    out: list[dict[str, Any]] = []
    for part in parts:
        last = out[-1] if out else None
        if (
            last is not None
            and isinstance(part.get("text"), str)
            and isinstance(last.get("text"), str)
            and bool(part.get("thought")) == bool(last.get("thought"))
            and "thoughtSignature" not in last
            and set(last) <= {"text", "thought"}
        ):
            out[-1] = {**last, **part, "text": last["text"] + part["text"]}
        else:
            out.append(dict(part))
    return out


def system_from_gemini(system: Any) -> list[Message]:
    """The system messages of a request's ``systemInstruction`` (a content, or text)."""
    if system is None:
        return []
    if isinstance(system, str):
        return [Message.system(system)]
    if not isinstance(system, Mapping):
        raise InvalidMessageError(
            "systemInstruction must be a content object", field="systemInstruction"
        )
    parts = system.get("parts", [])
    if not isinstance(parts, list) or not all(isinstance(p, Mapping) for p in parts):
        raise InvalidMessageError(
            "systemInstruction.parts must be a list of objects", field="systemInstruction"
        )
    check_json_value(system, index=None, field="systemInstruction")
    rest = {k: _SLOT if k == "parts" else v for k, v in system.items()}
    out = []
    for part in parts:
        if set(part) == {"text"} and isinstance(part["text"], str):
            message = Message.system(part["text"])
        else:
            message = Message(role="system", content=(_raw(part),))
        out.append(message)
    if out and list(rest) != ["parts"]:
        out[0] = Message(role="system", content=out[0].content, meta={_SYSTEM: rest})
    return out


def messages_from_gemini(system: Any, contents: Sequence[Any]) -> list[Message]:
    """Convert a Gemini request (``systemInstruction``, ``contents``) to our messages."""
    return system_from_gemini(system) + contents_from_gemini(contents)[0]


# -- messages -> Gemini ---------------------------------------------------------------


def _part(part: Part) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"text": part.text}
    if isinstance(part, ImagePart):
        match = _DATA_URI.match(part.url)
        if match:
            return {"inlineData": {"mimeType": match["media"], "data": match["data"]}}
        return {"fileData": {"fileUri": part.url}}
    return _unraw(part)


def _parts(content: str | tuple[Part, ...] | None) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}]
    return [_part(p) for p in content]


def _args(call: ToolCall) -> Any:
    try:
        value = json.loads(call.arguments) if call.arguments.strip() else {}
    except (ValueError, RecursionError):
        return {"_raw_arguments": call.arguments}
    return value if isinstance(value, dict) else {"_value": value}


def _call_part(call: ToolCall, slot: Mapping[str, Any] | None) -> dict[str, Any]:
    """A call as its ``functionCall`` part: into its placeholder when it has one (its
    keys, order and signature kept; ``id`` only if it came with one)."""
    if slot is None:
        fields = {"id": call.id, "name": call.name, "args": _args(call)}
        if _SYNTHETIC.match(call.id):
            del fields["id"]
        return {"functionCall": fields}
    fields = dict(slot["functionCall"])
    fields["name"] = call.name
    args = _args(call)
    if "args" in fields or args:
        fields["args"] = args
    return {**slot, "functionCall": fields}


def _model_parts(message: Message) -> list[dict[str, Any]]:
    content = message.content
    items = list(content) if isinstance(content, tuple) else None
    slots = [p for p in items or () if _call_slot(p) is not None]
    if items is None or len(slots) != len(message.tool_calls):  # not as it came: calls last
        rest = content if items is None else tuple(p for p in items if p not in slots)
        return _parts(rest) + [_call_part(c, None) for c in message.tool_calls]
    calls = iter(message.tool_calls)
    return [
        _call_part(next(calls), slot) if (slot := _call_slot(p)) is not None else _part(p)
        for p in items
    ]


def _response_part(message: Message) -> dict[str, Any]:
    key = message.meta.get(_KEY)
    text = message.text if not isinstance(message.content, str) else message.content
    if isinstance(key, str):
        response: Any = {key: text}
    else:
        try:
            response = json.loads(text)
        except (ValueError, RecursionError):
            response = None
        if not isinstance(response, dict):
            response = {"output": text}
    slot = message.meta.get(_PART)
    if not isinstance(slot, Mapping) or not isinstance(slot.get("functionResponse"), Mapping):
        fields = {"id": message.tool_call_id, "name": message.name or "", "response": response}
        if _SYNTHETIC.match(message.tool_call_id or ""):  # (a result the proxy answered)
            del fields["id"]
        return {"functionResponse": fields}
    fields = dict(slot["functionResponse"])
    fields["response"] = response
    if message.name is not None:
        fields["name"] = message.name
    return {**slot, "functionResponse": fields}


def _ordered(
    responses: list[dict[str, Any]], others: list[dict[str, Any]], order: Any
) -> list[dict[str, Any]]:
    if (
        not isinstance(order, str)
        or order.count("r") != len(responses)
        or order.count("c") != len(others)
    ):
        return responses + others
    r, c = iter(responses), iter(others)
    return [next(r) if kind == "r" else next(c) for kind in order]


def messages_to_gemini(
    messages: Sequence[Message],
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Convert to ``(systemInstruction, contents)`` for ``generateContent`` (the first
    ``None`` when there is no system message)."""
    system: list[dict[str, Any]] = []
    system_rest: Mapping[str, Any] | None = None
    contents: list[dict[str, Any]] = []
    responses_open = False  # the last turn is a user turn of function responses only
    opened = False  # the last turn is a user turn opened for a system message in place
    for index, message in enumerate(messages):
        meta = message.meta
        if message.role == "system" and not contents:
            if system_rest is None and isinstance(meta.get(_SYSTEM), Mapping):
                system_rest = meta[_SYSTEM]
            system.extend(_parts(message.content))
            continue
        was_opened, opened = opened, False
        if message.role == "system":  # after the conversation began: in place, as user text
            if contents[-1]["role"] == "user":
                contents[-1]["parts"].extend(_parts(message.content))
            else:
                contents.append({"role": "user", "parts": _parts(message.content)})
                opened = True
            responses_open = False
        elif message.role == "assistant":
            contents.append({"role": "model", "parts": _model_parts(message)})
            responses_open = False
        elif message.role == "tool":
            if not message.tool_call_id:
                raise InvalidMessageError("a tool result needs its call's id", index=index)
            part = _response_part(message)
            if contents and (responses_open or was_opened) and not meta.get(_NEW_TURN):
                contents[-1]["parts"].append(part)
            else:
                contents.append({"role": "user", "parts": [part]})
                responses_open = True
        else:
            parts = _parts(message.content)
            if meta.get(_JOINED) and contents and contents[-1]["role"] == "user":
                turn = contents[-1]
                turn["parts"] = _ordered(turn["parts"], parts, meta.get(_ORDER))
            elif was_opened:  # the turn a system message opened: this message continues it
                contents[-1]["parts"].extend(parts)
            else:
                contents.append({"role": "user", "parts": parts})
            responses_open = False
    if not system:
        return None, contents
    if system_rest is None:
        return {"parts": system}, contents
    return {**system_rest, "parts": system}, contents
