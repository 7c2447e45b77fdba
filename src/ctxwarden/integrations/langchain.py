"""LangChain v1: ``ContextMiddleware``, an ``AgentMiddleware`` that builds each model call.

Usage::

    from langchain.agents import create_agent
    from ctxwarden.integrations.langchain import ContextMiddleware

    ctx = ContextMiddleware(model="gpt-4o", max_input_tokens=8000)
    agent = create_agent(model, tools, system_prompt="...", middleware=[ctx])
    agent.invoke({"messages": [...]})
    ctx.last_audit  # what the last call's build kept, masked, truncated or dropped

It is non-destructive, unlike ``SummarizationMiddleware``: ``wrap_model_call`` (and
``awrap_model_call`` for ``ainvoke``) hands the model a request built with
``request.override(messages=..., system_message=...)`` and never touches the graph
state, which keeps the full history. The system prompt arrives as
``request.system_message`` and stays there; ctxwarden's layers (facts, summary, the
ledger of values that left the window) are appended to it, where the layout puts them.

Messages convert both ways without loss: tool calls (``args`` as JSON text), ids,
multimodal content blocks (text and ``image_url`` parts as ours, any other block kept
verbatim), and every other field under ``meta["langchain"]``. Within a call the built
messages map back to the very objects the request held; a masked or truncated tool
result is a copy with the new content.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from ctxwarden.errors import InvalidMessageError, MissingDependencyError
from ctxwarden.integrations._common import (
    ContextBuilder,
    is_layer,
    layer_text,
    split_system,
    stable_id,
)
from ctxwarden.messages import ImagePart, Message, Part, RawPart, TextPart, ToolCall

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
    from langchain_core.messages import (
        AIMessage,
        AIMessageChunk,
        AnyMessage,
        BaseMessage,
        ChatMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
    from langchain_core.tools import BaseTool
    from langchain_core.utils.function_calling import convert_to_openai_tool
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxwarden.integrations.langchain", "langchain") from exc

if TYPE_CHECKING:
    from ctxwarden import Audit, BuiltContext, Policy, Session, Summarizer

__all__ = ["ContextMiddleware", "message_from_langchain", "message_to_langchain"]

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
    if isinstance(message, AIMessage):
        calls = tuple(
            ToolCall(id=c.get("id") or "", name=c["name"], arguments=json.dumps(c["args"]))
            for c in message.tool_calls
        )
    try:
        return Message(
            role=role,  # type: ignore[arg-type]
            content=_content_from(message.content),
            id=message.id or stable_id("lc", index, message.model_dump(mode="json")),
            name=message.name,
            tool_calls=calls,
            tool_call_id=getattr(message, "tool_call_id", None) if role == "tool" else None,
            meta={"langchain": {"type": kind, "id": message.id, "fields": fields}},
        )
    except InvalidMessageError as exc:
        raise InvalidMessageError(exc.reason, index=index, field=exc.field) from None


def message_to_langchain(message: Message) -> BaseMessage:
    """Ours as a LangChain message: the exact inverse of :func:`message_from_langchain`;
    a message from elsewhere (a ctxwarden layer) becomes the class its role names."""
    info = message.meta.get("langchain") or {}
    kind = info.get("type") or _BY_ROLE[message.role]
    data: dict[str, Any] = dict(info.get("fields") or {})
    data["content"] = _content_to(message.content)
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


def _convert(
    system: SystemMessage | None, messages: Sequence[BaseMessage]
) -> tuple[list[Message], dict[str, tuple[BaseMessage, Message]]]:
    """Ours for [system, *messages], and each id's original and first conversion."""
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


def _back(m: Message, originals: Mapping[str, tuple[BaseMessage, Message]]) -> BaseMessage:
    found = originals.get(m.id)
    if found is None:
        return message_to_langchain(m)
    lc, first = found
    if m.content == first.content and m.tool_calls == first.tool_calls:
        return lc
    return lc.model_copy(update={"content": _content_to(m.content)})


def _tool_dicts(tools: Sequence[BaseTool | dict[str, Any]]) -> list[dict[str, Any]]:
    """The function tools as OpenAI definitions, so their tokens count against the budget
    (a provider's built-in tool has no schema to count)."""
    out: list[dict[str, Any]] = []
    for t in tools:
        if isinstance(t, BaseTool):
            out.append(convert_to_openai_tool(t))
        elif isinstance(t, Mapping) and t.get("type") == "function":
            out.append(dict(t))
    return out


# -- the middleware -------------------------------------------------------------------------


class ContextMiddleware(AgentMiddleware):
    """Builds every model call's context with ctxwarden; the graph state is untouched.

    ``model`` names the model for counting and the window (``max_input_tokens`` caps
    the budget), ``policy`` the strategies, ``summarizer`` a rolling summary (as in
    :func:`ctxwarden.build_context`); ``session``, a :class:`ctxwarden.Session`, keeps
    a stored copy of the conversation and builds with its summary and facts.
    """

    def __init__(
        self,
        model: str = "gpt-4o",
        max_input_tokens: int | None = None,
        *,
        policy: Policy | None = None,
        session: Session | None = None,
        summarizer: str | Summarizer | None = None,
    ) -> None:
        super().__init__()
        self.builder = ContextBuilder(model, max_input_tokens, policy, summarizer, session)

    @property
    def last_audit(self) -> Audit | None:
        """The audit of the last build (``None`` before the first model call)."""
        return self.builder.last_audit

    @property
    def last_build(self) -> BuiltContext | None:
        return self.builder.last

    def build_request(self, request: ModelRequest) -> ModelRequest:
        """The request with its context built: what ``wrap_model_call`` hands on."""
        system = request.system_message
        history, originals = _convert(system, request.messages)
        built = self.builder.build(history, _tool_dicts(request.tools) or None)
        head, rest = split_system(built.messages)
        prompt_id = history[0].id if system is not None else None
        kept = [m for m in head if not is_layer(m) and m.id != prompt_id] + rest
        layers = layer_text(head)
        if layers:
            system = _with_layers(system, layers)
        messages = cast("list[AnyMessage]", [_back(m, originals) for m in kept])
        return request.override(messages=messages, system_message=system)

    def wrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], ModelResponse],
    ) -> ModelResponse:
        return handler(self.build_request(request))

    async def awrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> ModelResponse:
        if self.builder.session is not None:  # a store round trip: off the event loop
            built = await asyncio.to_thread(self.build_request, request)
        else:
            built = self.build_request(request)
        return await handler(built)


def _with_layers(system: SystemMessage | None, layers: str) -> SystemMessage:
    """The system prompt with ctxwarden's layers after it (a new message; the prompt's
    own text, and so the cacheable prefix, unchanged)."""
    if system is None:
        return SystemMessage(content=layers)
    if isinstance(system.content, str):
        content: str | list[str | dict[str, Any]] = f"{system.content}\n\n{layers}"
    else:
        content = [*system.content, {"type": "text", "text": layers}]
    return system.model_copy(update={"content": content})
