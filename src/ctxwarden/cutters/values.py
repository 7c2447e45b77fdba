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
import re
from collections.abc import Callable
from typing import Any

from ctxwarden.core.caching import memoize
from ctxwarden.core.kinds import load_json
from ctxwarden.core.messages import Message
from ctxwarden.cutters.html_page import html_to_text
from ctxwarden.memory.entities import (
    CATEGORY_TIERS,
    Entity,
    extract_entities,
    extract_from_json,
    extract_from_text,
)
from ctxwarden.memory.entity_ledger import listed

__all__ = ["CUT_VALUES_KEY", "with_cut_values"]

CUT_VALUES_KEY = "…values cut"
_PREFIX = "values in the cut part: "


#: Results longer than this are sampled (their first and last parts) for the values
#: they lost: extraction is regex work per character, and the note lists a few dozen.
SAMPLE_CHARS = 24_000
#: Kinds whose names (paths, dotted names, identifiers) are what the agent reuses.
_NAMED_KINDS = frozenset({"code", "log", "diff", "stack_trace"})
_TOKEN = re.compile(r"[\w./-]+")
_CAMEL = re.compile(r"[a-z][A-Z]")
_DEFINED = re.compile(r"\b(?:def|class|function|func|fn|struct|interface|trait|enum)\s+(\w+)")
_IMPORTED = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", re.MULTILINE)
_OWN = ("self.", "cls.", "this.")
#: A bare markup tag (``<output_head>``, ``</warning>``): the wrapping a harness puts
#: around a tool's output, no name in it (the text extraction skips them the same way).
_TAG = re.compile(r"</?[A-Za-z_][\w-]*>")


def _is_name(token: str) -> bool:
    return (
        len(token) >= 4
        and (any(c in token for c in "/._") or bool(_CAMEL.search(token)))
        and not token.replace(".", "").replace("_", "").isdigit()
    )


@memoize(256)
def _names(text: str, source_id: str) -> tuple[Entity, ...]:
    """Paths, dotted names and identifiers of a code listing, log or diff: the modules it
    imports, then the names it defines, then by how often they occur (first seen breaks
    ties); ``self.x`` counts as ``x``. Memoised: a result is cut again, smaller, once
    answered, and the newest call's text at every try, from the same text."""
    seen: dict[str, int] = {}
    for raw in _TOKEN.findall(_TAG.sub(" ", text) if "<" in text else text):
        token = raw.strip(".-/") if raw[-1:] in ".-/" or raw[:1] in ".-" else raw
        if token.startswith(_OWN):  # self.rhs is the attribute rhs
            token = token.split(".", 1)[1]
        if _is_name(token):
            seen[token] = seen.get(token, 0) + 1
    modules = {m.group(1) or m.group(2) for m in _IMPORTED.finditer(text)}
    defined = {m.group(1) for m in _DEFINED.finditer(text)}
    order = list(seen)
    rank = {t: k for k, t in enumerate(order)}
    order.sort(key=lambda t: (t not in modules, t not in defined, -seen[t], rank[t]))
    return tuple(Entity(t, "name", source_id, "path" if "/" in t else "name") for t in order)


def _cut_sample(text: str, truncated_text: str) -> str:
    """Lines of ``text`` that ``truncated_text`` does not show: the first and the last
    ones, :data:`SAMPLE_CHARS` in all, read from both ends without splitting the rest."""
    kept = set(truncated_text.split("\n"))
    half = SAMPLE_CHARS // 2
    head: list[str] = []
    size, pos = 0, 0
    while size < half and pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        line = text[pos : min(end, pos + half)]
        if line not in kept:
            head.append(line)
            size += len(line) + 1
        pos = end + 1
    tail: list[str] = []
    size, stop = 0, len(text)
    while size < half and stop > pos:
        start = text.rfind("\n", pos, stop) + 1
        line = text[max(start, stop - half) : stop]
        if line not in kept:
            tail.append(line)
            size += len(line) + 1
        stop = start - 1
    return "\n".join(head + tail[::-1])


def _entities(original: Message, truncated_text: str) -> list[Entity]:
    """The entities of ``original``, bounded and safe on any text: a long result is
    sampled (its cut lines), JSON too deep to parse safely is read as text, and a page
    by its visible text and links."""
    text = original.text
    if original.kind == "html":  # the page's text and links, not its markup
        text = html_to_text(text[: SAMPLE_CHARS * 4])
        return extract_from_text(text[:SAMPLE_CHARS], original.id)
    if len(text) > SAMPLE_CHARS:
        return extract_from_text(_cut_sample(text, truncated_text), original.id)
    if original.tool_calls or original.role == "tool":
        # what the ledger reads of it when it leaves the window (the same values; the
        # origin aside, unused here): cached, so it is extracted once
        return extract_entities(original)
    is_json, data = load_json(text)
    if is_json:
        return extract_from_json(data, original.id)
    # the values of its text, as extract_from_text finds them (the origin aside), and
    # cached: the newest call's own text is cut again at each try with the same text
    return extract_entities(original)


def _lost(original: Message, truncated_text: str) -> list[Entity]:
    """Entities of ``original`` that the truncated text no longer shows, best first
    (for code, logs, diffs and traces: the names defined or used most, first)."""
    found = [e for e in _entities(original, truncated_text) if e.value not in truncated_text]
    order = sorted(range(len(found)), key=lambda i: (-CATEGORY_TIERS.get(found[i].category, 1), i))
    ranked = [found[i] for i in order]
    if original.kind not in _NAMED_KINDS:
        return ranked
    text = original.text
    sample = text if len(text) <= SAMPLE_CHARS else _cut_sample(text, truncated_text)
    names = [e for e in _names(sample, original.id) if e.value not in truncated_text]
    taken = {e.value for e in names}
    return names + [e for e in ranked if e.value not in taken]


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
    doc = load_json(truncated_text)[1]
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
