"""Stack traces: the error, the outer and inner frames and the application's own frames.

A trace's value is in its error lines, its first frame and the frames of the app itself;
runs of library frames in the middle become ``[... 14 library frames cut ...]``. Python,
Java/Kotlin, Node, C# and Go traces are understood. Candidates too long to fit are not
counted (:func:`~ctxwarden.cutters.text.may_fit`), so the cost stays bounded by the target.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ctxwarden.core.caching import memoize
from ctxwarden.core.errors import ConfigError
from ctxwarden.cutters.text import Count, estimate_tokens, fmt, may_fit, truncate_text

__all__ = ["DEFAULT_LIBRARY_PATTERNS", "library_regex", "truncate_stack_trace"]

#: Regexes (searched in a frame's text) that mark a frame as library code, not the app's.
DEFAULT_LIBRARY_PATTERNS: tuple[str, ...] = (
    r"site-packages",
    r"dist-packages",
    r"node_modules",
    r"/usr/(local/)?lib/",
    r"[\\/]lib[\\/]python\d",
    r"\\Lib\\",
    r"<frozen ",
    r"\bnode:internal",
    r"\(internal/",
    r"\bat (java|javax|jdk|sun|com\.sun|kotlin|scala|org\.junit|org\.springframework)\.",
    r"/go/src/runtime/|\bruntime/",
    r"[\\/]\.cargo[\\/]registry|/rustc/",
)


_PY_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')
_AT_FRAME = re.compile(r"^\s+at \S")  # Java, Kotlin, Node, C#
_GO_FRAME = re.compile(r"^\t\S+:\d+")
_CARETS = re.compile(r"^\s*[\^~]+\s*$")
_SECTION = re.compile(
    r"^\s*(Traceback \(most recent call last\)|Caused by:|Exception in thread|goroutine \d+ \[)"
)
_ERROR_LINE = re.compile(
    r"^\s*(Exception in thread|Caused by:|panic:|thread '.*' panicked"
    r"|[\w.$]*(Error|Exception|Exit|Interrupt|Warning|Failure|Fault)\b)"
)


@memoize(32)
def library_regex(patterns: tuple[str, ...]) -> re.Pattern[str]:
    try:
        return re.compile("|".join(f"(?:{p})" for p in patterns) or r"(?!x)x")
    except re.error as exc:
        raise ConfigError(f"library_patterns holds an invalid regex: {exc}") from exc


def _segments(lines: list[str]) -> list[tuple[str, list[str]]]:
    """Group lines into ("frame", lines) and ("line", [line]) segments."""
    out: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _PY_FRAME.match(line):
            indent = len(line) - len(line.lstrip())
            frame = [line]
            i += 1
            while (
                i < len(lines)
                and lines[i].strip()
                and len(lines[i]) - len(lines[i].lstrip()) > indent
                and not _PY_FRAME.match(lines[i])
            ):
                frame.append(lines[i])  # the source line and ^^^^ markers under it
                i += 1
            out.append(("frame", frame))
            continue
        if _AT_FRAME.match(line) or (out and out[-1][0] == "go" and _GO_FRAME.match(line)):
            if out and out[-1][0] == "go":
                out[-1] = ("frame", [*out[-1][1], line])
            else:
                out.append(("frame", [line]))
        elif (
            re.match(r"^[\w./*()-]+\(.*\)$", line)
            and i + 1 < len(lines)
            and _GO_FRAME.match(lines[i + 1])
        ):
            out.append(("go", [line]))  # a Go function line; its file line follows
        else:
            out.append(("line", [line]))
        i += 1
    return [("frame" if kind == "go" else kind, ls) for kind, ls in out]


def _cut_frames(
    segments: list[tuple[str, list[str]]], is_lib: Callable[[list[str]], bool], *, all_frames: bool
) -> list[str]:
    """Replace droppable frames by one marker per run; keep each run's first and last frame."""
    out: list[str] = []
    i = 0
    while i < len(segments):
        if segments[i][0] != "frame":
            out.extend(segments[i][1])
            i += 1
            continue
        j = i
        while j < len(segments) and segments[j][0] == "frame":
            j += 1
        run = [ls for _, ls in segments[i:j]]
        dropped = 0
        indent = re.match(r"^\s*", run[0][0])
        pad = indent.group(0) if indent else ""
        for k, frame in enumerate(run):
            droppable = 0 < k < len(run) - 1 and (all_frames or is_lib(frame))
            if droppable:
                dropped += 1
                continue
            if dropped:
                kind = "" if all_frames else "library "
                out.append(f"{pad}[... {dropped} {kind}frame{'s' * (dropped > 1)} cut ...]")
                dropped = 0
            out.extend(frame)
        i = j
    return out


