"""Command output and logs: head, tail, errors, warnings, what was searched for, counts.

What an agent needs from ``ls``, ``grep``, ``find``, a test run or a service log is how
it starts (what ran), how it ends (the summary, the exit status), every error line, the
lines with what it was looking for (the ``terms`` of its call), then warnings, then the
rest — first occurrences before repeats (lines equal but for their numbers, like a
progress line printed 10,000 times). Each run of cut lines becomes one marker that
counts what it hid: ``[... 1,204 lines cut: 3 errors, 12 warnings ...]``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ctxwarden.cutters.lines import (
    line_starts,
    matching_lines,
    prefix_counts,
    select_lines,
    shorten_line,
)
from ctxwarden.cutters.text import Count, fmt

__all__ = ["ERROR_LINE", "WARNING_LINE", "flags", "term_hits", "term_regex", "truncate_log"]

#: Error and warning words, matched in the lower-cased text (the lookahead on the first
#: letter keeps the regex engine from trying every word at every position).
ERROR_LINE = re.compile(
    r"(?=[acdefnprstu])\b(?:error|errors|fatal|fail|failed|failure|failures|exception"
    r"|traceback|panic|panicked|denied|refused|cannot|can't|unable|not found|no such"
    r"|segmentation fault|abort|aborted|timeout|timed out|critical)\b"
)
_PYTEST_ERROR = re.compile(r"^E {2,}", re.MULTILINE)  # pytest's failure detail lines
WARNING_LINE = re.compile(r"(?=[wd])\b(?:warn|warning|warnings|deprecated|deprecation)\b")
#: Summary lines (pytest's ``=== 3 failed in 0.8s ===``, exit codes, build results): one
#: regex per form, each starting with a literal or an anchor so the engine scans fast.
_SUMMARIES = tuple(
    re.compile(rx, re.MULTILINE)
    for rx in (
        r"^=+ [^\n]* =+ *$",
        r"(?<=\d )(?=[pfest])(?:passed|failed|errors?|skipped|tests?)\b",
        r"exit (?:code|status)",
        r"returncode",
        r"build (?:success|failed)",
        r"^ *(?:ran \d+ tests?|ok\b|failed\b)",
    )
)
_NUMBERS = re.compile(r"\d+")
_HEAD, _TAIL = 6, 6


def term_regex(terms: Sequence[str]) -> re.Pattern[str] | None:
    """One regex finding any of ``terms`` as a whole token (``None`` for no terms)."""
    words = sorted({t for t in terms if t}, key=len, reverse=True)
    if not words:
        return None
    alternatives = "|".join(re.escape(t) for t in words)
    return re.compile(rf"(?<![\w])(?:{alternatives})(?![\w])")


def term_hits(text: str, lines: Sequence[str], terms: Sequence[str]) -> bytearray:
    """Per line of ``text`` (split into ``lines``): 2 when it holds a term that few lines
    hold (what was searched for), 1 when only terms that are everywhere (a word the whole
    file uses), else 0."""
    hits = bytearray(len(lines))
    wanted = term_regex(terms)
    if wanted is None:
        return hits
    found: dict[int, set[str]] = {}
    for i, match in matching_lines(wanted, text, line_starts(lines)):
        found.setdefault(i, set()).add(match.group(0))
    per_term: dict[str, int] = {}
    for matched in found.values():
        for term in matched:
            per_term[term] = per_term.get(term, 0) + 1
    common = max(6, len(lines) // 20)
    for i, matched in found.items():
        hits[i] = 2 if any(per_term[t] <= common for t in matched) else 1
    return hits


def flags(pattern: re.Pattern[str], text: str, starts: Sequence[int]) -> bytearray:
    """1 for each line (of the lines starting at ``starts``) where ``pattern`` matches."""
    out = bytearray(len(starts))
    for i, _ in matching_lines(pattern, text, starts):
        out[i] = 1
    return out


def truncate_log(
    text: str, *, target_tokens: int, count: Count, terms: Sequence[str] = ()
) -> str | None:
    """The lines of command output or a log that matter most, within the target, with
    counted markers; ``None`` when not even one line fits (the caller cuts as text)."""
    raw = text.split("\n")
    starts = line_starts(raw)
    lower = text.lower()
    is_error = flags(ERROR_LINE, lower, starts)
    for i, _ in matching_lines(_PYTEST_ERROR, text, starts):
        is_error[i] = 1
    is_warning = flags(WARNING_LINE, lower, starts)
    summary = bytearray(len(raw))
    for pattern in _SUMMARIES:
        for i, _ in matching_lines(pattern, lower, starts):
            summary[i] = 1
    shapes = _NUMBERS.sub("", text).split("\n")  # lines equal but for their numbers
    hits = term_hits(text, raw, terms)
    lines = [shorten_line(line) for line in raw]
    n = len(lines)
    nonempty = [i for i in range(n) if lines[i].strip()]
    ends = set(nonempty[:_HEAD]) | set(nonempty[-_TAIL:])
    first, last = (nonempty[0], nonempty[-1]) if nonempty else (0, 0)
    tiers = [5] * n
    seen: set[str] = set()
    for i, line in enumerate(lines):
        if i not in ends and not line.strip():
            tiers[i] = 6
            continue
        if is_error[i]:
            is_warning[i] = 0
        shape = shapes[i]
        repeat = shape in seen
        seen.add(shape)
        if i in (first, last) or (summary[i] and not repeat):
            tiers[i] = 0
        elif is_error[i] and not repeat:
            tiers[i] = 1
        elif hits[i] == 2:
            tiers[i] = 2 if not repeat else 3
        elif i in ends or (is_warning[i] and not repeat):
            tiers[i] = 3
        elif repeat:
            tiers[i] = 5
        else:
            tiers[i] = 4
    errors = prefix_counts(is_error)
    warnings = prefix_counts(is_warning)

    def marker(start: int, end: int) -> str:
        cut = end - start
        notes = [
            f"{fmt(k)} {name}{'s' * (k > 1)}"
            for k, name in (
                (errors[end] - errors[start], "error"),
                (warnings[end] - warnings[start], "warning"),
            )
            if k
        ]
        tail = f": {', '.join(notes)}" if notes else ""
        return f"[... {fmt(cut)} line{'s' * (cut > 1)} cut{tail} ...]"

    return select_lines(lines, tiers, target_tokens=target_tokens, count=count, marker=marker)
