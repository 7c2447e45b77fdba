"""Unified diffs: every file and hunk header, the changed lines, context last.

A diff is read for *what changed where*: which files (``diff --git``, ``---``/``+++``,
renames, new and deleted files), which hunks (``@@ -12,6 +12,7 @@ def main():``) and the
added and removed lines. Context lines are cut first (those next to a change last),
then the changed lines of the later hunks; headers go only when nothing else is left.
Each cut run says what it hid: ``[... 40 lines cut: +12 -3 ...]``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ctxwarden.cutters.lines import prefix_counts, select_lines, shorten_line
from ctxwarden.cutters.log import term_hits
from ctxwarden.cutters.text import Count, fmt

__all__ = ["truncate_diff"]

_FILE_HEADER = re.compile(
    r"^(?:diff (?:--git|--cc|--combined|-\S)|--- |\+\+\+ |Index: |new file mode|deleted file mode"
    r"|rename (?:from|to) |similarity index|Binary files |Only in )"
)
_HUNK_HEADER = re.compile(r"^@@")
_INDEX = re.compile(r"^(?:index [0-9a-f]+\.\.[0-9a-f]+|old mode|new mode|=+$)")


def truncate_diff(
    text: str, *, target_tokens: int, count: Count, terms: Sequence[str] = ()
) -> str | None:
    """The headers and changes of a diff within the target, with counted markers;
    ``None`` when not even one line fits (the caller cuts as text)."""
    lines = [shorten_line(line) for line in text.split("\n")]
    n = len(lines)
    added = bytearray(n)
    removed = bytearray(n)
    changed = bytearray(n)
    header = bytearray(n)
    for i, line in enumerate(lines):
        if _FILE_HEADER.match(line) or _HUNK_HEADER.match(line):
            header[i] = 1
        elif line.startswith("+"):
            added[i] = changed[i] = 1
        elif line.startswith("-"):
            removed[i] = changed[i] = 1
    strength = term_hits(text, text.split("\n"), terms)
    tiers = []
    for i, line in enumerate(lines):
        if header[i]:
            tier = 0 if _FILE_HEADER.match(line) else 1
        elif changed[i]:
            tier = 2
        elif (i > 0 and changed[i - 1]) or (i + 1 < n and changed[i + 1]) or strength[i] == 2:
            tier = 3
        elif _INDEX.match(line):
            tier = 4
        elif not line.strip():
            tier = 6
        else:
            tier = 5
        tiers.append(tier)
    plus = prefix_counts(added)
    minus = prefix_counts(removed)

    def marker(start: int, end: int) -> str:
        cut = end - start
        notes = []
        if plus[end] - plus[start]:
            notes.append(f"+{fmt(plus[end] - plus[start])}")
        if minus[end] - minus[start]:
            notes.append(f"-{fmt(minus[end] - minus[start])}")
        tail = f": {' '.join(notes)}" if notes else ""
        return f"[... {fmt(cut)} line{'s' * (cut > 1)} cut{tail} ...]"

    return select_lines(lines, tiers, target_tokens=target_tokens, count=count, marker=marker)
