"""Code listings: what the agent looked for, the signatures around it, line numbers kept.

An agent reads a file (``cat``, ``sed -n``, ``nl -ba``, an editor tool) to find
something: a function it will edit, the place an error points at. So a listing keeps,
in order: the lines with the ``terms`` of the call that produced it (the names and
paths in its arguments and in the request around it) with a few lines of context, the
signatures (``def``, ``class``, ``fn``, ``func``, decorators, imports) that say where
everything is, then the code nearest to those, blank and comment lines last. Lines are
kept whole, so a numbered listing keeps its numbers; each cut run says which lines it
hid (``[... 76 lines cut: 45-120 ...]``, by the listing's own numbers), so the agent can
ask for exactly those.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ctxwarden.core.kinds import LINE_NUMBER
from ctxwarden.cutters.lines import select_lines, shorten_line
from ctxwarden.cutters.log import term_hits
from ctxwarden.cutters.text import Count, fmt

__all__ = ["SIGNATURE", "truncate_code"]

SIGNATURE = re.compile(
    r"^\s*(?:(?:export\s+|pub(?:\(\w+\))?\s+|public\s+|private\s+|protected\s+|static\s+"
    r"|async\s+|abstract\s+|final\s+|override\s+|default\s+)*"
    r"(?:def|class|function|func|fn|struct|enum|trait|interface|impl|module|type|package"
    r"|namespace)\b|@\w[\w.]*(?:\(|$)|#\[)"
)
_IMPORT = re.compile(r"^\s*(?:import\s|from\s+\S+\s+import\s|#include\b|use\s|using\s|require\()")
_COMMENT = re.compile(r"^\s*(?:#|//|/\*|\*|--)")
_NUMBER = re.compile(r"^\s*(\d+)")
_CONTEXT = 2


def truncate_code(
    text: str, *, target_tokens: int, count: Count, terms: Sequence[str] = ()
) -> str | None:
    """The most telling lines of a code listing within the target, in order, with a
    marker per cut run; ``None`` when not even one line fits (the caller cuts as text)."""
    lines = [shorten_line(line) for line in text.split("\n")]
    n = len(lines)
    bodies = [LINE_NUMBER.sub("", line, count=1) for line in lines]
    numbered = sum(1 for line in lines if LINE_NUMBER.match(line)) >= 0.5 * max(n, 1)
    strength = term_hits("\n".join(bodies), bodies, terms)
    hits = [i for i in range(n) if strength[i] == 2]
    near = [9] * n  # distance to the nearest hit, capped
    for i in hits:
        for j in range(max(i - 8, 0), min(i + 9, n)):
            near[j] = min(near[j], abs(i - j))
    tiers = []
    nonempty = [i for i in range(n) if bodies[i].strip()]
    first, last = (nonempty[0], nonempty[-1]) if nonempty else (0, 0)
    for i, body in enumerate(bodies):
        if not body.strip():
            tier = 8
        elif near[i] == 0 or i in (first, last):
            tier = 0
        elif near[i] <= _CONTEXT:
            tier = 1
        elif SIGNATURE.match(body):
            tier = 2
        elif strength[i] or near[i] <= 2 * _CONTEXT or _IMPORT.match(body):
            tier = 3
        elif near[i] <= 8:
            tier = 4
        elif _COMMENT.match(body):
            tier = 7
        else:
            tier = 5 if i > 0 and SIGNATURE.match(bodies[i - 1]) else 6
        tiers.append(tier)

    def marker(start: int, end: int) -> str:
        cut = end - start
        span = ""
        if numbered:
            a, b = _NUMBER.match(lines[start]), _NUMBER.match(lines[end - 1])
            if a and b:
                span = f": {a.group(1)}-{b.group(1)}" if cut > 1 else f": {a.group(1)}"
        return f"[... {fmt(cut)} line{'s' * (cut > 1)} cut{span} ...]"

    return select_lines(lines, tiers, target_tokens=target_tokens, count=count, marker=marker)
