"""Rule-based entity extraction; the ledger is :mod:`ctxwarden.memory.entity_ledger`.

When a message is masked, truncated or leaves the window, the identifiers, dates,
amounts and names it carried are what the agent most needs later ("reservation ZFA04Y,
user mia_li_3668, 2024-05-20"); losing them makes it re-ask the user or re-call tools.
:func:`extract_entities` pulls them out with patterns that rely on the *shape* of a value
(letters mixed with digits, ``@``, ISO dates, currency signs, capitalised words not at a
sentence start), not on one data set's vocabulary, so they work in any language written
with word boundaries; month names are known in several languages. In JSON (tool results
and tool-call arguments) each value is paired with its key, so the ledger can say what a
value *is*: ``reservation_id: ZFA04Y``.

:class:`EntityLedger` collects them (deduplicated by value, first-seen order, so its
rendering is stable across turns and cacheable) and renders a compact system block,
trimming the least useful entries (low-value categories first, then the oldest) to fit
a token budget.
"""

from __future__ import annotations

import json
import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ctxwarden.messages import Message

__all__ = [
    "CATEGORY_TIERS",
    "Entity",
    "extract_entities",
    "extract_from_json",
    "extract_from_text",
    "parse_json_text",
]


@dataclass(frozen=True)
class Entity:
    """A value worth remembering: ``label`` is its JSON key or its category."""

    value: str
    label: str
    source_id: str
    category: str = ""


#: Trimming order of the ledger: tier 0 goes first when over budget, tier 2 last.
CATEGORY_TIERS: dict[str, int] = {
    "id": 3,
    "email": 3,
    "url": 2,
    "path": 2,
    "date": 2,
    "amount": 2,
    "name": 2,
    "time": 1,
    "code": 1,
    "quantity": 1,
    "value": 1,
    "number": 0,
}

# -- patterns ----------------------------------------------------------------------------------

