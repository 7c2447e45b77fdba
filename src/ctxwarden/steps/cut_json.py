"""JSON results: pruned until they fit, and always still valid JSON.

Arrays keep their first items plus a marker element, long strings are shortened, deep
containers summarised, and ``keep_fields`` survive everywhere (even in the items that
were cut). The document is parsed once (:func:`~ctxwarden.kinds.load_json`: a
linear depth scan first, so a document nested 10,000 deep is cut as text instead of
raising ``RecursionError``); the walks below recurse at most
:data:`~ctxwarden.kinds.MAX_JSON_DEPTH` deep. Renders of the gentle levels are
counted only when short enough to fit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ctxwarden.kinds import load_json
from ctxwarden.steps.cut_text import Count, estimate_tokens, fmt, may_fit, truncate_text

__all__ = ["JSON_LEVELS", "prune", "truncate_json"]

#: Ever harder (max items per array/object, max string chars, max depth), tried in turn.
JSON_LEVELS: tuple[tuple[int, int, int], ...] = (
    (50, 2000, 16),
    (20, 500, 10),
    (10, 200, 8),
    (5, 120, 6),
    (4, 100, 5),
    (3, 80, 5),
    (2, 50, 4),
    (1, 30, 3),
    (1, 16, 2),
    (0, 8, 1),
)
_CUT_KEY = "…"


def _project(value: Any, keep: frozenset[str]) -> Any:
    """Only the parts of ``value`` under a kept key (``None`` when there are none)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in keep:
                out[k] = v
            else:
                sub = _project(v, keep)
                if sub is not None:
                    out[k] = sub
        return out or None
    if isinstance(value, list):
        items = [p for p in (_project(v, keep) for v in value) if p is not None]
        return items or None
    return None


def prune(value: Any, level: tuple[int, int, int], keep: frozenset[str], depth: int = 0) -> Any:
    max_items, max_chars, max_depth = level
    if isinstance(value, str):
        cut = len(value) - max_chars
        if cut > 24:  # the marker must save more than it costs
            return f"{value[:max_chars]}…[{fmt(cut)} chars cut]"
        return value
    if not isinstance(value, (dict, list)) or not value:
        return value
    if depth >= max_depth:
        kept = _project(value, keep)
        if kept is not None:
            return kept
        if isinstance(value, dict):
            return f"{{… {fmt(len(value))} key{'s' * (len(value) > 1)} cut}}"
        return f"[… {fmt(len(value))} item{'s' * (len(value) > 1)} cut]"
    if isinstance(value, list):
        head = [prune(v, level, keep, depth + 1) for v in value[:max_items]]
        rest = value[max_items:]
        if len(rest) <= 1 and max_items:
            return head + [prune(v, level, keep, depth + 1) for v in rest]
        projected = [p for p in (_project(v, keep) for v in rest) if p is not None] if keep else []
        cut = len(rest) - len(projected)
        tail = [f"[… {fmt(cut)} more item{'s' * (cut > 1)} cut]"] if cut else []
        return head + projected + tail
    out: dict[str, Any] = {}
    cut_keys = 0
    for i, (k, v) in enumerate(value.items()):
        if k in keep:
            out[k] = v
        elif i < max(max_items, 1) or len(value) <= max_items + 1:
            out[k] = prune(v, level, keep, depth + 1)
        else:
            sub = _project(v, keep) if keep else None
            if sub is None:
                cut_keys += 1
            else:
                out[k] = sub
    if cut_keys:
        out[_CUT_KEY if _CUT_KEY not in out else _CUT_KEY * 2] = (
            f"{fmt(cut_keys)} more key{'s' * (cut_keys > 1)} cut"
        )
    return out


def truncate_json(
    text: str,
    *,
    target_tokens: int,
    count: Count,
    keep_fields: Sequence[str] = (),
    total: int | None = None,
) -> str:
    """Prune a JSON document until it fits the target; the output is always valid JSON.

    Arrays keep their first items and end with a string element saying how many were
    cut; objects keep their first keys plus a ``"…"`` key saying how many were cut; long
    strings end with ``…[N chars cut]``; containers past the depth limit become a short
    string. Values under ``keep_fields`` keys are kept whole everywhere, even inside
    items that are otherwise cut. Harder levels are tried (binary search) until the
    output fits; when none does, the smallest is returned, and never one larger than the
    input. Text that is not JSON (or nests deeper than ``MAX_JSON_DEPTH``) is truncated
    as text. ``total`` is ``count(text)`` when the caller knows it.
    """
    total = estimate_tokens(text, count) if total is None else total
    if total <= target_tokens:
        return text
    ok, doc = load_json(text)
    if not ok:
        return truncate_text(text, target_tokens=target_tokens, count=count, total=total)
    keep = frozenset(keep_fields)
    pretty = "\n" in text.strip()

    def render(level: int) -> str:
        pruned = prune(doc, JSON_LEVELS[level], keep)
        return json.dumps(pruned, ensure_ascii=False, indent=1 if pretty else None)

    # The gentlest level that fits, walked to from a level guessed by size: big documents
    # land on the hard levels, whose renders are cheap, instead of a binary search's
    # renders of the gentle ones (the same answer: sizes only shrink level by level).
    last = len(JSON_LEVELS) - 1
    level = 1 if total <= 2 * target_tokens else 4

    def fitting_render(candidate: str) -> bool:
        return may_fit(candidate, target_tokens) and count(candidate) <= target_tokens

    fits = {level: fitting_render(candidate := render(level))}
    found = {level: candidate}
    step = -1 if fits[level] else 1
    while 0 <= level + step <= last and fits[level] == (step == -1):
        level += step
        found[level] = render(level)
        fits[level] = fitting_render(found[level])
    fitting = [lv for lv, ok in fits.items() if ok]
    best = found[min(fitting)] if fitting else found.get(last) or render(last)
    return best if may_fit(best, total) and count(best) < total else text
