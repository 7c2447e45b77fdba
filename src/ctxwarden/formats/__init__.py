"""Wire formats at the edges: OpenAI chat and Anthropic messages."""

from ctxwarden.formats.anthropic import messages_from_anthropic, messages_to_anthropic
from ctxwarden.formats.openai import (
    message_from_openai,
    message_to_openai,
    messages_from_openai,
    messages_to_openai,
)

__all__ = [
    "message_from_openai",
    "message_to_openai",
    "messages_from_anthropic",
    "messages_from_openai",
    "messages_to_anthropic",
    "messages_to_openai",
]
