"""Wire formats at the edges: OpenAI chat, Anthropic messages, OpenAI Responses items and
Gemini contents."""

from ctxwarden.formats.anthropic import messages_from_anthropic, messages_to_anthropic
from ctxwarden.formats.gemini import messages_from_gemini, messages_to_gemini
from ctxwarden.formats.openai import (
    message_from_openai,
    message_to_openai,
    messages_from_openai,
    messages_to_openai,
)
from ctxwarden.formats.responses import messages_from_responses, messages_to_responses

__all__ = [
    "message_from_openai",
    "message_to_openai",
    "messages_from_anthropic",
    "messages_from_gemini",
    "messages_from_openai",
    "messages_from_responses",
    "messages_to_anthropic",
    "messages_to_gemini",
    "messages_to_openai",
    "messages_to_responses",
]
