"""ctxwarden: keeps a long-running LLM agent's context window small, cheap and faithful."""

from ._version import __version__
from .audit import Audit, BuildState
from .conversation import Block, group_blocks, pairing_problems, validate_pairing
from .engine import BuiltContext, build_context
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
from .policy import LedgerConfig, Policy, WindowConfig
from .tokens import TokenCount, TokenCounter, count_tokens

__all__ = [
    "Audit",
    "Block",
    "BudgetError",
    "BuildState",
    "BuiltContext",
    "ConfigError",
    "CtxwardenError",
    "ImagePart",
    "InvalidMessageError",
    "LedgerConfig",
    "Message",
    "MissingDependencyError",
    "Policy",
    "ProviderError",
    "ProviderTimeout",
    "RawPart",
    "RuntimeFailure",
    "StoreError",
    "SummarizationError",
    "TextPart",
    "TokenCount",
    "TokenCounter",
    "ToolCall",
    "UnknownModelError",
    "UsageError",
    "VersionConflict",
    "WindowConfig",
    "__version__",
    "build_context",
    "count_tokens",
    "detect_kind",
    "group_blocks",
    "messages_from_anthropic",
    "messages_from_openai",
    "messages_to_anthropic",
    "messages_to_openai",
    "pairing_problems",
    "validate_pairing",
]
