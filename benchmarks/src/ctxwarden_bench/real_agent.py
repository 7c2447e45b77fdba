"""A real model as the bench's agent (``ctxwarden bench --agent-model SPEC``).

The scripted laptop-shop agent makes every strategy see the same history. A real agent
cannot: what it asks and answers depends on the context it was given, so each strategy
holds its *own* conversation with the model. Per user turn the bench appends the
question, asks the strategy for the context, sends it with the scenario's tool
definitions, runs the tool calls the model makes against the scenario's tools, and
asks again until the model answers in text or ``max_tool_rounds`` rounds of tool calls
are used (the turn then counts as unanswered, and the unexecuted calls are dropped so
the history stays valid).

Input tokens are recorded twice: the provider's ``prompt_tokens`` of each request
(real usage) and our exact count of the same context, so the report shows both.

The agent goes through the OpenAI-compatible client (``openai:``, ``ollama:``,
``openrouter:``, ``vllm:``, ``lmstudio:`` specs; base URL and key from the spec or
the usual environment variables). The tool definitions ride in the request body
(``extra_body``), and the tool calls are read from the SDK's response, so no second
client is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxwarden.core.errors import ConfigError, ProviderError, RuntimeFailure
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.registry.usage import Usage
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden_bench.live import ModelRunner

__all__ = ["AGENT_PROVIDERS", "MAX_TOOL_ROUNDS", "Conversation", "ToolAgent", "agent_client"]

AGENT_PROVIDERS = ("openai", "ollama", "openrouter", "vllm", "lmstudio")
MAX_TOOL_ROUNDS = 6

Strategy = Callable[[Sequence[Message]], list[Message]]
RunTool = Callable[[ToolCall], str]


def agent_client(spec: Any, tools: Sequence[Mapping[str, Any]]) -> Any:
    """An OpenAI-compatible client for ``spec`` that sends ``tools`` with every request.

    ``spec`` is a provider spec or an :class:`~ctxwarden.llm.OpenAICompatible`; anything
    else is a :class:`ConfigError` saying which specs work.
    """
    from ctxwarden.llm.openai_compat import OpenAICompatible
    from ctxwarden.llm.spec import parse_spec

    model = parse_spec(spec) if isinstance(spec, str) else spec
    if not isinstance(model, OpenAICompatible):
        shown = spec if isinstance(spec, str) else type(spec).__name__
        raise ConfigError(
            f"--agent-model {shown}: the bench's agent runs through the OpenAI-compatible "
            f"client; use a {', '.join(p + ':' for p in AGENT_PROVIDERS)} spec "
            "(e.g. openai:gpt-4o-mini or ollama:qwen3:8b)"
        )
    model.extra_body = {**model.extra_body, "tools": [dict(t) for t in tools]}
    return model


@dataclass
class Conversation:
    """What one strategy's conversation with the agent sent and cost.

    ``contexts[i]`` is the request that ended turn ``i + 1`` (the answer, or the last
    try when the rounds ran out); ``provider_input_tokens`` are its ``prompt_tokens``.
    """

    contexts: list[list[Message]] = field(default_factory=list)
    provider_input_tokens: list[int] = field(default_factory=list)
    usage: Usage = field(default_factory=lambda: Usage(calls=0))
    counted_input_tokens: int = 0
    tool_calls: int = 0
    unanswered: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "provider_input_tokens_per_turn": list(self.provider_input_tokens),
            "agent_requests": self.usage.calls,
            "agent_input_tokens": self.usage.input_tokens,
            "agent_cached_input_tokens": self.usage.cached_input_tokens,
            "agent_output_tokens": self.usage.output_tokens,
            "counted_input_tokens_all_requests": self.counted_input_tokens,
            "agent_tool_calls": self.tool_calls,
            "agent_unanswered_turns": self.unanswered,
        }


def _tool_calls(raw: Any, turn: int, round_no: int) -> tuple[ToolCall, ...]:
    """The tool calls of an SDK chat-completion response (none when it has none)."""
    choices = getattr(raw, "choices", None) or ()
    message = getattr(choices[0], "message", None) if choices else None
    calls = []
    for k, call in enumerate(getattr(message, "tool_calls", None) or ()):
        function = getattr(call, "function", None)
        if function is None:
            continue
        call_id = getattr(call, "id", None) or f"call_t{turn}_{round_no}_{k}"
        calls.append(ToolCall(call_id, function.name, function.arguments or "{}"))
    return tuple(calls)


class ToolAgent:
    """A chat model that calls tools, driven turn by turn for one strategy at a time.

    ``max_tokens`` and ``temperature`` default to the provider's own defaults: reasoning
    models reject a temperature and spend a small answer limit on thinking.
    """

    def __init__(
        self,
        model: Any,
        tools: Sequence[Mapping[str, Any]],
        run_tool: RunTool,
        *,
        max_tool_rounds: int = MAX_TOOL_ROUNDS,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> None:
        if max_tool_rounds < 0:
            raise ConfigError(f"max_tool_rounds must be >= 0, got {max_tool_rounds}")
        self.model = agent_client(model, tools)
        self.tools = [dict(t) for t in tools]
        self.run_tool = run_tool
        self.max_tool_rounds = max_tool_rounds
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._runner = ModelRunner()

    @property
    def name(self) -> str:
        return str(self.model.name)

    def converse(
        self,
        name: str,
        strategy: Strategy,
        system: Message,
        questions: Sequence[str],
        counter: TokenCounter,
        *,
        after_turn: Callable[[Sequence[Message]], None] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Conversation:
        """Play ``questions`` as strategy ``name``'s own conversation with the model."""
        out = Conversation()
        history: list[Message] = [system]
        for turn, question in enumerate(questions, start=1):
            history.append(Message.user(question, id=f"t{turn}-q"))
            self._turn(name, strategy, history, turn, counter, out)
            if after_turn is not None:
                after_turn(history)
            if progress:
                progress(f"laptop-shop {name} turn {turn} ({self.name})")
        return out

    def _turn(
        self,
        name: str,
        strategy: Strategy,
        history: list[Message],
        turn: int,
        counter: TokenCounter,
        out: Conversation,
    ) -> None:
        for round_no in range(self.max_tool_rounds + 1):
            context = strategy(history)
            done = self._ask(name, context, turn)
            out.usage = out.usage + done.usage
            out.counted_input_tokens += counter.count_messages(context, self.tools).tokens
            calls = _tool_calls(done.raw, turn, round_no)
            if not calls or round_no == self.max_tool_rounds:
                out.contexts.append(context)
                out.provider_input_tokens.append(done.usage.input_tokens)
                if calls or not done.text.strip():
                    out.unanswered += 1
                if not calls and done.text.strip():
                    history.append(Message.assistant(done.text, id=f"t{turn}-a"))
                return
            out.tool_calls += len(calls)
            history.append(Message.assistant(done.text or None, calls, id=f"t{turn}-c{round_no}"))
            history += [
                Message.tool(self.run_tool(c), c.id, name=c.name, id=f"t{turn}-c{round_no}-r{k}")
                for k, c in enumerate(calls)
            ]

    def _ask(self, name: str, context: Sequence[Message], turn: int) -> Any:
        try:
            return self._runner.run(
                self.model.complete(
                    context, max_tokens=self.max_tokens, temperature=self.temperature
                )
            )
        except RuntimeFailure as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            raise ProviderError(
                f"the agent model {self.name} failed at turn {turn} of strategy {name!r}: {first}",
                status=getattr(exc, "status", None),
                provider=getattr(exc, "provider", None),
            ) from exc

    def close(self) -> None:
        """Release the model's connections."""
        self._runner.close(self.model)

    def __enter__(self) -> ToolAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
