"""Counting a text of any size in bounded time, exactly where it matters.

tiktoken splits a text into *pieces* with its pre-tokenizer regex and runs BPE on each
piece. BPE on one piece is super-linear in its length, and its regex engine gives up on
very long whitespace runs (``" " * 1_000_000`` raises ``ValueError: ... Max stack size
exceeded``). A hostile tool result (5 MB of ``"a"``, one base64 blob, a minified dump) is
one long text; encoded whole it costs seconds, or raises.

**Method.** A text up to :data:`DIRECT_CHARS` is encoded whole, as before. A longer text
is cut into chunks of about :data:`CHUNK_CHARS` at *safe points*: positions that are a
piece boundary of both ``o200k_base`` and ``cl100k_base`` whatever comes before or after,
so the chunks' counts add up to the whole text's count exactly. The safe points
(:data:`_SAFE`), checked against both patterns' alternatives:

* after a newline and before a character that is neither whitespace nor ``/`` (no piece
  runs on past a newline into such a character; ``/`` can trail a punctuation piece);
* before a space that follows a printable ASCII character and precedes an ASCII letter
  (the space opens the next word's piece);
* before an ASCII digit that follows a printable ASCII non-digit, and before an ASCII
  letter that follows an ASCII digit (digits only ever form their own pieces).

The first safe point within :data:`LOOKAHEAD_CHARS` after each chunk's target end is
taken; a stretch with none (one piece longer than that: ``"a" * N``, a run of spaces or
of punctuation, a long CJK line) is cut hard there, which may count it a few tokens off.
A chunk with no safe point at all is encoded in :data:`HARD_CUT_CHARS` pieces (BPE's cost
per character grows with a piece's length). So ordinary text (prose, code, logs, JSON,
base64) is counted exactly at any size, and a pathological run approximately, never slowly.

**Cap.** At most ``max_chars`` characters of one text are encoded (default
:data:`MAX_COUNTED_CHARS`); the rest is estimated at the rate of the counted part,
rounded up, so the work per text is bounded whatever its size (at most about 0.15 s
for the default cap, 0.03 s for prose). Such a count is not exact: :func:`count_long` says so.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = [
    "CHUNK_CHARS",
    "DIRECT_CHARS",
    "MAX_COUNTED_CHARS",
    "count_is_exact",
    "count_long",
    "line_pieces",
    "safe_chunks",
    "word_pieces",
]

DIRECT_CHARS = 65_536
"""Texts up to this length are encoded whole (a few milliseconds at most)."""
CHUNK_CHARS = 32_768
"""Target length of one chunk of a longer text."""
LOOKAHEAD_CHARS = 4_096
"""How far past a chunk's target end a safe point is looked for before cutting hard."""
HARD_CUT_CHARS = 2_048
"""Length of the pieces a stretch with no safe point is counted in."""
MAX_COUNTED_CHARS = 500_000
"""Characters of one text encoded at most; the rest is estimated (configurable per
:class:`~ctxwarden.core.tokens.counter.TokenCounter`, ``max_counted_chars``)."""

_WORD_SAFE = r"(?<=[!-~])(?= [A-Za-z])"  # a word's leading space after printable ASCII
_SAFE = re.compile(
    r"(?<=\n)(?=[^\s/])"  # a newline, then neither whitespace nor '/'
    rf"|{_WORD_SAFE}"
    r"|(?<=[!-/:-~])(?=[0-9])"  # digits after a printable non-digit
    r"|(?<=[0-9])(?=[A-Za-z])"  # a letter after a digit
)


# every safe point touches a newline, a digit or a space before a letter
_MAY_BE_SAFE = re.compile(r"[\n0-9]| [A-Za-z]")


