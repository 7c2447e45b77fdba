"""Type-aware truncation of long tool results (R4), the cheapest step of the cascade.

A tool result over ``threshold_tokens`` is cut to about ``target_tokens`` according to its
``kind``, so that what an agent needs from it survives:

* a **stack trace** keeps its error lines, the first frame and the application's own
  frames; runs of library frames in the middle become ``[... 14 library frames cut ...]``;
* **JSON** stays valid JSON: long arrays keep their first items plus a marker element,
  long strings are shortened, deep containers summarised, and ``keep_fields`` survive
  everywhere (even in the items that were cut);
* an **article** keeps its lead paragraphs; **text** keeps its head and its tail.

Every marker says what was cut and how much. The core functions are pure and take a
``count`` callable so they can be tested without a tokenizer. Output is a function of the
input and the configuration only, so a result truncated at turn *t* is byte-identical at
turn *t+1* and the prompt prefix stays cacheable.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ctxwarden.errors import ConfigError
from ctxwarden.messages import Message
from ctxwarden.steps.base import Action, StrategyContext, StrategyResult
from ctxwarden.steps.cut_values import with_cut_values

__all__ = [
    "DEFAULT_LIBRARY_PATTERNS",
    "TruncateToolResults",
    "truncate_article",
    "truncate_by_kind",
    "truncate_json",
    "truncate_stack_trace",
    "truncate_text",
]

Count = Callable[[str], int]

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


def _fmt(n: int) -> str:
    return f"{n:,}"


# -- text and article --------------------------------------------------------------------------


def truncate_text(text: str, *, target_tokens: int, count: Count) -> str:
    """Head and tail of ``text`` with a marker in the middle, about ``target_tokens`` long.

    The head gets 60% of the kept characters (it usually says what the output is), the
    tail 40% (it usually says how it ended). Cuts snap to line ends when one is near.
    A target smaller than the marker itself leaves ``text`` as it is (irreducible).
    """
    total = count(text)
    if total <= target_tokens:
        return text

    def build(chars: int) -> str:
        head_n = chars * 3 // 5
        tail_n = chars - head_n
        head, tail = text[:head_n], text[len(text) - tail_n :] if tail_n else ""
        nl = head.rfind("\n")
        if nl >= head_n // 2:
            head = head[: nl + 1]
        nl = tail.find("\n")
        if 0 <= nl <= tail_n // 2:
            tail = tail[nl + 1 :]
        middle = text[len(head) : len(text) - len(tail)]
        lines = middle.count("\n")
        extra = f", {_fmt(lines)} lines" if lines > 1 else ""
        marker = f"\n[... cut {_fmt(count(middle))} of {_fmt(total)} tokens{extra} ...]\n"
        return head + marker + tail

    lo, hi = 0, len(text)
    best = build(0)
    while lo <= hi:  # the largest character budget whose output fits the target
        mid = (lo + hi) // 2
        candidate = build(mid)
        if count(candidate) <= target_tokens:
            best, lo = candidate, mid + 1
        else:
            hi = mid - 1
    # a target smaller than the marker itself: never return more than we were given
    return best if count(best) < total else text


def _cut_prose(text: str, *, target_tokens: int, count: Count) -> str:
    """The longest prefix of ``text`` ending at a sentence (else a word) within the target."""
    lo, hi, best = 0, len(text), 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if count(text[:mid]) <= target_tokens:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    prefix = text[:best]
    ends = [m.end() for m in re.finditer(r"[.!?。](\s|$)", prefix)]
    if ends and ends[-1] >= best // 2:
        return prefix[: ends[-1]].rstrip()
    space = prefix.rfind(" ")
    return prefix[:space] if space >= best // 2 else prefix


def truncate_article(text: str, *, target_tokens: int, count: Count) -> str:
    """The lead paragraphs of an article that fit the target, then a marker with the cut size.

    Journalistic and documentation text front-loads what matters, so the lead is kept
    whole rather than sampling from everywhere.
    """
    total = count(text)
    if total <= target_tokens:
        return text
    budget = max(target_tokens - 16, 1)  # room for the marker
    paragraphs = re.split(r"(\n\s*\n)", text)
    kept = ""
    for i in range(0, len(paragraphs), 2):
        candidate = kept + (paragraphs[i - 1] if i else "") + paragraphs[i]
        if count(candidate) > budget:
            break
        kept = candidate
    if not kept.strip():
        kept = _cut_prose(text.lstrip(), target_tokens=budget, count=count)
    cut = max(total - count(kept), 0)
    return f"{kept.rstrip()}\n\n[... cut {_fmt(cut)} of {_fmt(total)} tokens ...]"


# -- stack traces ------------------------------------------------------------------------------

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


@lru_cache(maxsize=32)
def _library_regex(patterns: tuple[str, ...]) -> re.Pattern[str]:
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
) -> str:
    """Keep the error lines, the outer and inner frames and the app's frames of a trace.

    Reductions, each applied only while the result is over the target: drop the
    ``^^^^`` marker lines; drop library frames between the first and last frame of each
    run of frames; drop every middle frame; drop lines outside the last section (the last
    ``Traceback`` / ``Caused by:``) except error lines; drop the remaining frames; shorten
    long lines. The line naming the final error is kept verbatim unless it alone exceeds
    the target. Python, Java/Kotlin, Node, C# and Go traces are understood.
    """
    if count(text) <= target_tokens:
        return text
    lib = _library_regex(tuple(library_patterns))
    segments = _segments([line for line in text.split("\n") if not _CARETS.match(line)])
    lines: list[str] = []
    for all_frames in (False, True):
        lines = _cut_frames(segments, lambda f: bool(lib.search(f[0])), all_frames=all_frames)
        candidate = "\n".join(lines)
        if count(candidate) <= target_tokens:
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
        if count(candidate) <= target_tokens:
            return candidate
    final_line = lines[final]
    if count(final_line) > target_tokens:
        final_line = truncate_text(final_line, target_tokens=target_tokens * 3 // 4, count=count)
    rest = "\n".join(
        f"{line[:120]}…[{_fmt(len(line) - 120)} chars cut]" if len(line) > 160 else line
        for line, t in kept
        if t != 0
    )
    budget = target_tokens - count(final_line) - 1
    if count(rest) > budget:
        rest = truncate_text(rest, target_tokens=max(budget, 1), count=count)
        if count(rest) > budget:  # no room even for a cut: say so as briefly as possible
            rest = f"[... {_fmt(len(kept) - 1)} lines cut ...]"
            rest = rest if count(rest) <= budget else ""
    return f"{rest}\n{final_line}" if rest else final_line


# -- JSON ---------------------------------------------------------------------------------------

#: Ever harder (max items per array/object, max string chars, max depth), tried in turn.
_JSON_LEVELS: tuple[tuple[int, int, int], ...] = (
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


def _prune(value: Any, level: tuple[int, int, int], keep: frozenset[str], depth: int = 0) -> Any:
    max_items, max_chars, max_depth = level
    if isinstance(value, str):
        cut = len(value) - max_chars
        if cut > 24:  # the marker must save more than it costs
            return f"{value[:max_chars]}…[{_fmt(cut)} chars cut]"
        return value
    if not isinstance(value, (dict, list)) or not value:
        return value
    if depth >= max_depth:
        kept = _project(value, keep)
        if kept is not None:
            return kept
        if isinstance(value, dict):
            return f"{{… {_fmt(len(value))} key{'s' * (len(value) > 1)} cut}}"
        return f"[… {_fmt(len(value))} item{'s' * (len(value) > 1)} cut]"
    if isinstance(value, list):
        head = [_prune(v, level, keep, depth + 1) for v in value[:max_items]]
        rest = value[max_items:]
        if len(rest) <= 1 and max_items:
            return head + [_prune(v, level, keep, depth + 1) for v in rest]
        projected = [p for p in (_project(v, keep) for v in rest) if p is not None] if keep else []
        cut = len(rest) - len(projected)
        tail = [f"[… {_fmt(cut)} more item{'s' * (cut > 1)} cut]"] if cut else []
        return head + projected + tail
    out: dict[str, Any] = {}
    cut_keys = 0
    for i, (k, v) in enumerate(value.items()):
        if k in keep:
            out[k] = v
        elif i < max(max_items, 1) or len(value) <= max_items + 1:
            out[k] = _prune(v, level, keep, depth + 1)
        else:
            sub = _project(v, keep) if keep else None
            if sub is None:
                cut_keys += 1
            else:
                out[k] = sub
    if cut_keys:
        out[_CUT_KEY if _CUT_KEY not in out else _CUT_KEY * 2] = (
            f"{_fmt(cut_keys)} more key{'s' * (cut_keys > 1)} cut"
        )
    return out


def truncate_json(
    text: str, *, target_tokens: int, count: Count, keep_fields: Sequence[str] = ()
) -> str:
    """Prune a JSON document until it fits the target; the output is always valid JSON.

    Arrays keep their first items and end with a string element saying how many were
    cut; objects keep their first keys plus a ``"…"`` key saying how many were cut; long
    strings end with ``…[N chars cut]``; containers past the depth limit become a short
    string. Values under ``keep_fields`` keys are kept whole everywhere, even inside
    items that are otherwise cut. Harder levels are tried (binary search) until the
    output fits; when none does, the smallest is returned, and never one larger than the
    input. Text that is not JSON is truncated as text.
    """
    total = count(text)
    if total <= target_tokens:
        return text
    try:
        doc = json.loads(text)
    except ValueError:
        return truncate_text(text, target_tokens=target_tokens, count=count)
    keep = frozenset(keep_fields)
    pretty = "\n" in text.strip()

    def render(level: int) -> str:
        pruned = _prune(doc, _JSON_LEVELS[level], keep)
        return json.dumps(pruned, ensure_ascii=False, indent=1 if pretty else None)

    # The gentlest level that fits, walked to from a level guessed by size: big documents
    # land on the hard levels, whose renders are cheap, instead of a binary search's
    # renders of the gentle ones (the same answer: sizes only shrink level by level).
    last = len(_JSON_LEVELS) - 1
    level = 1 if total <= 2 * target_tokens else 4
    fits = {level: count(candidate := render(level)) <= target_tokens}
    found = {level: candidate}
    step = -1 if fits[level] else 1
    while 0 <= level + step <= last and fits[level] == (step == -1):
        level += step
        found[level] = render(level)
        fits[level] = count(found[level]) <= target_tokens
    fitting = [lv for lv, ok in fits.items() if ok]
    best = found[min(fitting)] if fitting else found.get(last) or render(last)
    return best if count(best) < total else text


# -- dispatch and the strategy -------------------------------------------------------------------


def truncate_by_kind(
    text: str,
    kind: str | None,
    *,
    target_tokens: int,
    count: Count,
    library_patterns: Sequence[str] = DEFAULT_LIBRARY_PATTERNS,
    keep_fields: Sequence[str] = (),
) -> str:
    """Truncate ``text`` with the method for its ``kind`` (``None`` or unknown: plain text)."""
    if kind == "stack_trace":
        return truncate_stack_trace(
            text, target_tokens=target_tokens, count=count, library_patterns=library_patterns
        )
    if kind == "json":
        return truncate_json(
            text, target_tokens=target_tokens, count=count, keep_fields=keep_fields
        )
    if kind == "article":
        return truncate_article(text, target_tokens=target_tokens, count=count)
    return truncate_text(text, target_tokens=target_tokens, count=count)


_RESULTS: OrderedDict[tuple[Any, ...], Message] = OrderedDict()
_CONFIG_IDS: dict[tuple[Any, ...], int] = {}
_RESULTS_MAX = 4096


@dataclass(frozen=True)
class TruncateToolResults:
    """Cut tool results over ``threshold_tokens`` to about ``target_tokens``, by kind.

    Defaults: 500/300 tokens. A typical useful tool result (a record, a short search
    page) stays under 500 and is left alone; a 300-token cut keeps a traceback's error
    and app frames or the first few items of a list, while a 10k-token dump costs 3%.
    Pinned and ``critical`` messages are never cut. Results are memoised by message
    fingerprint and configuration, so repeated builds do not redo the work.

    The identifiers, dates and amounts of the cut part are listed after the cut, within
    ``cut_values_tokens`` more tokens (0 turns it off; see
    :mod:`~ctxwarden.steps.cut_values`): the agent keeps them while the result is
    in the window, and the entity ledger — whose changes would break the cached prefix —
    takes them only once the result is masked or leaves.

    ``count_text`` (a text counter, e.g. ``TokenCounter.count_text``) is used while
    searching for the cut; without it each candidate is counted as a whole message
    through ``ctx.count``, which is exact but fills the counter's cache with drafts.
    """

    threshold_tokens: int = 500
    target_tokens: int = 300
    library_patterns: tuple[str, ...] = DEFAULT_LIBRARY_PATTERNS
    keep_fields: tuple[str, ...] = ()
    cut_values_tokens: int = 120
    count_text: Callable[[str], int] | None = field(default=None, compare=False, repr=False)
    name: str = field(default="truncate")
    _config_id: int = field(default=0, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.target_tokens < 1:
            raise ConfigError(f"target_tokens must be at least 1, got {self.target_tokens}")
        if self.cut_values_tokens < 0:
            raise ConfigError(f"cut_values_tokens must be >= 0, got {self.cut_values_tokens}")
        if self.threshold_tokens < self.target_tokens:
            raise ConfigError(
                f"threshold_tokens ({self.threshold_tokens}) must be >= target_tokens "
                f"({self.target_tokens}): a result between them would grow"
            )
        object.__setattr__(self, "library_patterns", tuple(self.library_patterns))
        object.__setattr__(self, "keep_fields", tuple(self.keep_fields))
        _library_regex(self.library_patterns)  # fail early on a bad regex
        # One small int per distinct configuration, for the memo's keys (hashing the whole
        # configuration on every message of every build showed up in the agent loop).
        config = (
            self.threshold_tokens,
            self.target_tokens,
            self.library_patterns,
            self.keep_fields,
            self.cut_values_tokens,
        )
        object.__setattr__(self, "_config_id", _CONFIG_IDS.setdefault(config, len(_CONFIG_IDS)))

    def truncate(
        self,
        message: Message,
        count: Callable[[Message], int],
        count_text: Callable[[str], int] | None = None,
    ) -> Message:
        """``message`` cut to the target (the same object when nothing is cut);
        ``count_text`` counts the drafts (else ``self.count_text``, else ``count``)."""
        if not self._cuttable(message):
            return message
        before = count(message)
        if before <= self.threshold_tokens:
            return message
        # The cut message itself is memoised (per id: the fingerprint ignores ids), so
        # every build sends the very same object and its fingerprint and count are cached.
        key = (message.id, message.fingerprint, self._config_id, before)
        hit = _RESULTS.get(key)
        if hit is not None:
            _RESULTS.move_to_end(key)
            return message if hit.content == message.content else hit
        overhead = max(count(message.with_content("")), 0)
        count_text = (
            self.count_text or count_text or (lambda s: count(message.with_content(s)) - overhead)
        )
        text = truncate_by_kind(
            message.text,  # the content itself: _cuttable admits string content only
            message.kind,
            target_tokens=max(self.target_tokens - overhead, 1),
            count=count_text,
            library_patterns=self.library_patterns,
            keep_fields=self.keep_fields,
        )
        listed = 0
        if text != message.content:
            text, listed = with_cut_values(
                message, text, max_tokens=self.cut_values_tokens, count=count_text
            )
        if text == message.content:
            cut = message
        elif listed:
            cut = message.with_content(text, truncated_from=before, values_listed=listed)
        else:
            cut = message.with_content(text, truncated_from=before)
        _RESULTS[key] = cut
        if len(_RESULTS) > _RESULTS_MAX:
            _RESULTS.popitem(last=False)
        return cut

    def _cuttable(self, message: Message) -> bool:
        """A text tool result this strategy may cut (not pinned, not critical)."""
        return (
            message.role == "tool"
            and isinstance(message.content, str)
            and not message.pinned
            and message.priority != "critical"
        )

    def sent_tokens(self, message: Message, tokens: int) -> int:
        """At most how many tokens ``message`` (``tokens`` long) is sent as once this
        strategy has run, without cutting it: what the summary triggers count."""
        if tokens > self.threshold_tokens and self._cuttable(message):
            return min(tokens, self.target_tokens + self.cut_values_tokens)
        return tokens

    def __call__(self, messages: Sequence[Message], ctx: StrategyContext) -> StrategyResult:
        out: list[Message] = []
        actions: list[Action] = []
        for message in messages:
            new = self.truncate(message, ctx.count, ctx.count_text)
            if new is not message:
                before, after = ctx.count(message), ctx.count(new)
                actions.append(
                    Action(
                        message.id,
                        "truncated",
                        f"{message.kind} tool result over {_fmt(self.threshold_tokens)} tokens",
                        before,
                        after,
                        strategy=self.name,
                    )
                )
            out.append(new)
        return StrategyResult(out, actions)