_MONTHS = (
    # English, German, French, Spanish, Italian, Portuguese (stems; inflected forms follow)
    r"jan(?:uary|uar|vier)?|feb(?:ruary|ruar)?|f[ée]vrier|mar(?:ch|s|zo)?|märz|apr(?:il|ile)?"
    r"|avril|abril|may|mai|mayo|maggio|maio|jun(?:e|i|io|ho)?|juin|jul(?:y|i|io|ho)?|juillet"
    r"|aug(?:ust)?|août|agosto|sep(?:t|tember|tiembre|tembre)?|oct(?:ober|obre)?|okt(?:ober)?"
    r"|octubre|ottobre|outubro|nov(?:ember|embre|iembre)?|dec(?:ember)?|dez(?:ember)?"
    r"|d[ée]cembre|diciembre|dicembre|enero|febrero|gennaio|febbraio|janeiro|fevereiro"
    # Polish, Ukrainian, Russian (stems cover the genitive: "20 maja", "20 травня")
    r"|stycz\w*|lut\w*|marz\w*|marca|kwie\w*|maj\w*|czerw\w*|lip\w*|sierp\w*|wrze[sś]\w*"
    r"|pa[zź]dziern\w*|listopad\w*|grud\w*"
    r"|січ\w*|лют\w*|берез\w*|квіт\w*|трав\w*|черв\w*|лип\w*|серп\w*|верес\w*|жовт\w*"
    r"|листопад\w*|груд\w*|январ\w*|феврал\w*|март\w*|апрел\w*|ма[яй]|июн\w*|июл\w*"
    r"|август\w*|сентябр\w*|октябр\w*|ноябр\w*|декабр\w*"
)
_DAY = r"(?:[12]\d|3[01]|0?[1-9])(?:st|nd|rd|th|\.|-?го)?"
_WRITTEN_DATE = (
    rf"\b(?:{_DAY}\s+(?:of\s+)?(?:{_MONTHS})\b\.?(?:,?\s+\d{{4}})?"
    rf"|(?:{_MONTHS})\.?\s+{_DAY}(?![\d:])(?:,?\s+\d{{4}})?)"
)
_NUM = r"\d{1,3}(?:[,\u00a0\u202f ]\d{3})+(?:[.,]\d+)?|\d+(?:[.,]\d+)?"
_CUR_SYM = r"[$€£¥₴₽₹₩₪₺]"
_CUR_CODE = r"USD|EUR|GBP|PLN|UAH|CHF|JPY|CNY|CAD|AUD|RUB|INR|SEK|NOK|DKK|CZK|HUF|BRL|MXN"
_CUR_WORD = (
    r"dollars?|euros?|pounds?|yen|z[łl](?:otych|ote|oty)?|гривень|гривні|гривня|грн"
    r"|руб(?:лей|ля|ль)?\.?|доларів|долари|євро"
)
_UNITS = (
    r"kg|mg|g|lbs?|oz|km|cm|mm|m|mi|miles?|ft|feet|kilomet(?:er|re)s?|met(?:er|re)s?|km/h|mph"
    r"|[KMGT]i?B|ms|sec(?:onds?)?|s|min(?:utes?)?|h|hrs?|hours?|days?|weeks?|months?|years?"
    r"|nights?|bags?|pieces?|items?|passengers?|people|persons?|seats?|tickets?|°[CF]|px|kWh|kW"
    r"|W|V|mAh|ml|l|L|dni|dzie[nń]|godz\w*|os[oó]b|кг|км|см|м|год\w*|дн\w*|хв|шт"
)

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (cat, re.compile(rx, re.IGNORECASE if cat == "date-written" else 0))
    for cat, rx in (
        ("url", r"\b(?:https?|ftp)://[^\s<>\"'()\[\]{}]+"),
        ("email", r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+"),
        ("id", r"\b[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}\b"),
        (
            "date",
            r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b"
            r"|\b\d{1,2}[./]\d{1,2}[./]\d{2,4}\b",
        ),
        ("date-written", _WRITTEN_DATE),
        (
            "path",
            r"(?<![\w/:.])(?:~|\.{1,2})?/(?:[\w.@+-]+/)*[\w.@+-]*[A-Za-z][\w.@+-]*"
            r"|\b[A-Za-z]:\\(?:[\w.-]+\\)*[\w.-]+|\b(?:[\w.-]+/)+[\w-]+\.[A-Za-z]\w{0,4}\b",
        ),
        (
            "time",
            r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[AaPp]\.?[Mm]\b\.?)?(?:\+\d)?|\b\d{1,2}\s?[AaPp]\.?[Mm]\b",
        ),
        (
            "amount",
            rf"(?:{_CUR_SYM}\s?|\b(?:{_CUR_CODE})\s?)-?(?:{_NUM})"
            rf"|(?<![\w.,])(?:{_NUM})\s?(?:{_CUR_SYM}|(?:{_CUR_CODE}|{_CUR_WORD})(?!\w))",
        ),
        ("quantity", rf"(?<![\w.,])(?:{_NUM})\s?(?:%|(?:{_UNITS})(?![\w/]))"),
        # a run of word characters mixing letters and digits (an id), or one that starts
        # with a capital and has no digit (a code if it is all capitals); the lookaheads
        # keep every other word out of the Python loop
        (
            "id",
            r"(?:#|(?<!\w))(?:(?=[\w-]*\d)(?=[\w-]*[^\W\d])|(?=[^\W\d_a-z])(?![\w-]*\d))"
            r"\w(?:[\w-]*\w)?",
        ),
        ("number", rf"(?<![\w.,-])-?(?:{_NUM})(?![\w])"),
    )
)
_UUID = _PATTERNS[2][1]
_EMAIL = _PATTERNS[1][1]
_ORDINAL = re.compile(r"^\d+(?:st|nd|rd|th|-?го|-?й|-?ий)$", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?:^|[.!?:;…\n•*>\-–—]|\d\.)[\s\"'“„«(\[]*$")
_DIGIT = re.compile(r"\d")
_LETTERS = re.compile(r"[^\W\d_]")
_OPENERS = re.compile(r"[\s\"'“„«(\[]*")
_WORD = re.compile(r"[^\W\d_][\w'’-]*")
# capitalised function words that open sentences; not names
_NAME_SKIP_WORDS = (
    "I I'm I'll I've I'd The A An My Your Our His Her Their This That These Those Please Thank "
    "Thanks Hi Hello Hey Dear Yes No Sure Okay Ok Could Can Would Will Let Here There What When "
    "Where Which Who How Why If And But So For In On At To From With By Of As It We You He She "
    "They Also Then Now Just Unfortunately However Great Perfect Monday Tuesday Wednesday "
    "Thursday Friday Saturday Sunday January February March April May June July August "
    "September October November December Error Traceback None True False Note"
)
_NAME_SKIP = frozenset(_NAME_SKIP_WORDS.split())
_CODE_SKIP_WORDS = "OK ID AM PM TV FYI ASAP PS NB EST UTC GMT JSON HTTP API URL"
_CODE_SKIP = frozenset(_CODE_SKIP_WORDS.split())


