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

Messages convert part by part (:mod:`._pydantic_ai_messages`): a tool return stays
with its call, unchanged messages go back as the very objects, a ``CompactionPart`` is
always sent unchanged. The instructions count against the budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxwarden.core.errors import MissingDependencyError
from ctxwarden.core.messages import Message
from ctxwarden.integrations._common import ContextBuilder

try:
    from pydantic_ai import messages as pm
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.models import ModelRequestContext
    from pydantic_ai.tools import RunContext, ToolDefinition
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxwarden.integrations.pydantic_ai", "pydantic-ai") from exc

from ctxwarden.integrations._pydantic_ai_messages import (
    instructions_of,
    messages_back,
    messages_from_pydantic,
)

if TYPE_CHECKING:
    from ctxwarden import Audit, BuiltContext, Policy, Summarizer

__all__ = ["ContextCapability", "HistoryProcessor", "history_processor", "messages_from_pydantic"]

_INSTRUCTIONS_ID = "pai:instructions"


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
        instructions = instructions if instructions is not None else instructions_of(history)
        if instructions:
            ours.insert(0, Message.system(instructions, id=_INSTRUCTIONS_ID))
        built = self.builder.build(ours, _tool_dicts(self.tools if tools is None else tools))
        return messages_back(built.messages, history, conv)

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
