"""``ctxwarden.count_tokens``: a chat request given in OpenAI's wire format, counted.

The counter itself (:mod:`ctxwarden.core.tokens.counter`) counts :class:`Message` s and
imports no wire format; this convenience parses OpenAI dicts first, so it sits with the
formats, above the core.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.formats.openai import messages_from_openai

__all__ = ["count_tokens"]


def count_tokens(
    messages: Iterable[Message | Mapping[str, Any]],
    model: str = "gpt-4o",
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> int:
    """Input tokens of a chat request (OpenAI dicts or :class:`Message` s)."""
    parsed = messages_from_openai(messages)
    return TokenCounter.for_model(model).count_messages(parsed, tools).tokens
