"""JSON results: pruned until they fit, and always still valid JSON.

Arrays keep their first items plus a marker element, long strings are shortened, deep
containers summarised, and ``keep_fields`` survive everywhere (even in the items that
were cut). The document is parsed once (:func:`~ctxwarden.core.kinds.load_json`: a
linear depth scan first, so a document nested 10,000 deep is cut as text instead of
raising ``RecursionError``); the walks below recurse at most
:data:`~ctxwarden.core.kinds.MAX_JSON_DEPTH` deep. Renders of the gentle levels are
counted only when short enough to fit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden.core.kinds import load_json
from ctxwarden.cutters.text import Count, estimate_tokens, fmt, may_fit, truncate_text

__all__ = ["JSON_LEVELS", "Wanted", "prune", "truncate_json", "wanted_in"]

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


@dataclass(frozen=True)
class Wanted:
    """What the request names, for one document: ``items`` are the ids of the list items
    that hold a named value (a string leaf containing one of the ``terms``, any case, or a
    number equal to one), ``fields`` the key names the newest user message says. A named
    item is kept at a gentler level than its siblings, and a named key is never counted
    among the keys cut."""

    items: frozenset[int] = frozenset()
    fields: frozenset[str] = frozenset()


def wanted_in(doc: Any, terms: Sequence[str], fields: Sequence[str] = ()) -> Wanted:
    """The :class:`Wanted` of ``doc`` (one walk; ``doc`` is at most ``MAX_JSON_DEPTH``
    deep, as :func:`~ctxwarden.core.kinds.load_json` guarantees)."""
    lowered = tuple({t.lower() for t in terms if len(t) >= 3})
    items: set[int] = set()

    def named(node: Any) -> bool:
        if isinstance(node, str):
            text = node.lower()
            return any(t in text for t in lowered)
        if isinstance(node, int | float) and not isinstance(node, bool):
            return str(node).lower() in lowered
        if isinstance(node, dict):
            return any([named(child) for child in node.values()])  # (every child walked)
        if isinstance(node, list):
            hits = [id(child) for child in node if named(child)]
            items.update(hits)
            return bool(hits)
        return False

    if lowered:
        named(doc)
    return Wanted(frozenset(items), frozenset(f.lower() for f in fields))


_NOTHING_WANTED = Wanted()


def _gentler(level: tuple[int, int, int]) -> tuple[int, int, int]:
    """The level a named item is kept at: about twice its siblings' (it still shrinks as
    the levels harden, so the search for a fitting level ends)."""
    max_items, max_chars, max_depth = level
    return max(2 * max_items, 2), max(2 * max_chars, 30), max_depth + 1


def prune(
    value: Any,
    level: tuple[int, int, int],
    keep: frozenset[str],
    depth: int = 0,
    wanted: Wanted = _NOTHING_WANTED,
) -> Any:
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
        return _prune_list(value, level, keep, depth, wanted)
    out: dict[str, Any] = {}
    cut_keys = 0
    for i, (k, v) in enumerate(value.items()):
        if k in keep:
            out[k] = v
        elif (
            i < max(max_items, 1)
            or len(value) <= max_items + 1
            or (wanted.fields and k.lower() in wanted.fields)
        ):
            out[k] = prune(v, level, keep, depth + 1, wanted)
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


def _prune_list(
    value: list[Any],
    level: tuple[int, int, int],
    keep: frozenset[str],
    depth: int,
    wanted: Wanted,
) -> list[Any]:
    """A list's first ``max_items`` items, and up to as many more that the request names
    (kept gentler), in order; then the ``keep_fields`` of the others and a marker."""
    max_items = level[0]
    named = [i for i, v in enumerate(value) if id(v) in wanted.items] if wanted.items else []
    chosen = sorted({*range(min(max_items, len(value))), *named[: max(max_items, 1)]})
    if len(value) - len(chosen) <= 1 and max_items:
        chosen = list(range(len(value)))
    gentle = _gentler(level)
    out = [
        prune(value[i], gentle if i in named else level, keep, depth + 1, wanted) for i in chosen
    ]
    taken = set(chosen)
    rest = [v for i, v in enumerate(value) if i not in taken]
    projected = [p for p in (_project(v, keep) for v in rest) if p is not None] if keep else []
    cut = len(rest) - len(projected)
    tail = [f"[… {fmt(cut)} more item{'s' * (cut > 1)} cut]"] if cut else []
    return out + projected + tail


def truncate_json(
    text: str,
    *,
    target_tokens: int,
    count: Count,
    keep_fields: Sequence[str] = (),
    total: int | None = None,
    terms: Sequence[str] = (),
    fields: Sequence[str] = (),
) -> str:
    """Prune a JSON document until it fits the target; the output is always valid JSON.

    Arrays keep their first items and end with a string element saying how many were
    cut; objects keep their first keys plus a ``"…"`` key saying how many were cut; long
    strings end with ``…[N chars cut]``; containers past the depth limit become a short
    string. Values under ``keep_fields`` keys are kept whole everywhere, even inside
    items that are otherwise cut. Harder levels are tried (binary search) until the
    output fits; when none does, the smallest is returned, and never one larger than the
    input. Text that is not JSON (or nests deeper than ``MAX_JSON_DEPTH``) is truncated
    as text. ``total`` is ``count(text)`` when the caller knows it. List items holding
    one of the ``terms`` (what the request names) are kept before the others, gentler,
    and keys named in ``fields`` are kept (:class:`Wanted`).
    """
    total = estimate_tokens(text, count) if total is None else total
    if total <= target_tokens:
        return text
    ok, doc = load_json(text)
    if not ok:
        return truncate_text(text, target_tokens=target_tokens, count=count, total=total)
    keep = frozenset(keep_fields)
    pretty = "\n" in text.strip()
    wanted = wanted_in(doc, terms, fields) if terms or fields else _NOTHING_WANTED

    def render(level: int, named: Wanted = wanted) -> str:
        pruned = prune(doc, JSON_LEVELS[level], keep, 0, named)
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
    if not fitting and wanted is not _NOTHING_WANTED:
        # no level fits with the named items kept gentler: the hardest plain level, if
        # smaller (a cut never ends larger for what the request named)
        plain = render(last, _NOTHING_WANTED)
        if count(plain) < count(best):
            best = plain
    return best if may_fit(best, total) and count(best) < total else text
