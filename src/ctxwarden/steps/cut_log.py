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

from ctxwarden.steps.cut_lines import prefix_counts, select_lines, shorten_line
from ctxwarden.steps.cut_text import Count, fmt

__all__ = ["ERROR_LINE", "WARNING_LINE", "term_regex", "truncate_log"]

ERROR_LINE = re.compile(
    r"\b(?:error|errors|fatal|fail|failed|failure|failures|exception|traceback|panic|panicked"
    r"|denied|refused|cannot|can't|unable|not found|no such|segmentation fault|abort(?:ed)?"
    r"|timed? ?out|critical)\b|^E\s{2,}|^\s*FAILED\b|^\s*ERROR\b",
    re.IGNORECASE,
)
WARNING_LINE = re.compile(r"\b(?:warn|warning|warnings|deprecated|deprecation)\b", re.IGNORECASE)
_SUMMARY = re.compile(
    r"^\s*=+ .* =+\s*$|\b\d+ (?:passed|failed|errors?|skipped|tests?)\b|\bexit (?:code|status)"
    r"|returncode|^\s*Ran \d+ tests?|^\s*(?:OK|FAILED)\b|BUILD (?:SUCCESS|FAILED)",
    re.IGNORECASE,
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


def truncate_log(
    text: str, *, target_tokens: int, count: Count, terms: Sequence[str] = ()
) -> str | None:
    """The lines of command output or a log that matter most, within the target, with
    counted markers; ``None`` when not even one line fits (the caller cuts as text)."""
    lines = [shorten_line(line) for line in text.split("\n")]
    n = len(lines)
    nonempty = [i for i in range(n) if lines[i].strip()]
    ends = set(nonempty[:_HEAD]) | set(nonempty[-_TAIL:])
    first, last = (nonempty[0], nonempty[-1]) if nonempty else (0, 0)
    wanted = term_regex(terms)
    is_error = bytearray(n)
    is_warning = bytearray(n)
    tiers = [5] * n
    seen: set[str] = set()
    for i, line in enumerate(lines):
        if not line.strip():
            tiers[i] = 6
            continue
        shape = _NUMBERS.sub("0", line.strip())
        repeat = shape in seen
        seen.add(shape)
        if ERROR_LINE.search(line):
            is_error[i] = 1
        elif WARNING_LINE.search(line):
            is_warning[i] = 1
        if i in (first, last) or (_SUMMARY.search(line) and not repeat):
            tiers[i] = 0
        elif is_error[i] and not repeat:
            tiers[i] = 1
        elif wanted is not None and wanted.search(line):
            tiers[i] = 2 if not repeat else 3
        elif i in ends or (is_warning[i] and not repeat):
            tiers[i] = 3
        elif is_error[i]:
            tiers[i] = 4
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
