"""ctxwarden: keeps a long-running LLM agent's context window small, cheap and faithful."""

from ._version import __version__
from .conversation import Block, group_blocks, pairing_problems, validate_pairing
from .errors import (
    BudgetError,
    ConfigError,
    CtxwardenError,
    InvalidMessageError,
    MissingDependencyError,
    ProviderError,
    ProviderTimeout,
    RuntimeFailure,
    StoreError,
    SummarizationError,
    UnknownModelError,
    UsageError,
    VersionConflict,
)
from .formats import (
    messages_from_anthropic,
    messages_from_openai,
    messages_to_anthropic,
    messages_to_openai,
)
from .messages import ImagePart, Message, RawPart, TextPart, ToolCall, detect_kind

__all__ = [
    "Block",
    "BudgetError",
    "ConfigError",
    "CtxwardenError",
    "ImagePart",
    "InvalidMessageError",
    "Message",
    "MissingDependencyError",
    "ProviderError",
    "ProviderTimeout",
    "RawPart",
    "RuntimeFailure",
    "StoreError",
    "SummarizationError",
    "TextPart",
    "ToolCall",
    "UnknownModelError",
    "UsageError",
    "VersionConflict",
    "__version__",
    "detect_kind",
    "group_blocks",
    "messages_from_anthropic",
    "messages_from_openai",
    "messages_to_anthropic",
    "messages_to_openai",
    "pairing_problems",
    "validate_pairing",
]
