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
ledger of values that left the window) are appended to it, where the layout puts them
(to the state's own leading ``SystemMessage`` when the agent has no ``system_prompt``).
A request whose messages were an earlier call's output (fed back) has those layers
taken out and replaced, never stacked (:mod:`ctxwarden.pipeline.carried`).

Messages convert both ways without loss (:mod:`._langchain_messages`:
``message_from_langchain`` / ``message_to_langchain``, re-exported here).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from ctxwarden.core.errors import MissingDependencyError
from ctxwarden.core.messages import Message
from ctxwarden.integrations._common import (
    FOLD_SEPARATOR,
    ContextBuilder,
    layer_text,
    split_system,
)

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
    from langchain_core.messages import AnyMessage, BaseMessage, SystemMessage
    from langchain_core.tools import BaseTool
    from langchain_core.utils.function_calling import convert_to_openai_tool
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxwarden.integrations.langchain", "langchain") from exc

from ctxwarden.integrations._langchain_messages import (
    convert_history,
    message_back,
    message_from_langchain,
    message_to_langchain,
)

if TYPE_CHECKING:
    from ctxwarden import Audit, BuiltContext, Policy, Session, Summarizer

__all__ = ["ContextMiddleware", "message_from_langchain", "message_to_langchain"]


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
        history, originals = convert_history(system, request.messages)
        built = self.builder.build(history, _tool_dicts(request.tools) or None)
        head, rest = split_system(built.messages)
        prompt_id = history[0].id if system is not None else None
        # leading system messages of this request stay; the prompt is the system message;
        # a session's stored prompt (from an earlier run) gives way to this request's
        kept = [m for m in head if m.id in originals and m.id != prompt_id] + rest
        if system is not None and self.builder.session is None:
            system = _prompt_left(head, prompt_id, originals)
        layers = layer_text(head)
        messages = cast("list[AnyMessage]", [message_back(m, originals) for m in kept])
        if layers and system is None and messages and isinstance(messages[0], SystemMessage):
            messages[0] = _with_layers(messages[0], layers)  # the prompt kept in the state
        elif layers:
            system = _with_layers(system, layers)
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


def _prompt_left(
    head: Sequence[Message],
    prompt_id: str | None,
    originals: Mapping[str, tuple[BaseMessage, Message]],
) -> SystemMessage | None:
    """The request's system message as the build left it: itself, or without the layers
    of an earlier build it was given back with (``None`` when it was only those)."""
    prompt = next((m for m in head if m.id == prompt_id), None)
    if prompt is None:
        return None
    back = message_back(prompt, originals)
    return back if isinstance(back, SystemMessage) else None


def _with_layers(system: SystemMessage | None, layers: str) -> SystemMessage:
    """The system prompt with ctxwarden's layers after it (a new message; the prompt's
    own text, and so the cacheable prefix, unchanged)."""
    if system is None:
        return SystemMessage(content=layers)
    if isinstance(system.content, str):
        content: str | list[str | dict[str, Any]] = system.content + FOLD_SEPARATOR + layers
    else:
        content = [*system.content, {"type": "text", "text": layers}]
    return system.model_copy(update={"content": content})
