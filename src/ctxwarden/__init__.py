"""ctxwarden: keeps a long-running LLM agent's context window small, cheap and faithful.

The public API is re-exported here. Provider clients (``OpenAICompatible``,
``AnthropicModel``) load lazily, so importing ctxwarden never imports an SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ctxwarden._version import __version__
from ctxwarden.core.errors import (
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
    UnknownHandleError,
    UnknownModelError,
    UsageError,
    VersionConflict,
)
from ctxwarden.core.messages import ImagePart, Message, RawPart, TextPart, ToolCall, detect_kind
from ctxwarden.core.pairing import Block, group_blocks, pairing_problems, validate_pairing
from ctxwarden.core.registry.catalog import ModelInfo, Price, Registry, get_model, load_registry
from ctxwarden.core.registry.cost import ModelCost, SessionCost, estimate_cost
from ctxwarden.core.registry.usage import Usage
from ctxwarden.core.tokens.counter import TokenCount, TokenCounter
from ctxwarden.formats import (
    messages_from_anthropic,
    messages_from_gemini,
    messages_from_openai,
    messages_from_responses,
    messages_to_anthropic,
    messages_to_gemini,
    messages_to_openai,
    messages_to_responses,
)
from ctxwarden.formats.count import count_tokens
from ctxwarden.formats.transcript import Transcript, load_example, parse_transcript, read_transcript
from ctxwarden.llm import ChatModel, Completion, RetryPolicy, complete_sync, parse_spec
from ctxwarden.llm.offline import OfflineSummarizer, RuleBasedFactExtractor
from ctxwarden.llm.summarizers import LLMFactExtractor, LLMSummarizer
from ctxwarden.memory.entities import Entity, extract_entities
from ctxwarden.memory.entity_ledger import EntityLedger
from ctxwarden.memory.facts import Facts
from ctxwarden.memory.layer_state import LayerState
from ctxwarden.memory.summaries import (
    QueryAwareSummarizer,
    Summarizer,
    SummaryResult,
    SummaryState,
    SummaryTrigger,
    summary_view,
)
from ctxwarden.pipeline.audit import Audit
from ctxwarden.pipeline.engine import BuiltContext, build_context
from ctxwarden.pipeline.policy import LedgerConfig, Policy, WindowConfig
from ctxwarden.pipeline.summarize import summarize_history, summarize_history_sync
from ctxwarden.session.recall import Recalled, recall, recall_tool
from ctxwarden.session.session import Session
from ctxwarden.steps.base import (
    Action,
    Draft,
    Step,
    StepContext,
    StepResult,
    Strategy,
    StrategyContext,
    StrategyResult,
)
from ctxwarden.steps.edit import EditStep
from ctxwarden.steps.mask import MaskObservations
from ctxwarden.steps.recall_relevant import RecallRelevant
from ctxwarden.steps.state import BuildState, SummaryDue
from ctxwarden.steps.truncate import TruncateToolResults
from ctxwarden.store import SessionStore, open_store

if TYPE_CHECKING:
    from ctxwarden.llm import AnthropicModel, OpenAICompatible

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
    "Draft",
    "EditStep",
    "Entity",
    "EntityLedger",
    "Facts",
    "ImagePart",
    "InvalidMessageError",
    "LLMFactExtractor",
    "LLMSummarizer",
    "LayerState",
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
    "RecallRelevant",
    "Recalled",
    "Registry",
    "RetryPolicy",
    "RuleBasedFactExtractor",
    "RuntimeFailure",
    "Session",
    "SessionCost",
    "SessionStore",
    "Step",
    "StepContext",
    "StepResult",
    "StoreError",
    "Strategy",
    "StrategyContext",
    "StrategyResult",
    "SummarizationError",
    "Summarizer",
    "SummaryDue",
    "SummaryResult",
    "SummaryState",
    "SummaryTrigger",
    "TextPart",
    "TokenCount",
    "TokenCounter",
    "ToolCall",
    "Transcript",
    "TruncateToolResults",
    "UnknownHandleError",
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
    "messages_from_gemini",
    "messages_from_openai",
    "messages_from_responses",
    "messages_to_anthropic",
    "messages_to_gemini",
    "messages_to_openai",
    "messages_to_responses",
    "open_store",
    "pairing_problems",
    "parse_spec",
    "parse_transcript",
    "read_transcript",
    "recall",
    "recall_tool",
    "summarize_history",
    "summarize_history_sync",
    "summary_view",
    "validate_pairing",
]

_LAZY = {"AnthropicModel", "OpenAICompatible"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(".llm", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
