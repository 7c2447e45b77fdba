"""Prefix stability: how much of each call's context a provider cache can reuse (R10).

A 50-call synthetic agent session (masking on, default :class:`~ctxwarden.Policy`) is
built call by call with ``previous=``. For each call: the share of input tokens that
repeat the previous call's prefix byte for byte, from the audit and, as a cross-check,
from the ``to_openai()`` JSON of the two calls (whole messages compared, then counted). A
call *cache-hits* when the shared prefix covers its whole stable prefix
(``prefix_shared_tokens >= cacheable_prefix_tokens``); the context-engine issue's target
is >= 80 % of calls after the first. Printed by :mod:`ctxwarden_bench.engine_speed`.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.pipeline.engine import BuiltContext, build_context
from ctxwarden.pipeline.policy import Policy
from ctxwarden_bench.traffic import session_calls

__all__ = ["prefix_stability"]

MODEL = "gpt-4o"


def _json_shared_tokens(before: BuiltContext | None, after: BuiltContext) -> tuple[int, int]:
    """Tokens and characters of ``after`` that repeat ``before`` from the start, from JSON.

    Whole messages are compared as serialised OpenAI dicts (a provider caches a prefix
    of tokens, and a message that differs anywhere changes the tokens from there on);
    characters are the common prefix of the two requests' JSON, for the record.
    """
    if before is None:
        return 0, 0
    count = TokenCounter.for_model(MODEL).count_message
    old = [json.dumps(m, sort_keys=True) for m in before.to_openai()]
    new = [json.dumps(m, sort_keys=True) for m in after.to_openai()]
    tokens = 0
    for a, b, message in zip(old, new, after.messages, strict=False):
        if a != b:
            break
        tokens += count(message)
    old_text, new_text = json.dumps(before.to_openai()), json.dumps(after.to_openai())
    chars = next(
        (i for i, (x, y) in enumerate(zip(old_text, new_text, strict=False)) if x != y),
        min(len(old_text), len(new_text)),
    )
    return tokens, chars


def prefix_stability(calls: int = 50, budget: int = 4_000, seed: int = 1) -> dict[str, Any]:
    """Build every model call of a ``calls``-call session with ``previous``; per-call shares."""
    rows: list[dict[str, Any]] = []
    previous: BuiltContext | None = None
    for n, history in enumerate(session_calls(seed, calls), 1):
        built = build_context(list(history), MODEL, budget, policy=Policy(), previous=previous)
        audit = built.audit
        json_tokens, json_chars = _json_shared_tokens(previous, built)
        rows.append(
            {
                "call": n,
                "history_messages": len(history),
                "input_tokens": audit.input_tokens,
                "cacheable_prefix_tokens": audit.cacheable_prefix_tokens,
                "prefix_shared_tokens": audit.prefix_shared_tokens,
                "json_shared_tokens": json_tokens,
                "json_shared_chars": json_chars,
                "share": audit.prefix_shared_tokens / audit.input_tokens,
                "cache_hit": previous is not None
                and audit.prefix_shared_tokens >= audit.cacheable_prefix_tokens,
                "masked": len(audit.by_action("masked")),
                "dropped": len(audit.by_action("dropped")),
            }
        )
        previous = built
    later = rows[1:]
    return {
        "calls": rows,
        "budget": budget,
        "mean_share": statistics.fmean(r["share"] for r in later),
        "median_share": statistics.median(r["share"] for r in later),
        "hit_rate": sum(r["cache_hit"] for r in later) / len(later),
        "audit_matches_json": all(
            r["prefix_shared_tokens"] == r["json_shared_tokens"] for r in rows
        ),
        "within_budget": all(r["input_tokens"] <= budget for r in rows),
    }
