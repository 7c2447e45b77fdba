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
from dataclasses import dataclass, field
from typing import Any

from ctxwarden.core.caching import BoundedCache, memoize
from ctxwarden.core.kinds import load_json
from ctxwarden.core.messages import Message
from ctxwarden.memory.entity_patterns import (
    CAPITAL_WORDS,
    FROM_A_DIGIT,
    LETTER_RUN,
    NEEDS,
    NUMBER_START,
    PATTERNS,
    date_key,
    has_currency,
    is_month,
    matches_from,
    written_dates,
)

__all__ = [
    "CATEGORY_TIERS",
    "MAX_JSON_NODES",
    "MAX_SCAN_CHARS",
    "Entity",
    "date_key",
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
    #: who wrote it: "user", "assistant", "call" (a tool-call argument), "tool", "system"
    origin: str = field(default="", compare=False)


_new_object, _set_field = object.__new__, object.__setattr__


def _entity(value: str, label: str, source_id: str, category: str, origin: str) -> Entity:
    """``Entity(value, label, source_id, category, origin)``: the frozen dataclass's
    ``__init__`` looks ``object.__setattr__`` up again for each field (a tenth of
    extraction's time); this sets the same fields the same way (the same instance:
    equal, same hash, repr and pickle, still frozen; its fields in the object, as
    ``__init__`` leaves them, no ``__dict__`` made)."""
    e = _new_object(Entity)
    _set_field(e, "value", value)
    _set_field(e, "label", label)
    _set_field(e, "source_id", source_id)
    _set_field(e, "category", category)
    _set_field(e, "origin", origin)
    return e


#: Trimming order of the ledger: tier 0 goes first when over budget, tier 2 last.
CATEGORY_TIERS: dict[str, int] = {
    "id": 3,
    "email": 3,
    "url": 2,
    "path": 2,
    "identifier": 2,
    "date": 2,
    "amount": 2,
    "name": 2,
    "code": 2,
    "time": 1,
    "quantity": 1,
    "value": 1,
    "number": 0,
}

_PATTERNS = PATTERNS
_EMAIL = _PATTERNS[1][1]
_ID = _PATTERNS[10][1]
_WRITTEN = _PATTERNS[4][1]
_UUID_NEED, _DATE_NEED, _TIME_NEED = NEEDS["uuid"], NEEDS["date"], NEEDS["time"]
_QUANTITY_NEED = NEEDS["quantity"]
# Without a digit or a capital, only the URL, e-mail, path, UUID and identifier patterns
# may match; each needs one of these characters or a dotted name (see _plan), but a
# UUID without a digit or a capital gives nothing (no id, no code), so "-" is not one.
_SIGNS = re.compile(r"[/\\@_]")
_ORDINAL = re.compile(r"^\d+(?:st|nd|rd|th|-?го|-?й|-?ий)$", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?:^|[.!?:;…\n•*>\-–—#]|//|\d\.)[\s\"'“„«(\[]*$")
_DIGIT = re.compile(r"\d")
_LETTERS = re.compile(r"[^\W\d_]")
_OPENERS = re.compile(r"[\s\"'“„«(\[]*")
_WORD = re.compile(r"[^\W\d_][\w'’-]*")
# The words of _WORD that do not open with a lowercase ASCII letter (group 1): a word is
# a run of [\w'’-] from its first letter, so it starts a run of those characters or
# follows digits, "_", "'", "’" or "-" that open one.
_CAPITAL_WORD = re.compile(r"(?<![\w'’-])[\d_'’-]*([^\W\d_a-z][\w'’-]*)")
# The same spans found faster: the regex engine skips to a capital (a pattern opening
# with a look-behind is tried at every position), then the characters before it are
# checked: only digits, "_", "'", "’" or "-" back to the start of the run.
_CAPITAL_RUN = re.compile(r"[^\W\d_a-z][\w'’-]*")
# those two characters long or more (a single capital, "I", is no title-case word):
# the same matches without the single ones (a run character does not follow those, so
# the scan goes on from the next character as it does after a single one)
_CAPITAL_RUN_2 = re.compile(r"[^\W\d_a-z][\w'’-]+")
_RUN_CHAR = re.compile(r"[\w'’-]")
_LEAD_CHAR = re.compile(r"[\d_'’-]")
_SEPARATORS = frozenset(' \n\t"(),.:;/[]{}')  # neither word characters nor ' ’ -


def _capital_words(text: str, runs: re.Pattern[str] = _CAPITAL_RUN) -> list[tuple[int, int]]:
    """The spans of group 1 of :data:`_CAPITAL_WORD` over ``text``, in order (with
    ``runs`` :data:`_CAPITAL_RUN_2`: those two characters long or more)."""
    out = []
    for m in runs.finditer(text):
        p = m.start()
        if p == 0 or text[p - 1] in _SEPARATORS:
            out.append(m.span())
            continue
        while p > 0 and _LEAD_CHAR.match(text, p - 1):
            p -= 1
        if p == 0 or _RUN_CHAR.match(text, p - 1) is None:
            out.append(m.span())
    return out


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
_PLURAL_ACRONYM = re.compile(r"[A-Z]{2,}s")  # IDs, URLs, APIs: capitals, not a name


def _skipped_name_word(word: str) -> bool:
    """A function word that opens sentences ("I’m" as "I'm"), or a plural acronym."""
    return word.replace("’", "'") in _NAME_SKIP or _PLURAL_ACRONYM.fullmatch(word) is not None


_CODE_SKIP_WORDS = "OK ID AM PM TV FYI ASAP PS NB EST UTC GMT JSON HTTP API URL"
_CODE_SKIP = frozenset(_CODE_SKIP_WORDS.split())


def _is_title(word: str) -> bool:
    return word[0].isupper() and any(map(str.islower, word[1:]))


def _is_id(token: str) -> bool:
    """Letters (or underscores) mixed with digits, and not an ordinal like 20th."""
    return (
        any(map(str.isdigit, token))
        and ("_" in token or any(map(str.isalpha, token)))
        and not _ORDINAL.match(token)
    )


# What a code identifier needs besides "_": a dotted name ".x", a camelCase "aB". Each
# is one character class and a literal, which the regex engine finds fast; the
# identifier pattern itself tries four branches at every word (a third of extraction).
_DOTTED = re.compile(r"\.[A-Za-z_]")
_CAMEL = re.compile(r"[A-Z](?<=[a-z][A-Z])")  # opens with the capital: the engine skips to it


#: Characters of one text that are scanned: the first 48 Ki and the last 16 Ki (an
#: error or a total sits at the end of a long output). Beyond, extraction would cost
#: more than the values are worth, and a 5 MB tool result must not stall a build.
MAX_SCAN_CHARS = 65_536
_HEAD = 49_152
#: JSON values visited per document (in document order); the rest is not read.
MAX_JSON_NODES = 20_000
#: Long strings of one document scanned as text (each scan has a fixed cost).
MAX_JSON_TEXTS = 256


def _at_sentence_start(text: str, at: int) -> bool:
    """Whether position ``at`` opens a sentence. Only the last 64 characters are searched
    (searching the whole prefix made long texts quadratic), unless they are all spaces
    and quotes, when what decides lies further back (searched up to 1,024 characters
    back: a longer run of blanks opens a sentence anyway)."""
    lo = max(at - 64, 0)
    if _SENTENCE_END.search(text, lo, at) is not None:
        return True
    if lo == 0 or _OPENERS.fullmatch(text, lo, at) is None:
        return False
    far = max(at - 1024, 0)
    return far > 0 or _SENTENCE_END.search(text, far, at) is not None


_ASCII_NON_LETTERS = bytes(c for c in range(128) if not chr(c).isalpha())
_ASCII_CAPITALS = bytes(range(ord("A"), ord("Z") + 1))


def _shouting(text: str) -> bool:
    """Most letters are capitals (a heading or an angry message): capitals are no code.
    An ASCII text counts them in bytes (its letters are A-Z and a-z, its capitals A-Z)."""
    if text.isascii():
        letters = text.encode().translate(None, _ASCII_NON_LETTERS)
        n = len(letters)
        return n > 24 and n - len(letters.translate(None, _ASCII_CAPITALS)) > n // 2
    found = _LETTERS.findall(text)
    return len(found) > 24 and sum(map(str.isupper, found)) > len(found) // 2


_STRIPPED = ".,;:!?)(\"'"  # off both ends of a value
_RELATIVE = ("./", "../")  # a path's start that stripping would make another path


def _clean(value: str) -> str:
    return _clean_words(value.split())


def _clean_words(words: list[str]) -> str:
    """:func:`_clean` of a value already split into its words. A relative path keeps the
    dots it starts from: ``./runtests.py`` is not ``/runtests.py``."""
    value = " ".join(words)
    return value.rstrip(_STRIPPED) if value.startswith(_RELATIVE) else value.strip(_STRIPPED)


def _bounded(text: str) -> str:
    """``text`` cut to :data:`MAX_SCAN_CHARS`: its head and its tail."""
    if len(text) <= MAX_SCAN_CHARS:
        return text
    return text[:_HEAD] + "\n" + text[len(text) - (MAX_SCAN_CHARS - _HEAD) :]


def _identifier_category(value: str) -> str:
    """An identifier token with digits is an id (mia_li_3668, HAT123x); a dotted name or
    a snake/camel word is a code identifier."""
    return "id" if "." not in value and _is_id(value) else "identifier"


def _plan(text: str, digits: bool, upper: bool) -> tuple[bool, ...]:
    """Which of :data:`PATTERNS` may match ``text``, in their order: cheap tests that
    skip patterns on text that cannot match them. A written date needs a month name, a
    path a slash, a URL "://", an e-mail "@", a number a digit, a UUID a hyphen, an id a
    digit and a code a capital, an identifier ``_``, a dot before a letter
    (``np.linalg``) or a lower letter before a capital (``camelCase``); some need what
    :data:`~ctxwarden.memory.entity_patterns.NEEDS` finds as well."""
    dotted = _DOTTED.search(text) is not None
    return (
        "://" in text,
        "@" in text,
        "-" in text and _UUID_NEED.search(text) is not None,
        digits and _DATE_NEED.search(text) is not None,
        digits and any(map(is_month, LETTER_RUN.findall(text))),
        "/" in text or "\\" in text,
        digits and _TIME_NEED.search(text) is not None,
        digits and has_currency(text),
        digits and _QUANTITY_NEED.search(text) is not None,
        "_" in text or dotted or (upper and _CAMEL.search(text) is not None),
        digits or upper,
        digits,
    )


def extract_from_text(text: str, source_id: str = "", origin: str = "") -> list[Entity]:
    """Entities of free text, each labelled by its category; first occurrence wins.
    Linear in ``len(text)``; at most :data:`MAX_SCAN_CHARS` characters are read."""
    return [_entity(v, c, source_id, c, origin) for v, c in _text_values(text).items()]


def _tag_name(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` names a markup tag (``<output_head>``, ``</pr_description>``):
    the wrapping a harness puts around a tool's output or a task, not a value of it."""
    return text[end : end + 1] == ">" and text[max(start - 2, 0) : start].endswith(("<", "</"))


def _text_values(text: str) -> dict[str, str]:
    """:func:`extract_from_text`'s values and their categories, in its order."""
    if len(text) > MAX_SCAN_CHARS:
        text = _bounded(text)
    digits = _DIGIT.search(text) is not None
    upper = not text.islower()  # no capital at all: no code and no name
    if not (digits or upper) and _SIGNS.search(text) is None and _DOTTED.search(text) is None:
        return {}  # no pattern may match (see _plan) and no name: most lower-case prose
    out: dict[str, str] = {}
    claimed = bytearray(len(text))

    def take(start: int, end: int, value: str, category: str) -> None:
        if claimed.find(1, start, end) >= 0:
            return
        claimed[start:end] = b"\x01" * (end - start)
        value = _clean(value)
        if value and value not in out:
            out[value] = category

    shouting: bool | None = None  # mostly capitals: no codes then (found when first needed)
    starts: list[int] | None = None  # where a number may start (found when first needed)
    for (category, pattern), may in zip(_PATTERNS, _plan(text, digits, upper), strict=True):
        if not may:
            continue
        if pattern is _ID and not digits and "#" not in text:
            pattern = CAPITAL_WORDS  # the same matches, found faster
        if category in FROM_A_DIGIT:
            if starts is None:
                starts = [m.start() for m in NUMBER_START.finditer(text)]
            matches = matches_from(pattern, text, starts)
        elif pattern is _WRITTEN:
            matches = written_dates(text)
        else:
            matches = pattern.finditer(text)
        for m in matches:
            value = m.group(0)
            if category == "date-written":
                category_out = "date"
            elif category == "identifier":
                if len(value) < 4 or _tag_name(text, m.start(), m.end()):
                    continue
                category_out = _identifier_category(value)
            elif category == "id":
                if _is_id(value.lstrip("#")):
                    category_out = "id"
                elif (
                    not any(map(str.isdigit, value))
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
                    out.setdefault(local, "id")
            take(m.start(), m.end(), value, category_out)
    # proper names: runs of capitalised words, not a lone word at a sentence start. Only
    # title-case words no pattern claimed are visited: any other word would only end a
    # run, and the gap test ends it anyway (a word between two leaves more than a space).
    # What a run takes lies before the word that ends it: no word's test depends on it.
    if not upper:
        return out
    run: list[tuple[int, int]] = []
    for w in [
        *(
            w
            for w in _capital_words(text, _CAPITAL_RUN_2)
            if _is_title(text[w[0] : w[1]]) and claimed.find(1, *w) < 0
        ),
        None,
    ]:
        if w is not None and (not run or text[run[-1][1] : w[0]] in (" ", "\u00a0")):
            run.append(w)
            continue
        while run and (
            _skipped_name_word(text[run[0][0] : run[0][1]])
            or (len(run) == 1 and _at_sentence_start(text, run[0][0]))
        ):
            del run[0]
        # "Total Cost:" / "**Flight Option 1:**" label a field
        if run and not text[run[-1][1] : run[-1][1] + 16].lstrip(" *_0-9").startswith(":"):
            take(run[0][0], run[-1][1], text[run[0][0] : run[-1][1]], "name")
        run = [w] if w is not None else []
    return out


# -- JSON ----------------------------------------------------------------------------------------

_ID_KEY = re.compile(r"(?:^|_)(?:id|ids|number|code|no|ref|key|sku|iban|account)$", re.IGNORECASE)
_AMOUNT_KEY = re.compile(r"amount|price|cost|total|balance|fee|paid|refund", re.IGNORECASE)
# A key shaped like a field name: lower-case words, at most a short numeric suffix
# ("address1", "line_2"); an id used as a key has more digits ("credit_card_7815826").
_FIELD_NAME = re.compile(r"[a-z]+(?:_[a-z]+)*_?\d{1,2}")
_GENERIC_KEYS = frozenset({"id", "name", "value", "code", "type", "key", "number", "date", "text"})


_TO_NINE = str.maketrans("0123456789", "9999999999")


@memoize(4096)
def _key_kind(key: str) -> str:
    """The category of a JSON object key (keys repeat across records: cached); "field"
    for a key shaped like a field name (``address1``, ``line2``): schema, not data."""
    if _FIELD_NAME.fullmatch(key):
        return "field"
    return _category_of(key[:200])


@memoize(4096)
def _key_traits(key: str) -> tuple[bool, bool, bool]:
    """Whether a JSON key names an identifier, whether it names an amount, and whether
    it ends in "name" (``first_name``, ``lastName``, ``name``): capitalised words under
    it are a name, though one word alone has no name's shape."""
    return (
        _ID_KEY.search(key) is not None,
        _AMOUNT_KEY.search(key) is not None,
        key[-4:].lower() == "name",
    )


def _category_of(value: str) -> str:
    """The category of a short JSON string from its shape alone. Without letters, the
    patterns see only where the digits are (which digit does not matter), so such values
    share one cache entry per shape: "562.54" and "18.20" are both "999.99"."""
    # no letter: an ASCII value's are A-Z and a-z, the only characters upper() and
    # lower() change
    if value.lower() == value.upper() if value.isascii() else _LETTERS.search(value) is None:
        return _category_by_text(value.translate(_TO_NINE))
    if "@" in value and _EMAIL.fullmatch(value):  # the e-mail pattern runs first and claims
        # the whole value; its local part, when it is an id, is a second entity
        return "value" if _is_id(value.split("@", 1)[0]) else "email"
    return _category_by_text(value)


@memoize(65_536)
def _category_by_text(value: str) -> str:
    found = _text_values(value)
    if len(found) == 1:
        (only, category), *_ = found.items()
        if only == _clean(value):
            return category
    return "value"


def extract_from_json(data: Any, source_id: str = "", origin: str = "") -> list[Entity]:
    """Entities of a parsed JSON value; each scalar is labelled with the key that holds it.

    Object keys that are themselves identifiers (``"credit_card_7815826": {...}``) are
    taken too, labelled with their parent's key. Long strings are scanned as text. The
    walk is iterative (any depth) and reads at most :data:`MAX_JSON_NODES` values and
    :data:`MAX_JSON_TEXTS` long strings of :data:`MAX_SCAN_CHARS` characters in all.
    """
    out: dict[str, Entity] = {}

    def put(value: str, label: str, category: str) -> None:  # a value cleaned already
        if value and value not in out:
            out[value] = _entity(value, label, source_id, category, origin)

    def add(value: str, label: str, category: str) -> None:
        put(_clean(value), label, category)

    text_left, texts_left = MAX_SCAN_CHARS, MAX_JSON_TEXTS
    nodes = 0
    stack: list[tuple[Any, str, str]] = [(data, "", "")]  # (node, key, context), next last
    pop, push = stack.pop, stack.extend
    while stack and nodes < MAX_JSON_NODES:
        node, key, context = pop()
        nodes += 1
        # str first: most leaves are strings (this loop runs once per JSON value)
        if isinstance(node, str):
            label = f"{context}.{key}" if context and key in _GENERIC_KEYS else key
            words = node.split() if len(node) <= 60 and "\n" not in node else None
            if words is not None and len(words) <= 4 and label:
                names_id, _, names_a_name = _key_traits(key)
                category = "id" if names_id else _category_of(node)
                if category == "value" and names_a_name and all(w[:1].isupper() for w in words):
                    category = "name"  # "first_name": "Mia" (one word: no name by shape)
                put(_clean_words(words), label, category)
            elif text_left > 0 and texts_left > 0:
                piece = node[:text_left]
                text_left -= len(piece)
                texts_left -= 1
                for value, category in _text_values(piece).items():
                    add(value, category, category)
        elif isinstance(node, dict):
            inner = key or context
            items = []
            for k, v in node.items():
                k = str(k)
                kind = _key_kind(k)
                if kind == "id" or (kind == "code" and not isinstance(v, (dict, list))):
                    add(k, key or "key", kind)  # a key that is data: {"credit_card_1": …}
                    items.append((v, k, context))
                else:
                    items.append((v, k, inner))
            items.reverse()
            push(items)
        elif isinstance(node, list):
            push([(item, key, context) for item in reversed(node)])
        elif isinstance(node, bool) or node is None:
            continue
        elif isinstance(node, (int, float)):
            label = f"{context}.{key}" if context and key in _GENERIC_KEYS else key
            if label:
                text = (
                    repr(node) if isinstance(node, int) or math.isfinite(node) else json.dumps(node)
                )
                if type(node) is not int and type(node) is not float:
                    text = _clean(text)  # the repr of an int's or float's subclass may need it
                put(text, label, "amount" if _key_traits(key)[1] else "number")
    return list(out.values())


# -- messages, cached ----------------------------------------------------------------------------

_CACHE: BoundedCache[tuple[str, str], tuple[Entity, ...]] = BoundedCache(
    "entities.extracted", 20_000
)


def parse_json_text(text: str) -> tuple[bool, Any]:
    """``(True, document)`` when ``text`` is a JSON object or array, else ``(False, None)``;
    JSON nested past :data:`~ctxwarden.core.kinds.MAX_JSON_DEPTH` is text here (the
    depth is checked by a linear scan first: Python's parser and our walk recurse)."""
    return load_json(text)


def _arguments(arguments: str) -> Any:
    """A tool call's parsed arguments; ``None`` when they are no JSON (or nest too deep)."""
    try:
        return json.loads(arguments) if arguments else None
    except (ValueError, RecursionError):
        return None


def extract_entities(message: Message) -> list[Entity]:
    """The entities of one message: its text, its tool-call arguments, its JSON result.

    Each is marked with its ``origin`` (the message's role; ``"call"`` for tool-call
    arguments), which the ledger ranks by. Cached by (fingerprint, id), so a history
    re-scanned every turn costs a dict lookup per message.
    """
    key = (message.fingerprint, message.id)
    cached = _CACHE.get(key)
    if cached is not None:
        return list(cached)
    found: dict[str, Entity] = {}
    role = message.role
    is_json, data = parse_json_text(message.text) if role == "tool" else (False, None)
    parts = extract_from_json(data, message.id, role) if is_json else []
    if not is_json and message.text:
        parts = extract_from_text(message.text, message.id, role)
    for call in message.tool_calls:
        args = _arguments(call.arguments)
        if args is not None:
            parts += extract_from_json(args, message.id, "call")
        elif call.arguments:
            parts += extract_from_text(call.arguments, message.id, "call")
    for e in parts:
        found.setdefault(e.value, e)
    return list(_CACHE.put(key, tuple(found.values())))
