"""pydantic-ai 2.x: ``ContextCapability`` and the plain ``history_processor``.

Usage::

    from pydantic_ai import Agent
    from ctxwarden.integrations.pydantic_ai import ContextCapability

    ctx = ContextCapability(model="gpt-4o", max_input_tokens=8000)
    agent = Agent("openai:gpt-4o", system_prompt="...", capabilities=[ctx])
    result = agent.run_sync("hi", message_history=earlier)
    ctx.last_audit

``ContextCapability`` works in ``before_model_request`` by assigning
``request_context.messages``: only the request is built, the run's history keeps
everything (pydantic-ai's own ``ProcessHistory`` also overwrites ``ctx.messages``, so
it is destructive). ``history_processor(...)`` is the plain callable, for pydantic-ai
1.x's ``history_processors=`` and for ``ProcessHistory``.

A ``ModelRequest`` holds several parts; each system prompt, user prompt and tool
return becomes its own message, so the window can keep a tool return with its call
and drop the rest of the request; parts we do not model (instruction deltas and the
like) travel with their neighbour. A ``ModelResponse`` is one assistant message
(text, tool calls, thinking counted as a raw part). Going back, kept parts are put
back into copies of their own requests; an unchanged message is the very object.
A message holding a ``CompactionPart`` is pinned and sent back unchanged. The
instructions (``ModelRequest.instructions``) count against the budget; ctxwarden's
layers are added as system prompt parts after the system prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from ctxwarden.errors import MissingDependencyError
from ctxwarden.integrations._common import ContextBuilder, is_layer, stable_id
from ctxwarden.messages import ImagePart, Message, Part, RawPart, TextPart, ToolCall

try:
    from pydantic_ai import messages as pm
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.models import ModelRequestContext
    from pydantic_ai.tools import RunContext, ToolDefinition
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxwarden.integrations.pydantic_ai", "pydantic-ai") from exc

if TYPE_CHECKING:
    from ctxwarden import Audit, BuiltContext, Policy, Summarizer

__all__ = ["ContextCapability", "HistoryProcessor", "history_processor", "messages_from_pydantic"]

_INSTRUCTIONS_ID = "pai:instructions"
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


def _back(
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


def _instructions(history: Sequence[pm.ModelMessage]) -> str | None:
    for message in reversed(history):
        if isinstance(message, pm.ModelRequest):
            return message.instructions
    return None


def _tool_dicts(tools: Sequence[ToolDefinition | Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    out = []
    for t in tools:
        if isinstance(t, Mapping):
            out.append(dict(t))
            continue
        fn = {
            "name": t.name,
            "description": t.description or "",
            "parameters": t.parameters_json_schema,
        }
        out.append({"type": "function", "function": fn})
    return out or None


class HistoryProcessor:
    """A plain history processor: ``messages -> messages`` built by ctxwarden.

    A plain processor does not see the request's tool definitions: pass them as
    ``tools`` (``ToolDefinition`` s or OpenAI tool dicts) so they count against the
    budget (:class:`ContextCapability` reads them from the request itself).
    """

    def __init__(
        self,
        model: str = "gpt-4o",
        max_input_tokens: int | None = None,
        *,
        policy: Policy | None = None,
        summarizer: str | Summarizer | None = None,
        tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
    ) -> None:
        self.builder = ContextBuilder(model, max_input_tokens, policy, summarizer)
        self.tools = tools

    @property
    def last_audit(self) -> Audit | None:
        return self.builder.last_audit

    @property
    def last_build(self) -> BuiltContext | None:
        return self.builder.last

    def build(
        self,
        history: Sequence[pm.ModelMessage],
        tools: Sequence[ToolDefinition | Mapping[str, Any]] | None = None,
        instructions: str | None = None,
    ) -> list[pm.ModelMessage]:
        """The messages to send for ``history``; ``instructions`` (default: those of the
        last request) count as the system prompt, ahead of the history."""
        conv = messages_from_pydantic(history)
        ours = list(conv.messages)
        instructions = instructions if instructions is not None else _instructions(history)
        if instructions:
            ours.insert(0, Message.system(instructions, id=_INSTRUCTIONS_ID))
        built = self.builder.build(ours, _tool_dicts(self.tools if tools is None else tools))
        return _back(built.messages, history, conv)

    def __call__(self, messages: list[pm.ModelMessage]) -> list[pm.ModelMessage]:
        return self.build(messages)


def history_processor(
    model: str = "gpt-4o",
    max_input_tokens: int | None = None,
    *,
    policy: Policy | None = None,
    summarizer: str | Summarizer | None = None,
    tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
) -> HistoryProcessor:
    """A history processor (``.last_audit`` on it) for ``ProcessHistory`` or 1.x agents."""
    return HistoryProcessor(
        model, max_input_tokens, policy=policy, summarizer=summarizer, tools=tools
    )


class ContextCapability(AbstractCapability[Any]):
    """Builds each model request with ctxwarden; the run's history keeps everything."""

    def __init__(
        self,
        model: str = "gpt-4o",
        max_input_tokens: int | None = None,
        *,
        policy: Policy | None = None,
        summarizer: str | Summarizer | None = None,
    ) -> None:
        self.processor = HistoryProcessor(
            model, max_input_tokens, policy=policy, summarizer=summarizer
        )

    @property
    def last_audit(self) -> Audit | None:
        return self.processor.last_audit

    @property
    def last_build(self) -> BuiltContext | None:
        return self.processor.last_build

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        params = request_context.model_request_parameters
        tools = [*params.function_tools, *params.output_tools]
        parts = params.instruction_parts
        instructions = "\n\n".join(p.content for p in parts if p.content) if parts else None
        messages = self.processor.build(request_context.messages, tools, instructions)
        request_context.messages = messages
        return request_context

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # takes Python objects (policy, summariser): not spec-serialisable
