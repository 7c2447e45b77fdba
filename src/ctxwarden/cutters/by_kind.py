"""The ``kind -> cutter`` registry, and the one entry point that cuts a text by its kind.

A :class:`Cutter` cuts the text of one kind of tool result (:mod:`~ctxwarden.core.kinds`)
to about a token target, given what it is asked (:class:`CutRequest`): ``cut(text, ask)``
returns the cut, or ``None`` when it cannot place a line (then head-and-tail text is
used). :data:`CUTTERS` holds the built-in kinds; it is read-only, and a policy adds or
replaces kinds through the truncation step's ``cutters`` (:func:`with_cutters`): the
registry is a value of the policy, never module state. A kind of your own is cut when a
tool's rule names it, or when its ``detect(text) -> bool`` claims a result (tried before
the built-in classifier, in the order of the kinds' names; keep it cheap: it reads every
tool result over the threshold, once per message)::

    def cut_csv(text: str, ask: CutRequest) -> str | None:
        ...  # the header row and the rows that hold ask.terms, within ask.target_tokens

    def looks_like_csv(text: str) -> bool:
        ...  # the first lines have the same number of commas

    TruncateToolResults(cutters={"csv": Cutter(cut_csv, detect=looks_like_csv)})
    # or in TOML:
    #   [truncate.cutters]
    #   csv = { cut = "mypackage.cuts:cut_csv", detect = "mypackage.cuts:looks_like_csv" }
    # or, without a detector, cut only where a tool's rule names the kind:
    #   [truncate.cutters]
    #   csv = "mypackage.cuts:cut_csv"
    #   [tools.export_rows]
    #   truncate = "csv"          # this tool's results are cut as "csv"

:func:`truncate_by_kind` sends a result to the cutter for its kind (``None``, or a kind
without a cutter: plain text). Before that, a result longer than ``max_chars`` is
reduced to its first and last parts (at line ends) with a marker saying how much was
not examined: every later pass is then bounded by the cap whatever the input's size,
while the marker sizes still refer to the whole result (``total``). A cutter that must
see the whole text (``whole``: JSON, since a document cut in two is no longer JSON, and
its parser is C code) gets it up to ``whole`` times the cap, before it is counted.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from ctxwarden.core.errors import ConfigError
from ctxwarden.cutters.code import truncate_code
from ctxwarden.cutters.diff import truncate_diff
from ctxwarden.cutters.html_page import truncate_html
from ctxwarden.cutters.json_doc import truncate_json
from ctxwarden.cutters.lines import NOT_EXAMINED_PREFIX
from ctxwarden.cutters.log import truncate_log
from ctxwarden.cutters.stack_trace import DEFAULT_LIBRARY_PATTERNS, truncate_stack_trace
from ctxwarden.cutters.text import (
    Count,
    estimate_tokens,
    fmt,
    truncate_article,
    truncate_text,
)

__all__ = [
    "CUTTERS",
    "JSON_CAP_FACTOR",
    "MAX_CHARS",
    "Cut",
    "CutRequest",
    "Cutter",
    "Detect",
    "examined_part",
    "truncate_by_kind",
    "with_cutters",
]

#: Default cap on the characters of one result that truncation examines (500,000
#: characters are about 125,000 tokens: hundreds of times any sensible target).
MAX_CHARS = 500_000
JSON_CAP_FACTOR = 16


@dataclass(frozen=True)
class CutRequest:
    """What a cutter is asked: cut to about ``target_tokens`` as ``count`` counts them.

    ``total`` is the whole result's tokens (``None`` only for a ``whole`` cutter, given
    the text before it is counted); ``terms`` are what the agent was looking for (code,
    logs and diffs keep the lines with them, JSON the list items that hold them);
    ``fields`` and ``keep_fields`` are key names JSON keeps; ``library_patterns`` mark a
    stack trace's library frames.
    """

    target_tokens: int
    count: Count
    total: int | None = None
    terms: Sequence[str] = ()
    fields: Sequence[str] = ()
    keep_fields: Sequence[str] = ()
    library_patterns: Sequence[str] = DEFAULT_LIBRARY_PATTERNS


#: A kind's cut: ``(text, ask) -> the cut``, or ``None`` when it cannot cut this text.
Cut = Callable[[str, CutRequest], str | None]


#: Whether a tool result's text is of a kind: ``detect(text) -> bool``.
Detect = Callable[[str], bool]


@dataclass(frozen=True)
class Cutter:
    """One kind's cut; ``whole`` > 0: it is given texts up to ``whole`` times the cap on
    what is examined whole, before they are counted (longer ones are cut as text).
    ``detect`` (a kind a policy adds): which tool results are of this kind, whatever
    kind the built-in classifier gives them (``None``: only those a tool's rule names)."""

    cut: Cut
    whole: int = 0
    detect: Detect | None = None


def _json(text: str, ask: CutRequest) -> str:
    return truncate_json(
        text,
        target_tokens=ask.target_tokens,
        count=ask.count,
        keep_fields=ask.keep_fields,
        total=ask.total,
        terms=ask.terms,
        fields=ask.fields,
    )


def _stack_trace(text: str, ask: CutRequest) -> str:
    return truncate_stack_trace(
        text,
        target_tokens=ask.target_tokens,
        count=ask.count,
        library_patterns=ask.library_patterns,
        total=ask.total,
    )


def _article(text: str, ask: CutRequest) -> str:
    return truncate_article(text, target_tokens=ask.target_tokens, count=ask.count, total=ask.total)


def _html(text: str, ask: CutRequest) -> str:
    return truncate_html(text, target_tokens=ask.target_tokens, count=ask.count, total=ask.total)


def _code(text: str, ask: CutRequest) -> str | None:
    return truncate_code(text, target_tokens=ask.target_tokens, count=ask.count, terms=ask.terms)


def _diff(text: str, ask: CutRequest) -> str | None:
    return truncate_diff(text, target_tokens=ask.target_tokens, count=ask.count, terms=ask.terms)


def _log(text: str, ask: CutRequest) -> str | None:
    return truncate_log(text, target_tokens=ask.target_tokens, count=ask.count, terms=ask.terms)


def _text(text: str, ask: CutRequest) -> str:
    return truncate_text(text, target_tokens=ask.target_tokens, count=ask.count, total=ask.total)


#: The built-in kinds (every kind :func:`~ctxwarden.core.kinds.detect_kind` gives), read-only.
CUTTERS: Mapping[str, Cutter] = MappingProxyType(
    {
        "json": Cutter(_json, whole=JSON_CAP_FACTOR),
        "stack_trace": Cutter(_stack_trace),
        "article": Cutter(_article),
        "html": Cutter(_html),
        "code": Cutter(_code),
        "diff": Cutter(_diff),
        "log": Cutter(_log),
        "text": Cutter(_text),
    }
)


def with_cutters(
    added: Mapping[str, Any], source: str = "truncate.cutters"
) -> Mapping[str, Cutter]:
    """:data:`CUTTERS` with ``added`` over it: each kind name to a :class:`Cutter`, a
    ``cut(text, ask)`` function, ``"module:attribute"`` naming one (TOML), or a table
    ``{cut = ..., detect = ...}`` of those (a ``detect(text) -> bool`` too). A bad name
    or value is a :class:`ConfigError` naming the kind."""
    out = dict(CUTTERS)
    for kind, given in added.items():
        if not isinstance(kind, str) or not kind.isidentifier():
            raise ConfigError(f"{source}: a kind is a name (letters, digits, _), got {kind!r}")
        if isinstance(given, Mapping):
            out[kind] = _table(given, f"{source}.{kind}")
            continue
        value = _imported(given, f"{source}.{kind}") if isinstance(given, str) else given
        if not isinstance(value, Cutter):
            if not callable(value):
                raise ConfigError(
                    f"{source}.{kind}: a cutter is a function (text, ask) -> str | None "
                    f'or "module:attribute", got {given!r}'
                )
            value = Cutter(value)
        out[kind] = value
    return MappingProxyType(out)


def _table(table: Mapping[str, Any], where: str) -> Cutter:
    """A ``{cut = ..., detect = ...}`` table as a :class:`Cutter` (each a function or
    ``"module:attribute"``)."""
    unknown = set(table) - {"cut", "detect"}
    if unknown or "cut" not in table:
        raise ConfigError(
            f"{where}: a cutter table has cut = and optionally detect = "
            f'(each a function or "module:attribute"), got keys {sorted(table)}'
        )
    found: dict[str, Any] = {}
    for key in ("cut", "detect"):
        value = table.get(key)
        if isinstance(value, str):
            value = _imported(value, f"{where}.{key}")
        if value is not None and not callable(value):
            raise ConfigError(f"{where}.{key}: not a function: {table.get(key)!r}")
        found[key] = value
    return Cutter(found["cut"], detect=found["detect"])


def _imported(target: str, where: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(f'{where} = {target!r} must look like "module:attribute"')
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{where}: cannot import cutter {target!r}: {exc}") from None


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
    cutters: Mapping[str, Cutter] = CUTTERS,
) -> str:
    """Truncate ``text`` with the cutter ``cutters`` holds for its ``kind`` (``None`` or
    a kind without one: plain text).

    ``terms`` are what the agent was looking for (code, logs and diffs keep the lines
    with them, JSON the list items that hold them; ``fields`` are key names JSON keeps);
    ``total`` is ``count(text)`` when the caller knows it (a huge text is
    then never counted whole); ``max_chars`` caps what is examined.
    """
    cutter = cutters.get(kind) if kind is not None else None
    ask = CutRequest(target_tokens, count, total, terms, fields, keep_fields, library_patterns)
    if cutter is not None and cutter.whole and len(text) <= max_chars * cutter.whole:
        whole = cutter.cut(text, ask)  # given whole, before it is counted
        if whole is not None:
            return whole
    total = estimate_tokens(text, count) if total is None else total
    if total <= target_tokens:
        return text
    part = examined_part(text, max_chars)
    cut: str | None = None
    if cutter is not None and not cutter.whole:
        cut = cutter.cut(part, replace(ask, total=total))
    if cut is None:
        cut = truncate_text(part, target_tokens=target_tokens, count=count, total=total)
    return cut
