"""The spans' attributes, read off what a build or a summary cycle returned (called only
for a span that records)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxwarden.core.registry.usage import Usage
    from ctxwarden.pipeline.audit import Audit
    from ctxwarden.pipeline.built import BuiltContext
    from ctxwarden.pipeline.summarize import LayerUpdate
    from ctxwarden.session.cycle import SummaryWrite
    from ctxwarden.session.pending_log import PendingLog

__all__ = ["build_attributes", "built_attributes", "layer_update_attributes",
           "pending_attributes", "summary_write_attributes"]  # fmt: skip

_ACTION_KINDS = ("dropped", "evicted", "masked", "truncated", "summarized", "rejected", "recalled")


def build_attributes(audit: Audit) -> dict[str, Any]:
    """The ``ctxwarden.build`` span's attributes, off the build's audit. The counts per
    action kind are the audit's actions of that kind: one per message, but one per fold
    for ``summarized`` (``ctxwarden.build.summarized_tokens`` says how much it folded)."""
    counts = dict.fromkeys(_ACTION_KINDS, 0)
    summarized_tokens = 0
    for action in audit.actions:
        counts[action.action] = counts.get(action.action, 0) + 1
        if action.action == "summarized":
            summarized_tokens += action.tokens_saved
    out: dict[str, Any] = {
        "ctxwarden.build.model": audit.model,
        "ctxwarden.build.budget": audit.budget,
        "ctxwarden.build.input_tokens": audit.input_tokens,
        "ctxwarden.build.exact": audit.exact,
        "ctxwarden.build.budget_ratio": audit.budget_ratio,
        "ctxwarden.build.history_messages": audit.history_messages,
        "ctxwarden.build.kept_messages": audit.kept_messages,
        "ctxwarden.build.tokens_saved": audit.tokens_saved,
        "ctxwarden.build.summarized_tokens": summarized_tokens,
        "ctxwarden.build.prefix_shared_tokens": audit.prefix_shared_tokens,
        "ctxwarden.build.cacheable_prefix_tokens": audit.cacheable_prefix_tokens,
        "ctxwarden.build.warnings": len(audit.warnings),
        "ctxwarden.build.steps": list(audit.steps),
    }
    if audit.fill_ratio is not None:
        out["ctxwarden.build.fill_ratio"] = audit.fill_ratio
    if audit.context_window is not None:
        out["ctxwarden.build.context_window"] = audit.context_window
    for layer, tokens in audit.layers.items():
        out[f"ctxwarden.build.layer.{layer}.tokens"] = tokens
    for kind, n in counts.items():
        out[f"ctxwarden.build.messages.{kind}"] = n
    return out


def built_attributes(built: BuiltContext) -> dict[str, Any]:
    return build_attributes(built.audit)


def pending_attributes(pending: PendingLog) -> dict[str, Any]:
    return build_attributes(pending.built.audit)


def _usage_attributes(usage: Usage) -> dict[str, Any]:
    return {
        "ctxwarden.summarize.calls": usage.calls,
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
    }


def summary_write_attributes(write: SummaryWrite | None) -> dict[str, Any]:
    """A session's cycle: ``unchanged`` (nothing to write), ``folded`` or ``facts``."""
    if write is None:
        return {"ctxwarden.summarize.outcome": "unchanged"}
    return {
        "ctxwarden.summarize.outcome": "folded" if write.folded else "facts",
        "ctxwarden.summarize.folded_messages": write.folded,
        "ctxwarden.summarize.meta": write.meta,
        "ctxwarden.summarize.attempts": write.attempts,
        **({"ctxwarden.summarize.error": write.error} if write.error else {}),
        **_usage_attributes(write.usage),
    }


def layer_update_attributes(update: LayerUpdate) -> dict[str, Any]:
    """:func:`ctxwarden.summarize_history`'s cycle."""
    outcome = "failed" if update.error and not update.folded else (
        "folded" if update.folded else "unchanged")  # fmt: skip
    return {
        "ctxwarden.summarize.outcome": outcome,
        "ctxwarden.summarize.folded_messages": len(update.folded),
        "ctxwarden.summarize.meta": update.meta,
        **({"ctxwarden.summarize.error": update.error} if update.error else {}),
        **_usage_attributes(update.usage),
    }