def safe_chunks(text: str, size: int = CHUNK_CHARS) -> list[tuple[int, int]]:
    """``(start, end)`` spans covering ``text``, cut at safe points where there are any."""
    spans: list[tuple[int, int]] = []
    start, n = 0, len(text)
    while n - start > size:
        target = start + size
        found = _SAFE.search(text, target, min(n, target + LOOKAHEAD_CHARS))
        cut = found.start() if found is not None and found.start() > start else target
        spans.append((start, cut))
        start = cut
    if start < n or not spans:
        spans.append((start, n))
    return spans


def line_pieces(text: str) -> list[str]:
    """``text`` cut after each newline that a printable ASCII character other than ``/``
    follows (a safe point, :data:`_SAFE`'s first kind, read narrowly): pieces whose
    counts add up to the text's. A block of labelled lines (the entity ledger) is cut
    into its lines, so a count of it again with a few lines changed encodes only those
    (:meth:`~ctxwarden.core.tokens.counter.TokenCounter.count_lines`)."""
    lines = text.split("\n")
    pieces: list[str] = []
    current = lines[0]
    for line in lines[1:]:
        if line and "!" <= line[0] <= "~" and line[0] != "/":
            pieces.append(current + "\n")
            current = line
        else:
            current += "\n" + line
    pieces.append(current)
    return pieces


_WORD_START = re.compile(_WORD_SAFE)  # :data:`_SAFE`'s second kind alone


def word_pieces(text: str) -> list[str]:
    """``text`` cut before each space that follows a printable ASCII character and
    precedes an ASCII letter (a safe point): pieces whose counts add up to the text's.
    A long line of space-separated values is cut into its values."""
    cuts = [m.start() for m in _WORD_START.finditer(text)]
    if not cuts:
        return [text]
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _encode_len(encoding: Any, text: str) -> int:
    try:
        return len(encoding.encode(text, disallowed_special=()))
    except ValueError:  # tiktoken's regex gave up (a huge whitespace run): cut smaller
        if len(text) <= 1024:
            return len(text.encode("utf-8", "surrogatepass"))  # at most one token per byte
        half = len(text) // 2
        return _encode_len(encoding, text[:half]) + _encode_len(encoding, text[half:])


def _encode_span(encoding: Any, text: str, start: int, end: int) -> int:
    """Tokens of ``text[start:end]``; a span with no safe point at all (one piece: ``"a" *
    N``) is counted in :data:`HARD_CUT_CHARS` pieces, which BPE does about twice as fast
    per character (its cost grows with a piece's length) and which is inexact anyway."""
    if end - start > HARD_CUT_CHARS and _MAY_BE_SAFE.search(text, start, end) is None:
        return sum(
            _encode_len(encoding, text[i : min(end, i + HARD_CUT_CHARS)])
            for i in range(start, end, HARD_CUT_CHARS)
        )
    return _encode_len(encoding, text[start:end])


def _all_safe(text: str, spans: list[tuple[int, int]]) -> bool:
    return all(_SAFE.match(text, end) is not None for _, end in spans[:-1])


def count_is_exact(text: str, max_chars: int = MAX_COUNTED_CHARS) -> bool:
    """Whether :func:`count_long` counts ``text`` exactly (no encoding: the cuts only)."""
    if len(text) <= DIRECT_CHARS:
        return True
    return len(text) <= max_chars and _all_safe(text, safe_chunks(text))


def count_long(encoding: Any, text: str, max_chars: int = MAX_COUNTED_CHARS) -> tuple[int, bool]:
    """``(tokens, exact)`` of ``text`` with the tiktoken ``encoding``, in bounded time.

    ``exact`` is False when part of the text was estimated (longer than ``max_chars``)
    or a chunk had to be cut inside a piece."""
    if len(text) <= DIRECT_CHARS:
        return _encode_len(encoding, text), True
    head = text if len(text) <= max_chars else text[:max_chars]
    spans = safe_chunks(head)
    tokens = sum(_encode_span(encoding, head, start, end) for start, end in spans)
    exact = len(head) == len(text) and _all_safe(head, spans)
    if len(head) < len(text):
        rate = tokens / max(1, len(head))
        tokens += math.ceil((len(text) - len(head)) * rate)
    return tokens, exact
