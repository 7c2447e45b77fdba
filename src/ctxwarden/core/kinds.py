"""What a tool result is, guessed from its content, in bounded time (R4).

The kind decides how :mod:`~ctxwarden.steps.truncate` cuts a result, so it must be right
for what agents actually read: JSON, stack traces, articles, and — for coding and ops
agents — source listings (``cat``, ``sed -n``, ``nl``), command output and logs (``ls``,
``grep``, test runs, build logs), unified diffs, and HTML pages. Detection looks at a
bounded sample (the first lines and characters), so it costs the same for a 5 MB result
as for a 5 kB one; only JSON is parsed whole (by the C parser, after a linear depth scan:
Python's parser recurses, and a document nested 10,000 deep would raise
``RecursionError``; over :data:`MAX_JSON_DEPTH` it is treated as text).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, get_args

__all__ = [
    "MAX_JSON_DEPTH",
    "RESULT_KINDS",
    "ResultKind",
    "detect_kind",
    "load_json",
    "nests_deeper",
]

ResultKind = Literal["stack_trace", "json", "article", "code", "log", "diff", "html", "text"]
RESULT_KINDS: tuple[str, ...] = get_args(ResultKind)

#: JSON nested deeper than this is treated as text: parsing, pruning and rendering it
#: would recurse that deep (Python's own limit is about 1,000 frames).
MAX_JSON_DEPTH = 128

_NOISE = {c: None for c in range(128) if chr(c) not in '[]{}"'}  # ASCII to drop
_NOT_SYNTAX = re.compile(r'[^\[\]{}"]+')
_STRING = re.compile(r'"[^"]*"')
_LEAF = re.compile(r"\[\]|\{\}")


def nests_deeper(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the brackets of ``text`` (outside strings) nest deeper than ``limit``
    (or, past ``limit`` openers, do not pair up: not JSON). Linear, in C-speed string
    operations: escapes are dropped, then all but brackets and quotes, then what is
    between quotes; each pass of one regex removes the innermost pairs, so ``limit``
    passes empty any bracket string at most that deep."""
    if text.count("[") + text.count("{") <= limit:
        return False
    unescaped = text.replace("\\\\", "").replace('\\"', "")
    syntax = _NOT_SYNTAX.sub("", unescaped.translate(_NOISE))  # brackets and quotes
    brackets = _STRING.sub("", syntax)  # what is not inside a string
    for _ in range(limit):
        if not brackets:
            return False
        shorter = _LEAF.sub("", brackets)
        if len(shorter) == len(brackets):
            return True  # brackets that do not pair up: not JSON
        brackets = shorter
    return bool(brackets)