def _is_title(word: str) -> bool:
    return word[0].isupper() and any(c.islower() for c in word[1:])


def _is_id(token: str) -> bool:
    """Letters (or underscores) mixed with digits, and not an ordinal like 20th."""
    has_digit = any(c.isdigit() for c in token)
    has_other = any(c.isalpha() or c == "_" for c in token)
    return has_digit and has_other and not _ORDINAL.match(token)


_MONTH = re.compile(_MONTHS, re.IGNORECASE)
_LETTER_RUN = re.compile(r"[^\W\d_]{3,}")


@lru_cache(maxsize=65_536)
def _is_month(word: str) -> bool:
    return _MONTH.fullmatch(word) is not None


_NEEDS_DIGIT = frozenset({"date", "time", "amount", "quantity", "number"})  # date-written too


def _may_match(
    category: str, pattern: re.Pattern[str], text: str, digits: bool, upper: bool
) -> bool:
    """Cheap tests that skip patterns on text that cannot match them: a written date
    needs a month name, a path a slash, a URL "://", an e-mail "@", a number a digit,
    a UUID a hyphen, an id a digit and a code a capital."""
    if category in _NEEDS_DIGIT:
        return digits
    if category == "date-written":
        return digits and any(_is_month(w) for w in _LETTER_RUN.findall(text))
    if category == "path":
        return "/" in text or "\\" in text
    if category == "url":
        return "://" in text
    if category == "email":
        return "@" in text
    if pattern is _UUID:
        return "-" in text
    if category == "id":
        return digits or upper
    return True


def _at_sentence_start(text: str, at: int) -> bool:
    """Whether position ``at`` opens a sentence. Only the last 64 characters are searched
    (searching the whole prefix made long texts quadratic), unless they are all spaces
    and quotes, when what decides lies further back."""
    lo = max(at - 64, 0)
    if _SENTENCE_END.search(text, lo, at) is not None:
        return True
    return (
        lo > 0
        and _OPENERS.fullmatch(text, lo, at) is not None
        and (_SENTENCE_END.search(text, 0, at) is not None)
    )


def _shouting(text: str) -> bool:
    """Most letters are capitals (a heading or an angry message): capitals are no code."""
    letters = _LETTERS.findall(text)
    return len(letters) > 24 and sum(map(str.isupper, letters)) > len(letters) // 2


def _clean(value: str) -> str:
    return " ".join(value.split()).strip(".,;:!?)(\"'")


