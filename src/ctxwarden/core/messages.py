"""The message model every other module speaks (R1).

One frozen dataclass, :class:`Message`, with a ``role`` discriminator covering system,
user, assistant (text and tool calls) and tool results, plus the metadata a context
manager needs: a stable ``id``, the ``kind`` of a tool result, ``pinned``,
``priority``, ``created_at`` and free ``meta``. Wire formats live at the edges
(:mod:`ctxwarden.formats`); the methods here only delegate to them.

Messages never change: strategies return new ones with :func:`dataclasses.replace`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from itertools import repeat
from typing import Any, Literal, get_args

from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.kinds import ResultKind, detect_kind

__all__ = [
    "ImagePart",
    "Message",
    "Part",
    "Priority",
    "RawPart",
    "ResultKind",
    "Role",
    "TextPart",
    "ToolCall",
    "check_message_list",
    "detect_kind",
    "sole_text",
    "wire_dict",
]

Role = Literal["system", "user", "assistant", "tool"]
Priority = Literal["critical", "high", "medium", "low"]

ROLES: tuple[str, ...] = get_args(Role)
RESULT_KINDS: tuple[str, ...] = get_args(ResultKind)
PRIORITIES: tuple[str, ...] = get_args(Priority)
# where a field of ours sits in the OpenAI dict (errors name the wire field)
_FIELD = {"id": "ctxwarden.id", "meta": "ctxwarden.meta"}


@dataclass(frozen=True)
class TextPart:
    """A text part of a multi-part content."""

    text: str


@dataclass(frozen=True)
class ImagePart:
    """An image, by URL (``https://…`` or a ``data:`` URI); ``detail`` as OpenAI names it."""

    url: str
    detail: str | None = None


@dataclass(frozen=True)
class RawPart:
    """A part we do not model (audio, file, provider extensions), kept verbatim."""

    data: Mapping[str, Any]


Part = TextPart | ImagePart | RawPart


@dataclass(frozen=True)
class ToolCall:
    """One function call requested by the assistant; ``arguments`` is the raw JSON text."""

    id: str
    name: str
    arguments: str = "{}"

    def __post_init__(self) -> None:
        for field_name in ("id", "name", "arguments"):
            if not isinstance(getattr(self, field_name), str):
                raise InvalidMessageError(
                    f"a tool call's {field_name} must be a str, got "
                    f"{type(getattr(self, field_name)).__name__}",
                    field="tool_calls",
                )

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a dict; ``{}`` when they are not a JSON object."""
        try:
            value = json.loads(self.arguments) if self.arguments else {}
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's limit
            return {}
        return value if isinstance(value, dict) else {}


class _Memoised:
    """Where a :class:`Message` keeps its ``_memo``: a slot, not a key of its ``__dict__``.

    Why: builds read ``message._memo`` for every message, several times (its token
    count, its wire bytes, a step's kept outcome). An attribute held in the instance's
    ``__dict__`` is read by Python 3.11's specialised instruction only while every
    message it meets keeps its dict in one shape (inline values, or a dict made
    earlier); a build's messages come in both (a stored copy has its dict, a message
    parsed or cut this call mostly not), so those reads fell back to the generic
    lookup: ~5,000 per proxied call, 9% of its instructions. A slot is read the same
    fast way whatever the dict's shape."""

    __slots__ = ("_memo",)

    def __setstate__(self, state: Any) -> None:
        """Unpickling and copying (a frozen message refuses ``setattr``): the dict as it
        was, the memo into its slot (a pickle made before the slot has it in the dict)."""
        own, slots = state if isinstance(state, tuple) else (state, None)
        own = dict(own or {})
        memo = {**own.pop("_memo", {}), **(slots or {}).get("_memo", {})}
        self.__dict__.update(own)
        object.__setattr__(self, "_memo", memo)


@dataclass(frozen=True, kw_only=True)
class Message(_Memoised):
    """One conversation message, provider-neutral.

    ``content`` is text, a tuple of parts (text and images), or ``None`` (an assistant
    message that only calls tools). ``extra`` keeps wire keys we do not model so the
    round trip to the provider format is lossless.
    """

    role: Role
    content: str | tuple[Part, ...] | None = None
    id: str = ""
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    kind: ResultKind | None = None
    pinned: bool = False
    priority: Priority = "medium"
    created_at: float | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    _memo: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    """Results of pure functions of this message (its token count per counter, its wire
    bytes, a step's outcome), kept with it: the message never changes, so they never go
    stale. Declared, so nothing writes undeclared attributes into a frozen object."""

    def __post_init__(self) -> None:
        if isinstance(self.content, list):
            object.__setattr__(self, "content", tuple(self.content))
        if isinstance(self.tool_calls, list):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        self._check_types()
        if self.role not in ROLES:
            raise InvalidMessageError(
                f"role must be one of {', '.join(ROLES)}, got {self.role!r}", field="role"
            )
        if self.priority not in PRIORITIES:
            raise InvalidMessageError(
                f"priority must be one of {', '.join(PRIORITIES)}, got {self.priority!r}",
                field="priority",
            )
        if self.tool_calls and self.role != "assistant":
            raise InvalidMessageError(
                "only assistant messages carry tool_calls", field="tool_calls"
            )
        if self.role == "tool":
            if not self.tool_call_id:
                raise InvalidMessageError(
                    "a tool result needs the tool_call_id of its call", field="tool_call_id"
                )
            if self.kind is None:
                object.__setattr__(self, "kind", detect_kind(self.text))
        elif self.kind is not None:
            raise InvalidMessageError("only tool results have a kind", field="kind")
        if self.kind is not None and self.kind not in RESULT_KINDS:
            raise InvalidMessageError(
                f"kind must be one of {', '.join(RESULT_KINDS)}, got {self.kind!r}", field="kind"
            )
        if not self.id:
            object.__setattr__(self, "id", "h" + self.fingerprint[:12])

    def _check_types(self) -> None:
        """Each field holds what its annotation says (a wrong type is an error here, not a
        ``TypeError`` in a later step); ``created_at`` may be given as ISO-8601 text."""
        content = self.content
        if not (content is None or isinstance(content, str)) and (
            not isinstance(content, tuple)
            or not all(isinstance(p, TextPart | ImagePart | RawPart) for p in content)
        ):
            raise InvalidMessageError(
                "content must be a str, a tuple of parts or None", field="content"
            )
        for name, value in (
            ("id", self.id),
            ("name", self.name),
            ("tool_call_id", self.tool_call_id),
        ):
            if value is not None and not isinstance(value, str):
                raise InvalidMessageError(
                    f"must be a str, got {type(value).__name__}", field=_FIELD.get(name, name)
                )
        if not isinstance(self.tool_calls, tuple) or not all(
            isinstance(c, ToolCall) for c in self.tool_calls
        ):
            raise InvalidMessageError("tool_calls must be ToolCall objects", field="tool_calls")
        if not isinstance(self.pinned, bool):
            raise InvalidMessageError(
                f"must be true or false, got {self.pinned!r}", field="ctxwarden.pinned"
            )
        for name, mapping in (("meta", self.meta), ("extra", self.extra)):
            if not isinstance(mapping, Mapping):
                raise InvalidMessageError(
                    f"must be an object, got {type(mapping).__name__}",
                    field=_FIELD.get(name, name),
                )
        if self.created_at is not None and type(self.created_at) is not float:
            from ctxwarden.core.checks import parse_created_at  # formats import this module

            try:
                when = parse_created_at(self.created_at)
            except InvalidMessageError as exc:
                raise InvalidMessageError(exc.reason, field=exc.field) from None
            object.__setattr__(self, "created_at", when)

    # -- constructors -------------------------------------------------------------------

    @classmethod
    def system(cls, text: str, **kw: Any) -> Message:
        return cls(role="system", content=text, **kw)

    @classmethod
    def user(cls, content: str | tuple[Part, ...], **kw: Any) -> Message:
        return cls(role="user", content=content, **kw)

    @classmethod
    def assistant(
        cls, text: str | None = None, tool_calls: tuple[ToolCall, ...] = (), **kw: Any
    ) -> Message:
        return cls(role="assistant", content=text, tool_calls=tuple(tool_calls), **kw)

    @classmethod
    def tool(cls, content: str, tool_call_id: str, name: str | None = None, **kw: Any) -> Message:
        return cls(role="tool", content=content, tool_call_id=tool_call_id, name=name, **kw)

    # -- views ----------------------------------------------------------------------------

    @cached_property
    def text(self) -> str:
        """The text content: parts joined by newlines, images and raw parts left out."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content if isinstance(p, TextPart))

    @cached_property
    def fingerprint(self) -> str:
        """A hash of everything the provider sees (not our metadata): the token-cache key."""
        payload = json.dumps(wire_dict(self), sort_keys=True, ensure_ascii=False, default=str)
        # surrogatepass: a lone surrogate ("\ud800", valid in JSON) hashes like any text
        return hashlib.sha1(payload.encode("utf-8", "surrogatepass")).hexdigest()

    @property
    def is_tool_call(self) -> bool:
        return self.role == "assistant" and bool(self.tool_calls)

    def with_id(self, new_id: str) -> Message:
        """A copy under ``new_id``. Its fingerprint and text do not depend on the id, so
        those already computed are carried over, not computed again (a stored message is
        such a copy, and every build reads its fingerprint)."""
        if not isinstance(new_id, str) or not new_id:
            return replace(self, id=new_id)  # (checked, or an id derived from the content)
        # every field as this checked message holds it, but the id: no field is checked
        # or set again (a store copies each message it appends once or twice)
        own = self.__dict__
        copy = object.__new__(Message)
        kept = copy.__dict__
        for name in _FIELDS:
            kept[name] = own[name]
        kept["id"] = new_id
        object.__setattr__(copy, "_memo", {})  # (outcomes kept there may depend on the id)
        for name in ("fingerprint", "text"):
            if name in own:
                kept[name] = own[name]
        return copy

    def with_content(self, content: str | tuple[Part, ...] | None, **meta: Any) -> Message:
        """A copy with new content (and extra ``meta`` keys), same id and metadata."""
        new_meta = {**self.meta, **meta} if meta else self.meta
        return replace(self, content=content, meta=new_meta)

    # -- wire formats (thin: the converters live in ctxwarden.formats) ----------------------

    @classmethod
    def from_openai(cls, data: Mapping[str, Any], *, index: int | None = None) -> Message:
        """Parse one OpenAI chat message dict (the inverse of :meth:`to_openai`); errors
        name ``index`` and the field. A whole transcript:
        :func:`~ctxwarden.formats.openai.messages_from_openai` (it numbers the ids)."""
        parse: Callable[..., Message] = _codec("from_openai")
        return parse(data, index=index)

    def to_openai(self, *, with_meta: bool = False) -> dict[str, Any]:
        """This message as an OpenAI chat-completions dict; ``with_meta`` adds our
        metadata under the ``"ctxwarden"`` key (providers reject it: for storage only).
        A list: :func:`~ctxwarden.formats.openai.messages_to_openai`."""
        write: Callable[..., dict[str, Any]] = _codec("to_openai")
        return write(self, with_meta=with_meta)


# The wire converters register here when their module is imported (``ctxwarden/__init__``
# imports them before any submodule runs): the model delegates to them without importing
# the formats, which import the model (no import circle).
_CODECS: dict[str, Callable[..., Any]] = {}


def sole_text(message: Message) -> str | None:
    """The message's one text: its content when that is a string, or its one text part
    beside others (a reasoning item, a signed thinking block); ``None`` when it has no text
    or several parts of it (a cut of it has one place to go)."""
    if isinstance(message.content, str):
        return message.content
    texts = [p.text for p in message.content or () if isinstance(p, TextPart)]
    return texts[0] if len(texts) == 1 else None


def register_codec(name: str, function: Callable[..., Any]) -> None:
    """Make ``function`` the converter a :class:`Message` method ``name`` delegates to."""
    _CODECS[name] = function


def _codec(name: str) -> Callable[..., Any]:
    found = _CODECS.get(name)
    if found is None:  # only if ctxwarden's own __init__ was bypassed
        raise RuntimeError(f"Message.{name} needs ctxwarden.formats (import ctxwarden first)")
    return found


def check_message_list(items: Any, name: str = "messages") -> None:
    """Raise :class:`InvalidMessageError` naming ``name`` unless ``items`` is a list (or
    tuple) of :class:`Message` s: the functions that take the model, not wire dicts, say
    so before any work instead of failing on a missing attribute deep inside. One C-level
    pass (``map(isinstance, ...)``), so the hot paths may call it."""
    if not isinstance(items, list | tuple):
        got = "None" if items is None else type(items).__name__
        raise InvalidMessageError(f"{name} must be a list of Message, got {got}")
    if all(map(isinstance, items, repeat(Message))):
        return
    index = next(i for i, m in enumerate(items) if not isinstance(m, Message))
    got = type(items[index]).__name__
    hint = " (parse OpenAI dicts with messages_from_openai)" if got == "dict" else ""
    raise InvalidMessageError(f"{name}[{index}] must be a Message, got {got}{hint}", index=index)


# -- the canonical form ------------------------------------------------------------------------


_FIELDS = tuple(f.name for f in fields(Message) if f.name != "_memo")


def _part_dict(part: Part) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        image: dict[str, Any] = {"url": part.url}
        if part.detail is not None:
            image["detail"] = part.detail
        return {"type": "image_url", "image_url": image}
    return dict(part.data)


def wire_dict(message: Message) -> dict[str, Any]:
    """What a provider sees of ``message``, as an OpenAI chat dict without our metadata.

    It is the canonical form: :attr:`Message.fingerprint` hashes it, and
    :func:`ctxwarden.formats.openai.message_to_openai` writes it (the model stays free of
    any import of the wire formats)."""
    extra = dict(message.extra)
    out: dict[str, Any] = {"role": extra.pop("__role__", message.role)}
    no_content = extra.pop("__no_content__", False)
    empty_calls = extra.pop("__empty_tool_calls__", False)
    if not (no_content and message.content is None):
        if isinstance(message.content, tuple):
            out["content"] = [_part_dict(p) for p in message.content]
        else:
            out["content"] = message.content
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls or empty_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    out.update(extra)
    return out