def load_json(text: str) -> tuple[bool, Any]:
    """``(True, document)`` when ``text`` is a JSON object or array no deeper than
    :data:`MAX_JSON_DEPTH`, else ``(False, None)``; never raises."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{" or stripped[-1] not in "]}":
        return False, None
    if nests_deeper(stripped):
        return False, None
    try:
        return True, json.loads(stripped)
    except (ValueError, RecursionError):
        return False, None


# -- markers -------------------------------------------------------------------------------------

_TRACE_MARKERS = re.compile(
    r"Traceback \(most recent call last\)"  # Python
    r"|^\s+at [\w$.<>]+\(.*:\d+\)"  # Java / Kotlin
    r"|^\s+at .+ \(.+:\d+:\d+\)"  # Node.js
    r"|^goroutine \d+ \["  # Go
    r"|panicked at .+:\d+:\d+",  # Rust
    re.MULTILINE,
)
_HUNK = re.compile(r"^@@@? -\d+(?:,\d+)? (?:-\d+(?:,\d+)? )?\+\d+(?:,\d+)? @@", re.MULTILINE)
_DIFF_FILE = re.compile(r"^(?:diff --git |diff -\S|--- \S|\+\+\+ \S|Index: )", re.MULTILINE)
_HTML_DOC = re.compile(r"<!doctype html|<html[\s>]|<body[\s>]|<head[\s>]", re.IGNORECASE)
_HTML_TAG = re.compile(
    r"</?(?:a|p|div|span|table|tr|td|li|ul|ol|br|img|h[1-6]|section|article|nav|header"
    r"|footer|main|script|style|link|meta|form|input|button)\b[^<>]*>",
    re.IGNORECASE,
)
_RUN_LINE = re.compile(r"^(?:E\s{2,}|={3,}|_{3,}|-{3,} |\d{4}-\d\d-\d\d|\[?\d\d:\d\d:\d\d)")
_SENTENCE = re.compile(r"[.!?。](\s|$)")
#: A source line's number as ``nl``, ``cat -n``, ``grep -n`` (``12:`` for a match,
#: ``13-`` for context) or an editor prints it.
LINE_NUMBER = re.compile(r"^\s*\d+(?:\t|: |:|-(?=\s)|\s\|\s?|\s{2,})")
_SIGNATURE = re.compile(
    r"^\s*(?:(?:export\s+|pub(?:\(\w+\))?\s+|public\s+|private\s+|protected\s+|static\s+"
    r"|async\s+|abstract\s+|final\s+)*(?:def|class|function|func|fn|struct|enum|trait"
    r"|interface|impl|module|package|namespace|import|from\s+\S+\s+import|#include|using)\b"
    r"|@\w[\w.]*(?:\(|$)|#\[)"
)
_CODE_LINE = re.compile(
    r"(?:[:{};,(\[]|\)|=>|->)\s*(?:#.*|//.*)?$"  # ends like a statement or a block opener
    r"|^\s*(?:#|//|/\*|\*|\"\"\"|''')"  # a comment or docstring line
    r"|^\s*(?:return|if|elif|else|for|while|try|except|raise|with|const|let|var|yield)\b"
    r"|^\s+\S.*=.+"  # an indented assignment
)


def _lines_sample(text: str, max_lines: int = 300, max_chars: int = 40_000) -> list[str]:
    """The first lines of ``text``, at most ``max_lines`` and ``max_chars``."""
    head = text[:max_chars]
    lines = head.split("\n", max_lines)[:max_lines]
    if len(head) == max_chars and len(lines) > 1:
        lines.pop()  # a line cut by the sample
    return lines


def _looks_like_code(lines: list[str]) -> bool:
    body = [LINE_NUMBER.sub("", line, count=1) for line in lines]
    body = [line for line in body if line.strip()]
    if len(body) < 8:
        return False
    n = len(body)
    signatures = sum(1 for line in body if _SIGNATURE.match(line))
    code = sum(1 for line in body if _SIGNATURE.match(line) or _CODE_LINE.search(line))
    indented = sum(1 for line in body if line[:1] in " \t")
    if signatures >= 2 and code >= 0.35 * n and indented >= 0.2 * n:
        return True
    # a fragment from inside a function (sed -n '251,350p'): mostly indented statements,
    # and none of a test run's or a log's own lines
    return code >= 0.5 * n and indented >= 0.5 * n and not any(_RUN_LINE.match(x) for x in body)


def _is_prose(lines: list[str], stripped: str) -> bool:
    if len(stripped) < 600 or len(_SENTENCE.findall(stripped[:40_000])) < 5:
        return False
    body = [line for line in lines if line.strip()]
    long_lines = sum(1 for line in body if len(line) >= 100)
    return len(body) < 8 or long_lines >= 0.3 * len(body)


def detect_kind(text: str) -> ResultKind:
    """Guess the kind of a tool result from its text (bounded work but for JSON, which is
    parsed whole): JSON, a unified diff, an HTML page, a stack trace, a code listing, an
    article, command output or a log, else plain text."""
    stripped = text.strip()
    if not stripped:
        return "text"
    if stripped[0] in "[{" and load_json(stripped)[0]:
        return "json"
    sample = stripped[:40_000]
    if _HUNK.search(sample) and _DIFF_FILE.search(sample):
        return "diff"
    head = sample[:4_000]
    if _HTML_DOC.search(head) or (
        len(_HTML_TAG.findall(head)) >= 10 and head.count("<") * 12 >= len(head)
    ):
        return "html"
    if _TRACE_MARKERS.search(sample):
        return "stack_trace"
    lines = _lines_sample(stripped)
    if _looks_like_code(lines):
        return "code"
    if _is_prose(lines, stripped):
        return "article"
    if sum(1 for line in lines if line.strip()) >= 8:
        return "log"
    return "text"
