"""What a build returns: the context to send, its audit, and the state the next build
needs (its own module, so the argument checks can name it without the engine)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ctxwarden.core.messages import Message
from ctxwarden.formats.anthropic import messages_to_anthropic
from ctxwarden.formats.openai import messages_to_openai
from ctxwarden.pipeline.audit import Audit
from ctxwarden.steps.state import BuildState

__all__ = ["BuiltContext"]


@dataclass(frozen=True)
class BuiltContext:
    """The context to send, what was done to build it, and what the next build needs."""

    messages: tuple[Message, ...]
    audit: Audit
    state: BuildState
    model: str
    layers: Mapping[str, str]  # message id -> layer name

    @property
    def input_tokens(self) -> int:
        return self.audit.input_tokens

    def to_openai(self) -> list[dict[str, Any]]:
        """OpenAI chat messages, ready to send."""
        return messages_to_openai(self.messages)

    def to_anthropic(self) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]]]:
        """``(system, messages)`` for the Anthropic API, ``cache_control`` placed."""
        return messages_to_anthropic(self.messages, cache_breakpoints=self.audit.cache_breakpoints)
