"""Keep the most important lines of a line-oriented result within a token target.

Code listings, command output, logs and diffs are all cut the same way: each kind ranks
its lines (a *tier* per line, 0 first), and :func:`select_lines` keeps whole lines in
that order while they fit, then prints them in their original order with one marker per
run of cut lines (the marker is the kind's: "lines 45-120", "3 warnings", "2 hunks").
Only the lines considered are counted, one by one, so the cost follows the target, not
the input; the result is counted once at the end and the budget tightened if the
markers took more than estimated.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate

from ctxwarden.cutters.text import Count, fmt, may_fit

__all__ = [
    "NOT_EXAMINED_PREFIX",
    "Marker",
    "cut_lines_marker",
    "line_starts",
    "matching_lines",
    "prefix_counts",
    "select_lines",
    "shorten_line",
]

#: How the marker of a result's unexamined middle starts (see by_kind.examined_part):
#: a line that starts so is kept first, so the cut says how much was never looked at.
NOT_EXAMINED_PREFIX = "[... not examined: "

#: Makes the marker for the cut lines ``lines[start:end]``.
Marker = Callable[[int, int], str]

_MARKER_TOKENS = 12  # what one marker line is assumed to cost while selecting
_MAX_MISSES = 64  # lines in a row that did not fit: stop looking
_LINE_CHARS = 400  # longer lines are shortened before they are considered


def shorten_line(line: str, limit: int = _LINE_CHARS) -> str:
    """``line``, or its start and a note of how many characters were cut."""
    if len(line) <= limit:
        return line
    keep = limit * 3 // 4
    return f"{line[:keep]}…[{fmt(len(line) - keep)} chars cut]"


def cut_lines_marker(start: int, end: int) -> str:
    """The plain marker: how many lines were cut."""
    n = end - start
    return f"[... {fmt(n)} line{'s' * (n > 1)} cut ...]"


def line_starts(lines: Sequence[str]) -> list[int]:
    """Where each of ``lines`` (``text.split("\\n")``) starts in the text."""
    return [0, *accumulate(len(line) + 1 for line in lines[:-1])]


def matching_lines(
    pattern: re.Pattern[str], text: str, starts: Sequence[int]
) -> Iterator[tuple[int, re.Match[str]]]:
    """``(line index, match)`` for every match of ``pattern`` in ``text``: one regex pass
    over the whole text (C speed) instead of one search per line."""
    for match in pattern.finditer(text):
        yield bisect_right(starts, match.start()) - 1, match


def prefix_counts(flags: bytearray) -> list[int]:
    """``out[k]`` = how many of ``flags[:k]`` are set: a marker counts a run in O(1)."""
    out = [0] * (len(flags) + 1)
    total = 0
    for i, flag in enumerate(flags):
        total += flag
        out[i + 1] = total
    return out


def _render(lines: Sequence[str], kept: bytearray, marker: Marker) -> str:
    out: list[str] = []
    gap = -1
    for i, line in enumerate(lines):
        if kept[i]:
            if gap >= 0:
                out.append(marker(gap, i))
                gap = -1
            out.append(line)
        elif gap < 0:
            gap = i
    if gap >= 0:
        out.append(marker(gap, len(lines)))
    return "\n".join(out)


def _choose(
    lines: Sequence[str], order: Sequence[int], budget: int, cost: Callable[[int], int]
) -> bytearray:
    """Greedy: lines in ``order`` while their tokens (and the markers they add) fit."""
    n = len(lines)
    kept = bytearray(n)
    used = _MARKER_TOKENS  # the whole result starts as one cut run
    misses = 0
    for i in order:
        left = i > 0 and not kept[i - 1]
        right = i < n - 1 and not kept[i + 1]
        # markers: a line with cut lines on both sides splits their run (+1), one with
        # none (kept lines or the ends) was a run by itself (-1), else the run shrinks
        delta = _MARKER_TOKENS * (int(left and right) - int(not left and not right))
        extra = cost(i) + delta
        if used + extra <= budget:
            kept[i] = 1
            used += extra
            misses = 0
        else:
            misses += 1
            if misses >= _MAX_MISSES or budget - used < 2:
                break
    return kept


def select_lines(
    lines: Sequence[str],
    tiers: Sequence[int],
    *,
    target_tokens: int,
    count: Count,
    marker: Marker = cut_lines_marker,
    order: Sequence[int] | None = None,
) -> str | None:
    """The lines of lowest tier that fit ``target_tokens``, in their order, with a
    ``marker`` for each run of cut lines; ``None`` when not even one line fits.

    ``order`` overrides the default priority (tier, then position).
    """
    if order is None:
        firsts = [i for i, line in enumerate(lines) if line.startswith(NOT_EXAMINED_PREFIX)]
        rest = sorted(range(len(lines)), key=lambda i: (tiers[i], i))
        skip = set(firsts)
        order = firsts + [i for i in rest if i not in skip] if firsts else rest
    costs: dict[int, int] = {}

    def cost(i: int) -> int:
        found = costs.get(i)
        if found is None:
            line = lines[i]
            found = count(line) + 1 if may_fit(line, target_tokens) else target_tokens + 1
            costs[i] = found
        return found

    budget = target_tokens
    for _ in range(6):
        kept = _choose(lines, order, budget, cost)
        if not any(kept):
            return None
        text = _render(lines, kept, marker)
        tokens = count(text) if may_fit(text, target_tokens) else target_tokens * 2
        if tokens <= target_tokens:
            return text
        budget -= tokens - target_tokens + 2
        if budget <= 0:
            return None
    return None
