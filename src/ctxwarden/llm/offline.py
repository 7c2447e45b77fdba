"""The offline default: an extractive summariser and a rule-based fact extractor (R12).

No key, no network, no model: every feature runs on a fresh machine. Both are honest
about what they are. The summary quotes sentences from the conversation (prefixed
with who said them) under a header saying it is extractive; it never writes a
sentence nobody said. Sentences are ranked by

- **entity density** — numbers, ids, amounts, dates, emails, paths, names per word
  (what the agent asks about later; seed 000's importance signal);
- **novelty** — overlap with what is already chosen (the previous summary's kept
  sentences included) is penalised, so the summary does not say one thing twice;
- **position and speaker** — what the user states outweighs what is asked, and the
  opening message of a stretch (where goals are stated) gets a small bonus,

then chosen greedily within ``max_tokens`` and printed in conversation order, under
the timestamp line in force (a message like ``[8 May, 2023]``), so "yesterday" in a
kept sentence can still be dated; the date a relative time means is added after it in
brackets (:mod:`~ctxwarden.memory.relative_dates`), the words said unchanged.

Given the current request (``query``, the newest user message), value is also scaled
by **relevance** to it (R9): the share of the request's words, weighted by rarity, a
sentence contains. :meth:`OfflineSummarizer.focus` uses it to show, within a build's
share of the budget, the part of a longer stored summary that the request is about —
the same sentences, only fewer, so nothing is rewritten.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import ClassVar

from ctxwarden.core.caching import memoize
from ctxwarden.core.errors import CtxwardenError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.memory.facts import (
    Facts,
    FactSchema,
    is_missing,
    normalize_key,
    schema_fields,
    validate_facts,
)
from ctxwarden.memory.relative_dates import dated
from ctxwarden.memory.summaries import SummaryResult

__all__ = ["OfflineSummarizer", "RuleBasedFactExtractor"]

_ENTITY = re.compile(
    r"[\w.+-]+@[\w-]+\.[\w.]+"  # email
    r"|https?://\S+"  # url
    r"|(?:[\w.-]+/)+[\w.-]+"  # path
    r"|[$€£₴]\s?\d[\d,.]*"  # money
    r"|\b[A-Za-z]*\d[\w-]*"  # numbers and ids: 1500, TCK-48213, 2023, 3pm
    r"|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\b"  # months
    r"|\b(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day\b"
    r"|\b(?:yesterday|today|tomorrow|tonight|last \w+|next \w+)\b"
    r"|(?<=[a-z,;] )[A-Z][a-z]+(?: [A-Z][a-z]+)*"  # capitalised names mid-sentence
    r"|\b(?!I\b|A\b|OK\b)[A-Z]{1,5}\b"  # sizes, codes, currencies: L, XL, USD
    r"|\"[^\"]{2,40}\""  # quoted titles
)
_WORD = re.compile(r"[a-z0-9]+")
_STOP_WORDS = (
    "a an the and or but if of to in on at for with from by about as is are was were be been "
    "being am do does did have has had i you he she it we they me him her us them my your his "
    "its our their this that these those so just very really too also not no yes oh hey hi "
    "hello thanks thank okay ok sure will would can could should what how why when where who "
    "which there here then than well like get got go going know think im it's i'm that's "
    "don't can't some any all more much one"
)
_STOP = frozenset(_STOP_WORDS.split())
_SPLIT = re.compile(r"(?<=[.!?…])\s+(?=[\"'(\[]?[A-Z0-9])|\n+")
_SPEAKER = re.compile(r"^([A-Z][\w'.-]*(?: [A-Z][\w'.-]*){0,2}): (?=\S)")
_LINE = re.compile(r"^([^:\n]{1,48}): (.+)$")
_HEADER = re.compile(  # ids may hold "-" and ":" ("session_1-date", "D16:12"); "–" splits them
    r"^Summary \(extractive, offline\)(?: of messages (\S+?)–(\S+?))?"
    r"(?:, merged from \d+ summaries)?:$"
)
_MAX_WORDS = 60
_STAMP = re.compile(r"^\[[^\]\n]{4,60}\]$")  # a timestamp line: "[1:56 pm on 8 May, 2023]"


def _stamp(text: str) -> str | None:
    text = text.strip()
    return text if _STAMP.match(text) and any(ch.isdigit() for ch in text) else None


def _content(text: str) -> frozenset[str]:
    return frozenset(w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 1)


@memoize(1)
def _default_counter() -> Callable[[str], int]:
    try:
        from ctxwarden.core.tokens.counter import TokenCounter

        return TokenCounter.for_model("gpt-4o").count_text
    except (ImportError, CtxwardenError):  # pragma: no cover - tokens.py always ships
        return lambda s: max(1, len(s) // 4)


@dataclass(frozen=True)
class _Unit:
    """One candidate sentence with its speaker and where it came from."""

    speaker: str
    text: str
    group: tuple[int, int]  # (source, index): consecutive units of one group share a line
    order: tuple[int, int, int]
    bonus: float = 1.0
    when: str | None = None  # the timestamp line in force ("[8 May, 2023]"), if any


def _sentences(text: str) -> list[str]:
    out = []
    for raw in _SPLIT.split(text):
        s = " ".join(raw.split())
        if not any(ch.isalnum() for ch in s):
            continue
        words = s.split(" ")
        if len(words) > _MAX_WORDS:
            s = " ".join(words[:_MAX_WORDS]) + " …"
        out.append(s)
    return out


def _message_units(messages: Sequence[Message]) -> list[_Unit]:
    units: list[_Unit] = []
    when: str | None = None
    for i, m in enumerate(messages):
        speaker, text = {"user": "User", "assistant": "Assistant"}.get(m.role, "Tool"), m.text
        if m.role == "system":
            continue
        if (stamp := _stamp(text)) is not None:  # dates what follows; not a sentence itself
            when = stamp
            continue
        if m.role == "tool":
            speaker, text = f"Tool result ({m.name or 'tool'})", _tool_text(m)
        elif (hit := _SPEAKER.match(text)) is not None:
            speaker, text = hit.group(1), text[hit.end() :]
        # the user states the facts an agent needs; between named people, neither side does
        by_user = m.role == "user" and speaker == "User"
        bonus = (1.25 if by_user else 1.0) * (1.1 if i == 0 else 1.0)
        for j, s in enumerate(_sentences(text)):  # "yesterday" given the date it means
            units.append(_Unit(speaker, dated(s, when), (1, i), (1, i, j), bonus, when))
        for k, call in enumerate(m.tool_calls):
            args = call.arguments if len(call.arguments) <= 160 else call.arguments[:159] + "…"
            units.append(
                _Unit("Assistant", f"called {call.name}({args})", (1, i), (1, i, 1000 + k), 1, when)
            )
    return units


def _tool_text(m: Message) -> str:
    """What a tool result says in sentences: scalar fields of JSON, the error line of a trace."""
    if m.kind == "json":
        try:
            data = json.loads(m.text)
        except ValueError:
            return ""
        if isinstance(data, dict):
            pairs = [f"{k}: {v}" for k, v in data.items() if isinstance(v, (str, int, float))]
            return "; ".join(pairs[:8]) + "."
        return ""
    if m.kind == "stack_trace":
        errors = [
            ln.strip() for ln in m.text.splitlines() if re.search(r"Error|Exception|panic", ln)
        ]
        return errors[-1] if errors else ""
    return m.text


def _summary_units(summary: str, source: int) -> tuple[list[_Unit], str | None]:
    """Sentences of an earlier extractive (or any) summary, with their speakers."""
    units: list[_Unit] = []
    first: str | None = None
    when: str | None = None
    for li, line in enumerate(summary.splitlines()):
        line = line.strip()
        if not line:
            continue
        if (head := _HEADER.match(line)) is not None:
            first = first or head.group(1)
            continue
        if (stamp := _stamp(line)) is not None:
            when = stamp
            continue
        hit = _LINE.match(line)
        speaker, text = (hit.group(1), hit.group(2)) if hit else ("Earlier", line)
        bonus = 1.25 if speaker == "User" else 1.0
        for j, s in enumerate(_sentences(text)):
            group, order = (0, source * 10_000 + li), (0, source, li * 1000 + j)
            units.append(_Unit(speaker, s, group, order, bonus, when))
    return units, first


@dataclass(frozen=True)
class OfflineSummarizer:
    """Extractive summaries within ``max_tokens`` (meta-summaries within ``meta_max_tokens``).

    ``count_text`` counts tokens of a string (default: gpt-4o's tokenizer, offline).
    ``summary_view``: builds given no summariser show what it wrote focused on each
    request (:func:`ctxwarden.pipeline.summarize.summary_viewer`).
    """

    summary_view: ClassVar[str] = "offline"
    max_tokens: int = 500
    meta_max_tokens: int = 1000
    count_text: Callable[[str], int] | None = field(default=None, compare=False)

    def _count(self, text: str) -> int:
        return (self.count_text or _default_counter())(text)

    async def summarize(
        self, messages: Sequence[Message], previous: str | None = None, query: str | None = None
    ) -> SummaryResult:
        return self.summarize_sync(messages, previous, query)

    async def merge(self, summaries: Sequence[str]) -> SummaryResult:
        return self.merge_sync(summaries)

    def summarize_sync(
        self, messages: Sequence[Message], previous: str | None = None, query: str | None = None
    ) -> SummaryResult:
        """The previous summary's sentences and the new messages' sentences, re-ranked
        (by relevance to ``query`` too, when given: see :meth:`focus`)."""
        units, first = _summary_units(previous, 0) if previous else ([], None)
        units += _message_units(messages)
        ids = [m.id for m in messages if m.role != "system"]
        last = ids[-1] if ids else _last_id(previous or "")
        first = first or (ids[0] if ids else None)
        span = f" of messages {first}–{last}" if first and last else ""
        header = f"Summary (extractive, offline){span}:"
        return self._compose(units, header, self.max_tokens, query)

    def focus(self, summary: str, query: str | None, max_tokens: int) -> SummaryResult:
        """The sentences of a stored ``summary`` most relevant to ``query``, within
        ``max_tokens``: the view of a larger extractive summary a build shows for the
        current request (R9). Same speakers and dates, nothing rewritten; a summary that
        already fits is returned as it is. The parsed summary is cached, so asking many
        requests of one summary costs a re-ranking each, not a re-parse."""
        if not summary.strip():
            return SummaryResult(summary, Usage(calls=0))
        header, scored, total = _parsed_summary(summary, self.count_text or _default_counter())
        if total <= max_tokens:
            return SummaryResult(summary, Usage(calls=0))
        return self._compose_scored(scored, header, max_tokens, query)

    def merge_sync(self, summaries: Sequence[str]) -> SummaryResult:
        units: list[_Unit] = []
        firsts: list[str] = []
        last: str | None = None
        for n, text in enumerate(summaries):
            more, first = _summary_units(text, n)
            units += more
            if first:
                firsts.append(first)
            last = _last_id(text) or last
        span = f" of messages {firsts[0]}–{last}" if firsts and last else ""
        header = f"Summary (extractive, offline){span}, merged from {len(summaries)} summaries:"
        return self._compose(units, header, self.meta_max_tokens)

    def _compose(
        self, units: list[_Unit], header: str, budget: int, query: str | None = None
    ) -> SummaryResult:
        return self._compose_scored(_score(units, self._count), header, budget, query)

    def _compose_scored(
        self, scored: Sequence[_Scored], header: str, budget: int, query: str | None
    ) -> SummaryResult:
        stamp = lru_cache(maxsize=None)(self._count)  # a dated line costs its date once
        chosen = _select(scored, budget - self._count(header) - 1, query, stamp)
        text = _layout(header, chosen)
        while chosen and self._count(text) > budget:  # timestamp lines pushed it over
            chosen.pop()  # the last chosen is the least valuable
            text = _layout(header, chosen)
        return SummaryResult(text if chosen else "", Usage(calls=0))


@memoize(16)
def _parsed_summary(summary: str, count: Callable[[str], int]) -> tuple[str, list[_Scored], int]:
    """A stored summary (a meta-summary and a level-one summary, blank-line separated)
    as scored sentences, the header that spans both, and its tokens."""
    units: list[_Unit] = []
    first: str | None = None
    for n, part in enumerate(summary.split("\n\n")):
        more, head = _summary_units(part, n)
        units += more
        first = first or head
    last = _last_id(summary)
    span = f" of messages {first}–{last}" if first and last else ""
    return f"Summary (extractive, offline){span}:", _score(units, count), count(summary)


def _last_id(summary: str) -> str | None:
    """The newest message id an extractive summary's header says it covers."""
    last = None
    for line in summary.splitlines():
        if (head := _HEADER.match(line.strip())) is not None and head.group(2):
            last = head.group(2)
    return last


def _layout(header: str, chosen: Iterable[_Unit]) -> str:
    """Chosen sentences in conversation order, one line per message, under their timestamps."""
    lines: list[str] = [header]
    last_group: tuple[int, int] | None = None
    last_when: str | None = None
    for u in sorted(chosen, key=lambda u: u.order):
        if u.when is not None and u.when != last_when:
            lines.append(u.when)
            last_when, last_group = u.when, None
        if u.group == last_group:
            lines[-1] += " " + u.text
        else:
            lines.append(f"{u.speaker}: {u.text}")
        last_group = u.group
    return "\n".join(lines)


_CONTENT_WEIGHT = 0.6  # a content word is worth this fraction of an entity
_LENGTH_EXPONENT = 0.8  # value per token^0.8: long sentences pay, a little less than linearly
_RELEVANCE_FLOOR = 0.15  # with a query, an unrelated sentence keeps this share of its value
_SUFFIX = re.compile(r"(?:ing|ed|es|s)$")


@dataclass(frozen=True)
class _Scored:
    density: float  # value per token^0.8, before relevance
    tokens: int
    words: frozenset[str]
    unit: _Unit
    stems: frozenset[str]


def _score(units: Iterable[_Unit], count: Callable[[str], int]) -> list[_Scored]:
    scored = []
    for u in units:
        words = _content(u.text)
        entities = len(_ENTITY.findall(u.text))
        if len(words) < 2 and entities == 0:
            continue
        value = (entities + _CONTENT_WEIGHT * min(len(words), 15)) * u.bonus
        if u.text.rstrip().endswith("?"):
            value *= 0.6
        tokens = _cached_count(count, f"{u.speaker}: {u.text}") + 1
        density = value / tokens**_LENGTH_EXPONENT
        scored.append(_Scored(density, tokens, words, u, frozenset(map(_stem, words))))
    return scored


@memoize(16_384)
def _cached_count(count: Callable[[str], int], text: str) -> int:
    """Sentences are re-scored at every cycle and every focused build: count each once."""
    return count(text)


def _stem(word: str) -> str:
    """A crude stem, so "painted" meets "paint" and "games" meets "game"."""
    return _SUFFIX.sub("", word) if len(word) > 4 else word


def _relevance(scored: Sequence[_Scored], query: str) -> list[float]:
    """Per sentence, the share of the query's weight it covers (0..1).

    A query word weighs its inverse document frequency among the candidate
    sentences, so a name said in every line counts little and a rare word much.
    """
    asked = {_stem(w) for w in _content(query)}
    if not asked:
        return [0.0] * len(scored)
    stems = [s.stems & asked for s in scored]
    df = dict.fromkeys(asked, 0)
    for found in stems:
        for w in found:
            df[w] += 1
    n = len(scored) + 1
    idf = {w: math.log(n / (1 + df[w])) + 1.0 for w in asked}
    total = sum(idf.values())
    return [sum(idf[w] for w in found) / total for found in stems]


def _select(
    scored: Sequence[_Scored],
    budget: int,
    query: str | None = None,
    stamp: Callable[[str], int] | None = None,
) -> list[_Unit]:
    """Greedy choice by value per token, skipping what repeats what is chosen; the first
    sentence under a timestamp also pays for its line (``stamp`` counts it).

    With ``query``, value is scaled by relevance to it (R9): sentences sharing the
    request's rarer words come first; the floor keeps dense unrelated ones in play.
    """
    if query:
        rel = _relevance(scored, query)
        ranked = [(s.density * (_RELEVANCE_FLOOR + r), s) for s, r in zip(scored, rel, strict=True)]
    else:
        ranked = [(s.density, s) for s in scored]
    ranked.sort(key=lambda t: -t[0])
    seen: set[str] = set()
    dated: set[str] = set()
    chosen: list[_Unit] = []
    used = 0
    for _, s in ranked:
        when = s.unit.when
        tokens = s.tokens
        if stamp is not None and when is not None and when not in dated:
            tokens += stamp(when) + 1
        if used + tokens > budget:
            continue
        overlap = len(s.words & seen) / len(s.words) if s.words else 1.0
        if overlap >= 0.8:
            continue
        chosen.append(s.unit)
        seen |= s.words
        used += tokens
        if when is not None:
            dated.add(when)
    return chosen


# -- facts --------------------------------------------------------------------------------------

_MONEY = (
    r"(?:[$€£₴]\s?\d[\d,.]*\s?[kK]?"
    r"|\d[\d,.]*\s?[kK]?\s?(?:USD|EUR|GBP|UAH|PLN|usd|eur|dollars?|euros?|bucks|грн|zł|\$|€))"
)
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*"
_DATE = (
    r"(?:\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}(?:/\d{2,4})?"
    rf"|{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?(?:,? \d{{4}})?"
    rf"|\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{_MONTH}(?:,? \d{{4}})?"
    r"|(?:next |this )?(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day"
    r"|tomorrow|tonight|end of (?:the )?(?:day|week|month))"
)
_I = re.IGNORECASE
# A size is a standalone token after the word "size" (not "sizes", "sized"): a letter
# code (S/M/L only in capitals — a lone lowercase "s" or "m" is never a size; XS…XXXL,
# 2XL in any case), a size word, or a number, optionally after EU/US/UK ("size EU 42").
_SIZE = re.compile(
    r"\b(?i:size)(?:\s*[:=]\s*|\s+(?i:is|of|was|will be|should be)\s+|\s+)"
    r"((?i:extra[ -]large|extra[ -]small|small|medium|large|[2-5]XL|XXXL|XXL|XL|XXS|XS)"
    r"|[SML]"
    r"|(?:(?i:EU|US|UK)\s?)?\d{1,2}(?:[.,]5)?)"
    r"(?![\w-])"
)
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("budget", re.compile(rf"\bbudget\b[^.?!\n]{{0,30}}?({_MONEY})", _I)),
    (
        "budget",
        re.compile(rf"\b(?:up to|under|below|no more than|at most|max(?:imum)?)\s+({_MONEY})", _I),
    ),
    ("size", _SIZE),
    ("email", re.compile(r"\b([\w.+-]+@[\w-]+\.[\w.-]*\w)")),
    ("phone", re.compile(r"(\+\d[\d ()-]{7,}\d)")),
    ("name", re.compile(r"\b(?:[Mm]y name is|[Cc]all me)\s+([A-Z][\w'-]+(?: [A-Z][\w'-]+)?)")),
    ("deadline", re.compile(rf"\b(?:by|before|until|no later than|deadline is)\s+({_DATE})\b", _I)),
    ("date", re.compile(rf"\b(?:on|for|date is)\s+({_DATE})\b", _I)),
    (
        "delivery_address",
        re.compile(r"\b(?:deliver|ship|send)(?: it| them)? to\s+([A-Z0-9][^.?!\n]{2,60})"),
    ),
    ("preference", re.compile(r"\bI (?:prefer|only want|'d prefer)\s+([^.?!\n]{3,60})", _I)),
    (
        "need",
        re.compile(
            r"\bI(?: really)? (?:need|want|would like|'d like|am looking for|'m looking for)"
            r"\s+([^.?!\n]{3,80})",
            _I,
        ),
    ),
)
_ID = re.compile(
    r"\b(order|ticket|reservation|booking|case|invoice|account|tracking|confirmation)"
    r"(?:\s*(?:id|number|no\.?|num|code|#))?\s*(?:is|:|=)?\s*#?\s*([A-Za-z0-9][A-Za-z0-9-]{2,}\d|\d{4,})\b",
    _I,
)
_KEY_VALUE = re.compile(r"^\s*([A-Za-z][\w ]{1,24}?)\s*[:=]\s*(\S[^\n]{0,60}?)\s*$", re.MULTILINE)
_VALUE_END = re.compile(r"\s+(?:and|but|because|so|which|please)\b.*$|[,;]\s.*$", _I)


