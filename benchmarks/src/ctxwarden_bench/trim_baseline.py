"""The side of :mod:`ctxwarden_bench.engine_speed` it is compared with: langchain-core's
``trim_messages`` (``strategy="last"``, ``include_system=True``, ``allow_partial=False``,
``start_on="human"``), counting the same messages by the same OpenAI chat formula with
tiktoken ``o200k_base``, without a cache — the way its docs show it."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import TokenCounter

__all__ = ["langchain_messages", "trim_messages_timer"]


def langchain_messages() -> Any | None:
    """``langchain_core.messages``, or None when langchain-core is not installed."""
    try:
        return importlib.import_module("langchain_core.messages")
    except ImportError:
        return None


def _to_langchain(lc: Any, history: Sequence[Message]) -> list[Any]:
    out: list[Any] = []
    for m in history:
        if m.role == "system":
            out.append(lc.SystemMessage(m.text))
        elif m.role == "user":
            out.append(lc.HumanMessage(m.text))
        elif m.role == "tool":
            out.append(lc.ToolMessage(m.text, tool_call_id=m.tool_call_id or "", name=m.name))
        else:
            calls = [
                {"name": c.name, "args": json.loads(c.arguments or "{}"), "id": c.id}
                for c in m.tool_calls
            ]
            out.append(lc.AIMessage(m.text, tool_calls=calls))
    return out


def _lc_counter(lc: Any, model: str) -> Callable[[list[Any]], int]:
    """The OpenAI chat formula over langchain messages, tiktoken o200k, no cache."""
    encoding = TokenCounter.for_model(model)._encoding
    roles = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}

    def n(text: str) -> int:
        return len(encoding.encode(text, disallowed_special=()))

    def count(messages: list[Any]) -> int:
        total = 3
        for m in messages:
            total += 3 + n(roles.get(m.type, m.type))
            total += n(m.content if isinstance(m.content, str) else json.dumps(m.content))
            if getattr(m, "name", None):
                total += 1 + n(m.name)
            for call in getattr(m, "tool_calls", None) or ():
                total += 3 + n(call["name"]) + n(json.dumps(call["args"]))
        return total

    return count


def trim_messages_timer(
    history: Sequence[Message], budget: int, model: str = "gpt-4o"
) -> Callable[[], int] | None:
    """A zero-argument call that runs ``trim_messages`` once (None: not installed)."""
    lc = langchain_messages()
    if lc is None:
        return None
    messages, counter = _to_langchain(lc, history), _lc_counter(lc, model)

    def call() -> int:
        kept = lc.trim_messages(
            messages,
            max_tokens=budget,
            strategy="last",
            token_counter=counter,
            include_system=True,
            allow_partial=False,
            start_on="human",
        )
        return len(kept)

    return call
