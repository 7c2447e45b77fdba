"""Token counting (R2): exact offline counts for OpenAI models, labelled estimates else."""

from ctxwarden.core.tokens.counter import TokenCount, TokenCounter

__all__ = ["TokenCount", "TokenCounter"]