_PLACE_END = re.compile(r"\s+(?:by|before|on|until|and|please)\b.*$", _I)


def _clean(key: str, value: str) -> str:
    """Trim a captured value at the next clause; addresses keep their commas."""
    end = _PLACE_END if key.endswith("address") else _VALUE_END
    return end.sub("", value).strip(" \"'")


def _field_rules(name: str) -> list[re.Pattern[str]]:
    spoken = re.escape(name.replace("_", " "))
    return [
        re.compile(
            rf"\b(?:my |the |our )?{spoken}\b\s*(?:is|:|=|will be|should be)\s+([^.?!\n]{{1,60}})",
            _I,
        ),
        # "size L", "order A-1": a code-like value right after the name (case matters)
        re.compile(rf"\b(?i:{spoken})\s+({_MONEY}|[A-Z0-9][A-Z0-9-]*\b)"),
    ]


@dataclass(frozen=True)
class RuleBasedFactExtractor:
    """Facts from user messages by rules, values copied verbatim from the text.

    With a schema, each field name is looked for as ``field: value``, ``my field is
    value`` and ``field VALUE``; the generic rules (budget with currency, size, email,
    phone, order/ticket/reservation ids, name, deadline, date, "I need/want …") fill
    the fields they name. Without one, the generic rules and ``key: value`` lines give
    free keys. A later statement replaces an earlier one; the history keeps both.
    """

    roles: tuple[str, ...] = ("user",)

    async def extract(
        self, messages: Sequence[Message], existing: Facts, schema: FactSchema = None
    ) -> Facts:
        return self.extract_sync(messages, existing, schema)

    def extract_sync(
        self, messages: Sequence[Message], existing: Facts | None = None, schema: FactSchema = None
    ) -> Facts:
        facts = existing or Facts()
        fields = list(schema_fields(schema)) if schema is not None else []
        for m in messages:
            if m.role not in self.roles or not m.text:
                continue
            found = self.facts_in(m.text, fields)
            valid = _valid_only(found, schema) if schema is not None else found
            facts = facts.merge(valid, source=m.id or None)
        return facts

    def facts_in(self, text: str, fields: Iterable[str] = ()) -> dict[str, str]:
        """The facts one text states (later statements in it win), before validation."""
        hits: list[tuple[int, str, str]] = []
        speaker = _SPEAKER.match(text)
        for kv in _KEY_VALUE.finditer(text):
            if speaker is not None and kv.start() == 0:
                continue  # "Caroline: I went…" is a speaker, not a field
            hits.append((kv.start(), normalize_key(kv.group(1)), kv.group(2)))
        for key, rule in _RULES:
            hits += [(h.start(), key, h.group(1)) for h in rule.finditer(text)]
        for h in _ID.finditer(text):
            hits.append((h.start(), f"{h.group(1).lower()}_id", h.group(2)))
        known = {(start, key) for start, key, _ in hits}
        for name in fields:  # a generic rule that knows the value's shape wins at its spot
            for rule in _field_rules(name):
                hits += [
                    (h.start(), name, h.group(1))
                    for h in rule.finditer(text)
                    if (h.start(), name) not in known
                ]
        out: dict[str, str] = {}
        for _, key, value in sorted(hits, key=lambda h: h[0]):
            value = _clean(key, value)
            if not is_missing(value):
                out[key] = value
        return out


def _valid_only(found: dict[str, str], schema: FactSchema) -> dict[str, object]:
    """Validate field by field: a rule's guess that does not fit the schema is dropped."""
    out: dict[str, object] = {}
    for key, value in found.items():
        try:
            out.update(validate_facts({key: value}, schema))
        except CtxwardenError:
            continue
    return out