def _final_error(lines: list[str]) -> int:
    """Index of the line that names the error: the last unindented error line, else the last."""
    nonempty = [k for k, line in enumerate(lines) if line.strip()]
    errors = [k for k in nonempty if _ERROR_LINE.match(lines[k]) and not lines[k][:1].isspace()]
    return errors[-1] if errors else (nonempty[-1] if nonempty else 0)


def _keep_lines(lines: list[str], tiers: list[int], max_tier: int) -> list[tuple[str, int]]:
    """Lines of tier <= ``max_tier`` (with their tier); each dropped run becomes a marker."""
    out: list[tuple[str, int]] = []
    dropped = 0
    for line, tier in zip(lines, tiers, strict=True):
        if tier > max_tier:
            dropped += 1
            continue
        if dropped:
            out.append((f"[... {dropped} line{'s' * (dropped > 1)} cut ...]", 1))
            dropped = 0
        out.append((line, tier))
    if dropped:
        out.append((f"[... {dropped} line{'s' * (dropped > 1)} cut ...]", 1))
    return out


def truncate_stack_trace(
    text: str,
    *,
    target_tokens: int,
    count: Count,
    library_patterns: Sequence[str] = DEFAULT_LIBRARY_PATTERNS,
    total: int | None = None,
) -> str:
    """Keep the error lines, the outer and inner frames and the app's frames of a trace.

    Reductions, each applied only while the result is over the target: drop the
    ``^^^^`` marker lines; drop library frames between the first and last frame of each
    run of frames; drop every middle frame; drop lines outside the last section (the last
    ``Traceback`` / ``Caused by:``) except error lines; drop the remaining frames; shorten
    long lines. The line naming the final error is kept verbatim unless it alone exceeds
    the target. Python, Java/Kotlin, Node, C# and Go traces are understood. ``total``
    is ``count(text)`` when the caller knows it.
    """
    total = estimate_tokens(text, count) if total is None else total
    if total <= target_tokens:
        return text

    def fits(candidate: str, target: int = target_tokens) -> bool:
        return may_fit(candidate, target) and count(candidate) <= target

    lib = library_regex(tuple(library_patterns))
    segments = _segments([line for line in text.split("\n") if not _CARETS.match(line)])
    lines: list[str] = []
    for all_frames in (False, True):
        lines = _cut_frames(segments, lambda f: bool(lib.search(f[0])), all_frames=all_frames)
        candidate = "\n".join(lines)
        if fits(candidate):
            return candidate
    final = _final_error(lines)
    sections = [k for k, line in enumerate(lines) if _SECTION.match(line)]
    last_section = sections[-1] if sections else 0
    tiers = [
        0
        if k == final
        else 1
        if (_ERROR_LINE.match(line) or _SECTION.match(line)) and not line[:1].isspace()
        else 2
        if k >= last_section
        else 3
        for k, line in enumerate(lines)
    ]
    kept: list[tuple[str, int]] = []
    for max_tier in (2, 1):
        kept = _keep_lines(lines, tiers, max_tier)
        candidate = "\n".join(line for line, _ in kept)
        if fits(candidate):
            return candidate
    final_line = lines[final]
    if not fits(final_line):
        final_line = truncate_text(final_line, target_tokens=target_tokens * 3 // 4, count=count)
    rest = "\n".join(
        f"{line[:120]}…[{fmt(len(line) - 120)} chars cut]" if len(line) > 160 else line
        for line, t in kept
        if t != 0
    )
    budget = target_tokens - count(final_line) - 1
    if not fits(rest, budget):
        rest = truncate_text(rest, target_tokens=max(budget, 1), count=count)
        if not fits(rest, budget):  # no room even for a cut: say so as briefly as possible
            rest = f"[... {fmt(len(kept) - 1)} lines cut ...]"
            rest = rest if count(rest) <= budget else ""
    return f"{rest}\n{final_line}" if rest else final_line
