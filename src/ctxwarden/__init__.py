"""ctxwarden: keeps a long-running LLM agent's context window small, cheap and faithful.

The public API is re-exported here. Provider clients (``OpenAICompatible``,
``AnthropicModel``) load lazily, so importing ctxwarden never imports an SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .audit import Audit, BuildState
from .conversation import Block, group_blocks, pairing_problems, validate_pairing
from .cost import ModelCost, SessionCost, estimate_cost
from .engine import BuiltContext, build_context
from .entities import Entity, extract_entities
from .entity_ledger import EntityLedger
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
from .facts import Facts
from .formats import (
    messages_from_anthropic,
    messages_from_openai,
    messages_to_anthropic,
    messages_to_openai,
)
from .llm import ChatModel, Completion, RetryPolicy, complete_sync, parse_spec
from .llm.offline import OfflineSummarizer, RuleBasedFactExtractor
from .llm.summarizers import LLMFactExtractor, LLMSummarizer
from .messages import ImagePart, Message, RawPart, TextPart, ToolCall, detect_kind
from .policy import LedgerConfig, Policy, WindowConfig
from .registry import ModelInfo, Price, Registry, get_model, load_registry
from .session import Session
from .store import SessionStore, open_store
from .strategies.base import Action, Strategy, StrategyContext, StrategyResult
from .strategies.mask import MaskObservations
from .strategies.truncate import TruncateToolResults
from .summarize import (
    QueryAwareSummarizer,
    Summarizer,
    SummaryResult,
    SummaryState,
    SummaryTrigger,
    summary_view,
)
from .tokens import TokenCount, TokenCounter, count_tokens
from .transcript import Transcript, load_example, parse_transcript, read_transcript
from .usage import Usage

if TYPE_CHECKING:
    from .llm import AnthropicModel, OpenAICompatible

__all__ = [
    "Action",
    "AnthropicModel",
    "Audit",
    "Block",
    "BudgetError",
    "BuildState",
    "BuiltContext",
    "ChatModel",
    "Completion",
    "ConfigError",
    "CtxwardenError",
    "Entity",
    "EntityLedger",
    "Facts",
    "ImagePart",
    "InvalidMessageError",
    "LLMFactExtractor",
    "LLMSummarizer",
    "LedgerConfig",
    "MaskObservations",
    "Message",
    "MissingDependencyError",
    "ModelCost",
    "ModelInfo",
    "OfflineSummarizer",
    "OpenAICompatible",
    "Policy",
    "Price",
    "ProviderError",
    "ProviderTimeout",
    "QueryAwareSummarizer",
    "RawPart",
    "Registry",
    "RetryPolicy",
    "RuleBasedFactExtractor",
    "RuntimeFailure",
    "Session",
    "SessionCost",
    "SessionStore",
    "StoreError",
    "Strategy",
    "StrategyContext",
    "StrategyResult",
    "SummarizationError",
    "Summarizer",
    "SummaryResult",
    "SummaryState",
    "SummaryTrigger",
    "TextPart",
    "TokenCount",
    "TokenCounter",
    "ToolCall",
    "Transcript",
    "TruncateToolResults",
    "UnknownModelError",
    "Usage",
    "UsageError",
    "VersionConflict",
    "WindowConfig",
    "__version__",
    "build_context",
    "complete_sync",
    "count_tokens",
    "detect_kind",
    "estimate_cost",
    "extract_entities",
    "get_model",
    "group_blocks",
    "load_example",
    "load_registry",
    "messages_from_anthropic",
    "messages_from_openai",
    "messages_to_anthropic",
    "messages_to_openai",
    "open_store",
    "pairing_problems",
    "parse_spec",
    "parse_transcript",
    "read_transcript",
    "summary_view",
    "validate_pairing",
]

_LAZY = {"AnthropicModel", "OpenAICompatible"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(".llm", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
