"""Model clients behind one protocol (R12): OpenAI-compatible endpoints, Anthropic, specs.

Importing this package never imports ``openai`` or ``anthropic``: the client classes
are loaded on first access, and the SDK only when a client is built (a missing SDK is
a :class:`~ctxwarden.core.errors.MissingDependencyError` naming the extra to install).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ctxwarden.llm.base import ChatModel, Completion, StreamingChatModel, TextStream, complete_sync
from ctxwarden.llm.retry import RetryPolicy, parse_retry_after
from ctxwarden.llm.spec import parse_spec

if TYPE_CHECKING:
    from ctxwarden.llm.anthropic_client import AnthropicModel, assistant_message
    from ctxwarden.llm.openai_compat import OpenAICompatible

__all__ = [
    "AnthropicModel",
    "ChatModel",
    "Completion",
    "OpenAICompatible",
    "RetryPolicy",
    "StreamingChatModel",
    "TextStream",
    "assistant_message",
    "complete_sync",
    "parse_retry_after",
    "parse_spec",
]

_LAZY = {
    "AnthropicModel": ".anthropic_client",
    "OpenAICompatible": ".openai_compat",
    "assistant_message": ".anthropic_client",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
