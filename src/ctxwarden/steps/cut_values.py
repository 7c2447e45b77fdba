"""The values a truncation cut, listed in the truncated result itself.

A truncated result stays in the window, so the identifiers, dates and amounts in its cut
part would be lost until the result leaves the window and reaches the entity ledger. The
ledger could take them at once, but then the ledger — near the top of the context —
would change every time a long result arrives, and every such call would miss the
provider's prompt cache (R10). So the truncation says what it cut in place, the same way
each time (a pure function of the original and the truncated text)::

    [values in the cut part: ORD-51234, mia@example.com, 2024-05-20, … 12 more]

For JSON the note goes inside the document (a ``"…values cut"`` key of the top object,
or a last string element of the top array), so the result stays valid JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ctxwarden.memory.entities import CATEGORY_TIERS, Entity, extract_entities, parse_json_text
from ctxwarden.memory.entity_ledger import listed
from ctxwarden.messages import Message

__all__ = ["CUT_VALUES_KEY", "with_cut_values"]

CUT_VALUES_KEY = "…values cut"
_PREFIX = "values in the cut part: "


def _lost(original: Message, truncated_text: str) -> list[Entity]:
    """Entities of ``original`` that the truncated text no longer shows, best first."""
    found = [e for e in extract_entities(original) if e.value not in truncated_text]
    order = sorted(range(len(found)), key=lambda i: (-CATEGORY_TIERS.get(found[i].category, 1), i))
    return [found[i] for i in order]


def _note(values: list[str], more: int) -> str:
    shown = ", ".join(listed(v) for v in values)
    return _PREFIX + shown + (f", … {more} more" if more else "")


def _attach(truncated_text: str, note: str, doc: Any = None) -> str:
    """``note`` inside a JSON document (``doc``, the parsed ``truncated_text``) when the
    text is one, else on a line of its own."""
    if isinstance(doc, (dict, list)):
        doc = dict(doc) if isinstance(doc, dict) else list(doc)
        pretty = "\n" in truncated_text.strip()
        if isinstance(doc, dict):
            doc[CUT_VALUES_KEY] = note.removeprefix(_PREFIX)
        else:
            doc.append(f"[{note}]")
        return json.dumps(doc, ensure_ascii=False, indent=1 if pretty else None)
    return f"{truncated_text}\n[{note}]"


def with_cut_values(
    original: Message, truncated_text: str, *, max_tokens: int, count: Callable[[str], int]
) -> tuple[str, int]:
    """``truncated_text`` with the values it lost listed, within ``max_tokens`` more
    tokens; and how many values it lists (0: the text comes back unchanged).

    Identifiers and e-mails come first, plain numbers last (the ledger's tiers); when not
    all fit, the note ends with how many more were cut. How many fit is searched on the
    note alone (a short text); the attached result is counted once to confirm.
    """
    lost = _lost(original, truncated_text)
    if not lost or max_tokens <= 0:
        return truncated_text, 0
    base = count(truncated_text)
    doc = parse_json_text(truncated_text)[1]
    values = [e.value for e in lost]
    slack = 8  # the quotes, key or brackets and newline that attach the note

    def fits(k: int) -> bool:
        return count(_note(values[:k], len(values) - k)) + slack <= max_tokens

    # Guess how many fit from the truncated text's characters per token (the same kind
    # of text), then step to the answer with exact counts: two or three counts instead of
    # a binary search's seven.
    per_token = len(truncated_text) / max(base, 1)
    room = (max_tokens - slack) * per_token
    best, length = 0, len(_PREFIX)
    for k, value in enumerate(values, 1):
        length += len(listed(value)) + (2 if k > 1 else 0)  # ", " between values
        more = len(values) - k
        if length + (len(f", … {more} more") if more else 0) > room:
            break
        best = k
    best = max(best, 1)
    while best > 0 and not fits(best):
        best -= 1 + best // 8
    if best:  # gallop up while the next ones fit, then search the last step
        step = 1
        while best + step <= len(values) and fits(best + step):
            best += step
            step *= 2
        lo, hi = best + 1, min(best + step, len(values) + 1) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            if fits(mid):
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
    while best > 0:
        text = _attach(truncated_text, _note(values[:best], len(values) - best), doc)
        if count(text) - base <= max_tokens:
            return text, best
        best -= 1 + best // 8  # the slack was short (rare): take a few more out
    return truncated_text, 0
