"""One entry point that cuts a text by its kind, within a hard cap on what is examined.

:func:`truncate_by_kind` sends a result to the cut for its kind (see
:mod:`~ctxwarden.core.kinds`) and falls back to head-and-tail text when a line-based
cut cannot place a single line. Before that, a result longer than ``max_chars`` is
reduced to its first and last parts (at line ends) with a marker saying how much was
not examined: every later pass is then bounded by the cap whatever the input's size,
while the marker sizes still refer to the whole result (``total``). JSON is parsed
whole up to :data:`JSON_CAP_FACTOR` times the cap, since its parser is C code and a
document cut in two is no longer JSON.
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxwarden.steps.cut_code import truncate_code
from ctxwarden.steps.cut_diff import truncate_diff
from ctxwarden.steps.cut_html import truncate_html
from ctxwarden.steps.cut_json import truncate_json
from ctxwarden.steps.cut_lines import NOT_EXAMINED_PREFIX
from ctxwarden.steps.cut_log import truncate_log
from ctxwarden.steps.cut_text import (
    Count,
    estimate_tokens,
    fmt,
    truncate_article,
    truncate_text,
)
from ctxwarden.steps.cut_trace import DEFAULT_LIBRARY_PATTERNS, truncate_stack_trace

__all__ = ["JSON_CAP_FACTOR", "MAX_CHARS", "examined_part", "truncate_by_kind"]

#: Default cap on the characters of one result that truncation examines (500,000
#: characters are about 125,000 tokens: hundreds of times any sensible target).
MAX_CHARS = 500_000
JSON_CAP_FACTOR = 16


def examined_part(text: str, max_chars: int) -> str:
    """``text``, or when longer than ``max_chars`` its first 60% and last 40% of that
    (snapped to line ends) around a marker saying what was not examined."""
    if len(text) <= max_chars:
        return text
    head_n = max_chars * 3 // 5
    tail_n = max_chars - head_n
    head_end = text.rfind("\n", head_n // 2, head_n)
    head_end = head_n if head_end < 0 else head_end + 1
    tail_start = text.find("\n", len(text) - tail_n, len(text) - tail_n // 2)
    tail_start = len(text) - tail_n if tail_start < 0 else tail_start + 1
    chars = tail_start - head_end
    lines = text.count("\n", head_end, tail_start)
    marker = f"{NOT_EXAMINED_PREFIX}{fmt(chars)} characters, {fmt(lines)} lines ...]"
    sep = "" if text[head_end - 1 : head_end] == "\n" else "\n"
    return f"{text[:head_end]}{sep}{marker}\n{text[tail_start:]}"


def truncate_by_kind(
    text: str,
    kind: str | None,
    *,
    target_tokens: int,
    count: Count,
    library_patterns: Sequence[str] = DEFAULT_LIBRARY_PATTERNS,
    keep_fields: Sequence[str] = (),
    terms: Sequence[str] = (),
    total: int | None = None,
    max_chars: int = MAX_CHARS,
    fields: Sequence[str] = (),
) -> str:
    """Truncate ``text`` with the method for its ``kind`` (``None`` or unknown: plain text).

    ``terms`` are what the agent was looking for (code, logs and diffs keep the lines
    with them, JSON the list items that hold them; ``fields`` are key names JSON keeps);
    ``total`` is ``count(text)`` when the caller knows it (a huge text is
    then never counted whole); ``max_chars`` caps what is examined.
    """
    if kind == "json" and len(text) <= max_chars * JSON_CAP_FACTOR:  # parsed whole
        return truncate_json(
            text,
            target_tokens=target_tokens,
            count=count,
            keep_fields=keep_fields,
            total=total,
            terms=terms,
            fields=fields,
        )
    total = estimate_tokens(text, count) if total is None else total
    if total <= target_tokens:
        return text
    part = examined_part(text, max_chars)
    cut: str | None = None
    if kind == "stack_trace":
        cut = truncate_stack_trace(
            part,
            target_tokens=target_tokens,
            count=count,
            library_patterns=library_patterns,
            total=total,
        )
    elif kind == "article":
        cut = truncate_article(part, target_tokens=target_tokens, count=count, total=total)
    elif kind == "html":
        cut = truncate_html(part, target_tokens=target_tokens, count=count, total=total)
    elif kind == "code":
        cut = truncate_code(part, target_tokens=target_tokens, count=count, terms=terms)
    elif kind == "diff":
        cut = truncate_diff(part, target_tokens=target_tokens, count=count, terms=terms)
    elif kind == "log":
        cut = truncate_log(part, target_tokens=target_tokens, count=count, terms=terms)
    if cut is None:
        cut = truncate_text(part, target_tokens=target_tokens, count=count, total=total)
    return cut