def extract_from_text(text: str, source_id: str = "") -> list[Entity]:
    """Entities of free text, each labelled by its category; first occurrence wins."""
    out: dict[str, Entity] = {}
    claimed = bytearray(len(text))

    def take(start: int, end: int, value: str, category: str) -> None:
        if claimed.find(1, start, end) >= 0:
            return
        claimed[start:end] = b"\x01" * (end - start)
        value = _clean(value)
        if value and value not in out:
            out[value] = Entity(value, category, source_id, category)

    shouting: bool | None = None  # mostly capitals: no codes then (found when first needed)
    digits = _DIGIT.search(text) is not None
    upper = not text.islower()  # no capital at all: no code and no name
    for category, pattern in _PATTERNS:
        if not _may_match(category, pattern, text, digits, upper):
            continue
        for m in pattern.finditer(text):
            value = m.group(0)
            if category == "date-written":
                category_out = "date"
            elif category == "id":
                if _is_id(value.lstrip("#")):
                    category_out = "id"
                elif (
                    not any(c.isdigit() for c in value)
                    and len(value) >= 3
                    and value.isupper()
                    and value not in _CODE_SKIP
                ):
                    if shouting is None:
                        shouting = _shouting(text)
                    if shouting:
                        continue
                    category_out = "code"
                else:
                    continue
            else:
                category_out = category
            if category == "email":  # a user name is often an account id too: mia_li_3668@…
                local = value.split("@", 1)[0]
                if _is_id(local):
                    out.setdefault(local, Entity(local, "id", source_id, "id"))
            take(m.start(), m.end(), value, category_out)
    # proper names: runs of capitalised words, not a lone word at a sentence start
    run: list[re.Match[str]] = []
    words: list[re.Match[str] | None] = [*_WORD.finditer(text), None] if upper else []
    for w in words:
        title = w is not None and _is_title(w.group(0)) and claimed.find(1, w.start(), w.end()) < 0
        joined = not run or (w is not None and text[run[-1].end() : w.start()] in (" ", "\u00a0"))
        if w is not None and title and joined:
            run.append(w)
            continue
        while run:
            at_start = _at_sentence_start(text, run[0].start())
            if run[0].group(0) in _NAME_SKIP or (at_start and len(run) == 1):
                run = run[1:]
                continue
            break
        heading = bool(run) and text[run[-1].end() :][:8].lstrip(" *_0-9").startswith(":")
        if run and not heading:  # "Total Cost:" / "**Flight Option 1:**" label a field
            take(run[0].start(), run[-1].end(), text[run[0].start() : run[-1].end()], "name")
        run = [w] if w is not None and title else []
    return list(out.values())


# -- JSON ----------------------------------------------------------------------------------------

_ID_KEY = re.compile(r"(?:^|_)(?:id|ids|number|code|no|ref|key|sku|iban|account)$", re.IGNORECASE)
_AMOUNT_KEY = re.compile(r"amount|price|cost|total|balance|fee|paid|refund", re.IGNORECASE)
_GENERIC_KEYS = frozenset({"id", "name", "value", "code", "type", "key", "number", "date", "text"})


_TO_NINE = str.maketrans("0123456789", "9999999999")


@lru_cache(maxsize=4096)
def _key_kind(key: str) -> str:
    """The category of a JSON object key (keys repeat across records: cached)."""
    return _category_of(key)


@lru_cache(maxsize=4096)
def _key_traits(key: str) -> tuple[bool, bool]:
    """Whether a JSON key names an identifier, and whether it names an amount."""
    return _ID_KEY.search(key) is not None, _AMOUNT_KEY.search(key) is not None


def _category_of(value: str) -> str:
    """The category of a short JSON string from its shape alone. Without letters, the
    patterns see only where the digits are (which digit does not matter), so such values
    share one cache entry per shape: "562.54" and "18.20" are both "999.99"."""
    if _LETTERS.search(value) is None:
        return _category_by_text(value.translate(_TO_NINE))
    if "@" in value and _EMAIL.fullmatch(value):  # the e-mail pattern runs first and claims
        # the whole value; its local part, when it is an id, is a second entity
        return "value" if _is_id(value.split("@", 1)[0]) else "email"
    return _category_by_text(value)


