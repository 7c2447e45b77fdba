"""Plain text and articles: head and tail, or the lead; and the bounded searches they share.

Every cut here searches for the longest piece that fits a token target. Counting is
the expensive part (a tokenizer pass over the candidate), so no candidate is ever much
longer than the target can hold: a search starts from ``target × CHARS_PER_TOKEN``
characters and grows geometrically only while candidates still fit. The cost is then
proportional to the target, not to the input; a 5 MB result is sliced, never encoded
whole here (its one full count is the caller's, and is passed in as ``total``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = [
    "CHARS_PER_TOKEN",
    "Count",
    "cut_prose",
    "estimate_tokens",
    "fit_prefix",
    "fmt",
    "may_fit",
    "truncate_article",
    "truncate_text",
]

Count = Callable[[str], int]

#: A generous characters-per-token guess (English averages about 4): where searches
#: start. It bounds no result, only where the search looks first.
CHARS_PER_TOKEN = 8
#: Texts longer than this many characters per target token are taken not to fit without
#: being counted. Only pathological text (long runs of one space or symbol) packs more
#: into a token; for it a cut is merely shorter than it could be, never over the target.
MAX_CHARS_PER_TOKEN = 64


def fmt(n: int) -> str:
    return f"{n:,}"


def may_fit(text: str, target_tokens: int) -> bool:
    """False when ``text`` is too long to be worth counting against ``target_tokens``."""
    return len(text) <= max(target_tokens, 1) * MAX_CHARS_PER_TOKEN


_SAMPLE = 32_768


def estimate_tokens(text: str, count: Count) -> int:
    """``count(text)``, or for a text over 64k characters an estimate from its first and
    last 32k (a bounded cost; used only where a cut's marker needs a size)."""
    if len(text) <= 2 * _SAMPLE:
        return count(text)
    sampled = count(text[:_SAMPLE]) + count(text[-_SAMPLE:])
    return max(int(sampled * len(text) / (2 * _SAMPLE)), 1)


def _fits(text: str, target_tokens: int, count: Count) -> bool:
    return may_fit(text, target_tokens) and count(text) <= target_tokens


def _largest(n: int, ok: Callable[[int], bool], start: int) -> int:
    """The largest ``k`` in ``[0, n]`` with ``ok(k)`` (``ok`` monotone, ``ok(0)`` assumed):
    gallop up from ``start`` while it holds, then bisect."""
    lo, hi = 0, min(max(start, 1), n)
    while ok(hi):
        lo = hi
        if hi == n:
            return n
        hi = min(hi * 2, n)
    hi -= 1  # ok(hi) failed
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit_prefix(text: str, target_tokens: int, count: Count) -> int:
    """How many characters of ``text`` fit ``target_tokens`` (bounded by the target)."""
    return _largest(
        len(text),
        lambda k: _fits(text[:k], target_tokens, count),
        target_tokens * CHARS_PER_TOKEN,
    )


def truncate_text(text: str, *, target_tokens: int, count: Count, total: int | None = None) -> str:
    """Head and tail of ``text`` with a marker in the middle, about ``target_tokens`` long.

    The head gets 60% of the kept characters (it usually says what the output is), the
    tail 40% (it usually says how it ended). Cuts snap to line ends when one is near.
    A target smaller than the marker itself leaves ``text`` as it is (irreducible).
    ``total`` is ``count(text)`` when the caller knows it. The marker's cut size is the
    total less the kept parts' tokens (not a count of the cut middle).
    """
    total = estimate_tokens(text, count) if total is None else total
    if total <= target_tokens:
        return text
    lines_total = text.count("\n")

    def build(chars: int) -> str:
        head_n = chars * 3 // 5
        tail_n = chars - head_n
        head, tail = text[:head_n], text[len(text) - tail_n :] if tail_n else ""
        nl = head.rfind("\n")
        if nl >= head_n // 2:
            head = head[: nl + 1]
        nl = tail.find("\n")
        if 0 <= nl <= tail_n // 2:
            tail = tail[nl + 1 :]
        lines = lines_total - head.count("\n") - tail.count("\n")
        extra = f", {fmt(lines)} lines" if lines > 1 else ""
        kept = (count(head) if head else 0) + (count(tail) if tail else 0)
        cut = max(total - kept, 1)
        marker = f"\n[... cut {fmt(cut)} of {fmt(total)} tokens{extra} ...]\n"
        return head + marker + tail

    if len(text) < 2:
        return text
    limit = len(text) - 1  # at least one character is cut
    chars = _largest(
        limit, lambda k: _fits(build(k), target_tokens, count), target_tokens * CHARS_PER_TOKEN
    )
    best = build(chars)
    # a target smaller than the marker itself: never return more than we were given
    return best if may_fit(best, total) and count(best) < total else text


def cut_prose(text: str, *, target_tokens: int, count: Count) -> str:
    """The longest prefix of ``text`` ending at a sentence (else a word) within the target."""
    best = fit_prefix(text, target_tokens, count)
    prefix = text[:best]
    ends = [m.end() for m in re.finditer(r"[.!?。](\s|$)", prefix)]
    if ends and ends[-1] >= best // 2:
        return prefix[: ends[-1]].rstrip()
    space = prefix.rfind(" ")
    return prefix[:space] if space >= best // 2 else prefix


_PARAGRAPH = re.compile(r"(\n\s*\n)")


def truncate_article(
    text: str, *, target_tokens: int, count: Count, total: int | None = None
) -> str:
    """The lead paragraphs of an article that fit the target, then a marker with the cut size.

    Journalistic and documentation text front-loads what matters, so the lead is kept
    whole rather than sampling from everywhere. Only the paragraphs that can fit are
    looked at.
    """
    total = estimate_tokens(text, count) if total is None else total
    if total <= target_tokens:
        return text
    budget = max(target_tokens - 16, 1)  # room for the marker
    window = text[: budget * MAX_CHARS_PER_TOKEN + 2]  # nothing past this can fit
    paragraphs = _PARAGRAPH.split(window)
    kept = ""
    for i in range(0, len(paragraphs), 2):
        if i + 1 >= len(paragraphs) and len(window) < len(text):
            break  # the last piece of the window may be a paragraph cut by it
        candidate = kept + (paragraphs[i - 1] if i else "") + paragraphs[i]
        if not _fits(candidate, budget, count):
            break
        kept = candidate
    if not kept.strip():
        kept = cut_prose(text.lstrip()[: len(window)], target_tokens=budget, count=count)
    cut = max(total - count(kept), 0)
    return f"{kept.rstrip()}\n\n[... cut {fmt(cut)} of {fmt(total)} tokens ...]"