@lru_cache(maxsize=65_536)
def _category_by_text(value: str) -> str:
    found = extract_from_text(value)
    if len(found) == 1 and found[0].value == _clean(value):
        return found[0].category
    return "value"


def extract_from_json(data: Any, source_id: str = "") -> list[Entity]:
    """Entities of a parsed JSON value; each scalar is labelled with the key that holds it.

    Object keys that are themselves identifiers (``"credit_card_7815826": {...}``) are
    taken too, labelled with their parent's key. Long strings are scanned as text.
    """
    out: dict[str, Entity] = {}

    def add(value: str, label: str, category: str) -> None:
        value = _clean(value)
        if value and value not in out:
            out[value] = Entity(value, label, source_id, category)

    def walk(node: Any, key: str, context: str) -> None:
        # str first: most leaves are strings (this loop runs once per JSON value)
        if isinstance(node, str):
            label = f"{context}.{key}" if context and key in _GENERIC_KEYS else key
            if len(node) <= 60 and "\n" not in node and len(node.split()) <= 4 and label:
                category = "id" if _key_traits(key)[0] else _category_of(node)
                add(node, label, category)
            else:
                for e in extract_from_text(node, source_id):
                    add(e.value, e.label, e.category)
        elif isinstance(node, dict):
            for k, v in node.items():
                k = str(k)
                kind = _key_kind(k)
                if kind == "id" or (kind == "code" and not isinstance(v, (dict, list))):
                    add(k, key or "key", kind)  # a key that is data: {"credit_card_1": …}
                    walk(v, k, context)
                else:
                    walk(v, k, key or context)
        elif isinstance(node, list):
            for item in node:
                walk(item, key, context)
        elif isinstance(node, bool) or node is None:
            return
        elif isinstance(node, (int, float)):
            label = f"{context}.{key}" if context and key in _GENERIC_KEYS else key
            if label:
                text = (
                    repr(node) if isinstance(node, int) or math.isfinite(node) else json.dumps(node)
                )
                add(text, label, "amount" if _key_traits(key)[1] else "number")

    walk(data, "", "")
    return list(out.values())


# -- messages, cached ----------------------------------------------------------------------------

_CACHE: OrderedDict[tuple[str, str], tuple[Entity, ...]] = OrderedDict()
_CACHE_MAX = 20_000


def parse_json_text(text: str) -> tuple[bool, Any]:
    """``(True, document)`` when ``text`` is a JSON object or array, else ``(False, None)``;
    JSON nested past :data:`~ctxwarden.steps.kinds.MAX_JSON_DEPTH` is text here (the
    depth is checked by a linear scan first: Python's parser and our walk recurse)."""
    from ctxwarden.steps.kinds import load_json

    return load_json(text)


def extract_entities(message: Message) -> list[Entity]:
    """The entities of one message: its text, its tool-call arguments, its JSON result.

    Cached by (fingerprint, id), so a history re-scanned every turn costs a dict lookup
    per message.
    """
    key = (message.fingerprint, message.id)
    cached = _CACHE.get(key)
    if cached is not None:
        _CACHE.move_to_end(key)
        return list(cached)
    found: dict[str, Entity] = {}
    is_json, data = parse_json_text(message.text) if message.role == "tool" else (False, None)
    parts = extract_from_json(data, message.id) if is_json else []
    if not is_json and message.text:
        parts = extract_from_text(message.text, message.id)
    for call in message.tool_calls:
        parts += extract_from_json(call.parsed_arguments(), message.id)
    for e in parts:
        found.setdefault(e.value, e)
    result = tuple(found.values())
    _CACHE[key] = result
    if len(_CACHE) > _CACHE_MAX:
        _CACHE.popitem(last=False)
    return list(result)
