"""The patterns :mod:`ctxwarden.memory.entities` extracts values with, and date keys.

Each pattern relies on the *shape* of a value, not on one data set's vocabulary:
letters mixed with digits (ids, SKUs), all-capital short words (airport, currency and
ticker codes), ``@`` (e-mails), dates in ISO, numeric and written forms (month names
in several languages), currency signs and codes, units, slashes and file extensions
(paths), and the shapes of code identifiers: ``snake_case``, ``camelCase``, dotted
names (``np.linalg.norm``, ``setup.cfg``).

**Bounded work.** Every repetition that could run on from each start position is
capped (``{1,64}`` instead of ``+``), so a pattern costs at most a constant per start
and a scan is linear in the text, whatever the text: no pattern here backtracks over an
unbounded run (``"100 " * 10**6`` or ``"a." * 10**6`` made the old patterns quadratic).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ctxwarden.core.caching import memoize

__all__ = [
    "CAPITAL_WORDS",
    "FROM_A_DIGIT",
    "LETTER_RUN",
    "NEEDS",
    "NUMBER_START",
    "PATTERNS",
    "date_key",
    "has_currency",
    "is_month",
    "matches_from",
    "written_dates",
]

MONTHS = (
    # English, German, French, Spanish, Italian, Portuguese (stems; inflected forms follow)
    r"jan(?:uary|uar|vier)?|feb(?:ruary|ruar)?|f[ée]vrier|mar(?:ch|s|zo)?|märz|apr(?:il|ile)?"
    r"|avril|abril|may|mai|mayo|maggio|maio|jun(?:e|i|io|ho)?|juin|jul(?:y|i|io|ho)?|juillet"
    r"|aug(?:ust)?|août|agosto|sep(?:t|tember|tiembre|tembre)?|oct(?:ober|obre)?|okt(?:ober)?"
    r"|octubre|ottobre|outubro|nov(?:ember|embre|iembre)?|dec(?:ember)?|dez(?:ember)?"
    r"|d[ée]cembre|diciembre|dicembre|enero|febrero|gennaio|febbraio|janeiro|fevereiro"
    # Polish, Ukrainian, Russian (stems cover the genitive: "20 maja", "20 травня")
    r"|stycz\w{0,9}|lut\w{0,9}|marz\w{0,9}|marca|kwie\w{0,9}|maj\w{0,9}|czerw\w{0,9}"
    r"|lip\w{0,9}|sierp\w{0,9}|wrze[sś]\w{0,9}|pa[zź]dziern\w{0,9}|listopad\w{0,9}|grud\w{0,9}"
    r"|січ\w{0,9}|лют\w{0,9}|берез\w{0,9}|квіт\w{0,9}|трав\w{0,9}|черв\w{0,9}|лип\w{0,9}"
    r"|серп\w{0,9}|верес\w{0,9}|жовт\w{0,9}|листопад\w{0,9}|груд\w{0,9}|январ\w{0,9}"
    r"|феврал\w{0,9}|март\w{0,9}|апрел\w{0,9}|ма[яй]|июн\w{0,9}|июл\w{0,9}|август\w{0,9}"
    r"|сентябр\w{0,9}|октябр\w{0,9}|ноябр\w{0,9}|декабр\w{0,9}"
)
_DAY = r"(?:[12]\d|3[01]|0?[1-9])(?:st|nd|rd|th|\.|-?го)?"
_WRITTEN_DATE = (
    rf"\b(?:{_DAY}\s{{1,3}}(?:of\s{{1,3}})?(?:{MONTHS})\b\.?(?:,?\s{{1,3}}\d{{4}})?"
    rf"|(?:{MONTHS})\.?\s{{1,3}}{_DAY}(?![\d:])(?:,?\s{{1,3}}\d{{4}})?)"
)
_NUM = r"\d{1,3}(?:[,\u00a0\u202f ]\d{3}){1,6}(?:[.,]\d{1,12})?|\d{1,24}(?:[.,]\d{1,12})?"
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
    r"|W|V|mAh|ml|l|L|dni|dzie[nń]|godz\w{0,6}|os[oó]b|кг|км|см|м|год\w{0,6}|дн\w{0,4}|хв|шт"
)
_SEG = r"[\w.@+-]{1,80}"  # one path segment, bounded
# A code identifier: snake_case (an inner underscore), a leading underscore (_private,
# __main__) or camelCase (a lower then an upper letter), or a dotted name (two or more
# dot-joined words, a letter first in each: np.linalg.norm, ndarithmetic.py, setup.cfg).
# Lookaheads bounded to the token.
_IDENT = (
    r"(?<![\w.$@/\\-])"
    r"(?:[A-Za-z_]\w{0,63}(?:\.[A-Za-z_]\w{0,63}){1,8}"
    r"|(?=\w{0,63}[^\W_]_[^\W_])\w{1,64}"
    r"|_{1,2}[A-Za-z][A-Za-z0-9]\w{0,61}"
    r"|(?=\w{0,63}[a-z][A-Z])\w{1,64})"
    r"(?![\w@/\\-]|\.\w)"
)

PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (cat, re.compile(rx, re.IGNORECASE if cat == "date-written" else 0))
    for cat, rx in (
        ("url", r"\b(?:https?|ftp)://[^\s<>\"'()\[\]{}]{1,2000}"),
        ("email", r"(?<![\w.+-])[\w.+-]{1,64}@[\w-]{1,63}(?:\.[\w-]{1,63}){1,8}"),
        ("id", r"\b[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}\b"),
        (
            "date",
            r"\b\d{4}-\d{2}-\d{2}"
            r"(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b"
            r"|\b\d{4}/\d{2}/\d{2}\b|\b\d{1,2}[./]\d{1,2}[./]\d{2,4}\b",
        ),
        ("date-written", _WRITTEN_DATE),
        (
            "path",
            rf"(?<![\w/:.<])(?:~|\.{{1,2}})?/(?:{_SEG}/){{0,32}}[\w.@+-]{{0,80}}[A-Za-z][\w.@+-]{{0,80}}"
            r"|\b[A-Za-z]:\\(?:[\w.-]{1,80}\\){0,32}[\w.-]{1,80}"
            r"|(?<![\w./-])(?:[\w.-]{1,80}/){1,32}[\w-]{1,80}\.[A-Za-z]\w{0,4}\b",
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
        ("identifier", _IDENT),
        # a run of word characters mixing letters and digits (an id), or one that starts
        # with a capital and has no digit (a code if it is all capitals); the lookaheads
        # keep every other word out of the Python loop, bounded to the token's length
        (
            "id",
            r"(?:#|(?<!\w))(?:(?=[\w-]{0,63}\d)(?=[\w-]{0,63}[^\W\d])|(?=[^\W\d_a-z])(?![\w-]{0,63}\d))"
            r"\w(?:[\w-]{0,126}\w)?",
        ),
        ("number", rf"(?<![\w.,-])-?(?:{_NUM})(?![\w])"),
    )
)

#: For some patterns, a piece every match of it contains, found much faster: a text
#: without it holds no match, so the pattern is not run (same result, less scanning).
#: The patterns open with a look-behind or ``\b``, which the regex engine tries at every
#: position; these open with a character class or a literal, which it skips to. Each is
#: read off its pattern: a currency sign, code or word; a digit, a date separator, a
#: digit; a digit then ":" or (a space and) a.m./p.m.; a digit, maybe a space, then
#: "%" or a unit (a letter or "°"); a UUID's "-XXXX-".
NEEDS: dict[str, re.Pattern[str]] = {
    "amount": re.compile(rf"{_CUR_SYM}|{_CUR_CODE}|{_CUR_WORD}"),
    "date": re.compile(r"\d[-/.]\d"),
    "time": re.compile(r"\d(?::\d|\s?[AaPp])"),
    "quantity": re.compile(r"\d\s?(?:%|°|[^\W\d_])"),
    "uuid": re.compile(r"-[0-9a-fA-F]{4}-"),
}

# -- faster equivalents (tests/test_entity_fast_paths.py checks each against its original) --

_CUR_SYMBOLS = re.compile(_CUR_SYM)
_CUR_CODES = tuple(_CUR_CODE.split("|"))
_CAPITALS3 = re.compile(r"[A-Z][A-Z][A-Z]")  # what each currency code holds
# NEEDS["amount"]'s words, as the pieces each holds ("dollars?" holds "dollar"; the
# regex is a plain alternation, no flags, so finding one is finding one of these)
_CUR_WORDS_ASCII = ("dollar", "euro", "pound", "yen", "zl")
_CUR_WORDS_OTHER = ("zł", "гривень", "гривні", "гривня", "грн", "руб", "доларів", "долари", "євро")


def has_currency(text: str) -> bool:
    """``NEEDS["amount"].search(text) is not None``, found with substring tests: the
    regex is a 40-way alternation tried at every position of the text."""
    if "$" in text or any(map(text.__contains__, _CUR_WORDS_ASCII)):
        return True
    if _CAPITALS3.search(text) is not None and any(map(text.__contains__, _CUR_CODES)):
        return True
    if text.isascii():  # every other sign and word holds a non-ASCII character
        return False
    return _CUR_SYMBOLS.search(text) is not None or any(map(text.__contains__, _CUR_WORDS_OTHER))


#: The matches of the second "id" pattern on a text without a digit (``\d``) or "#":
#: its first branch needs a digit, its second then only a word opening with a letter
#: outside a-z. This regex opens with that letter (the engine skips to it) and checks
#: the word start after it, instead of trying a look-behind at every position.
CAPITAL_WORDS = re.compile(r"[^\W\d_a-z](?<!\w\w)(?:[\w-]{0,126}\w)?")

_MONTH_NAME = re.compile(MONTHS, re.IGNORECASE)
LETTER_RUN = re.compile(r"[^\W\d_]{3,}")


@memoize(65_536)
def is_month(word: str) -> bool:
    return _MONTH_NAME.fullmatch(word) is not None


_WRITTEN_DATE_PATTERN = PATTERNS[4][1]
#: How far before its month name a written date may start: a day (two digits and
#: "-го"), up to three spaces, "of" and up to three spaces again.
_DAY_BEFORE_MONTH = 13


#: Where a date, a time, a quantity or a number may start: a digit or "-" after no word
#: character (each pattern opens with ``\b`` or a look-behind for one, then a digit;
#: a number may open with "-"). The regex opens with the character: the engine skips
#: to it, where those patterns, opening with a look-behind, are tried at every position.
NUMBER_START = re.compile(r"[-\d](?<!\w[-\d])")
FROM_A_DIGIT = frozenset({"date", "time", "quantity", "number"})


def matches_from(pattern: re.Pattern[str], text: str, starts: list[int]) -> Iterator[re.Match[str]]:
    """``pattern.finditer(text)`` for a pattern that can only match from one of
    ``starts`` (in order): each is tried from where the last match ended, as
    ``finditer`` tries every position."""
    end = 0
    for at in starts:
        if at >= end:
            found = pattern.match(text, at)
            if found is not None:
                end = found.end()
                yield found


def written_dates(text: str) -> Iterator[re.Match[str]]:
    """``finditer`` of the written-date pattern, tried only where a match may start: its
    month name is a whole run of letters that :func:`is_month` (it opens with one,
    or a day at most :data:`_DAY_BEFORE_MONTH` characters before one comes first). Any
    position that may start a match is tried, in order, from where the last match
    ended, as ``finditer`` does; the others cannot match (the pattern is slow to try
    at every position: it opens with ``\\b`` and a case-blind choice of 75 names)."""
    tried: set[int] = set()
    for m in LETTER_RUN.finditer(text):
        if is_month(m.group()):
            at = m.start()
            tried.update(range(max(at - _DAY_BEFORE_MONTH, 0), at + 1))
    return matches_from(_WRITTEN_DATE_PATTERN, text, sorted(tried))


_MONTH_NUMBER = {
    **dict.fromkeys(("jan", "janv", "ene", "gen", "sty", "січ", "янв"), 1),
    **dict.fromkeys(("feb", "fév", "fev", "lut", "лют", "фев"), 2),
    **dict.fromkeys(("mar", "mär", "бер", "мар"), 3),
    **dict.fromkeys(("apr", "avr", "abr", "kwi", "кві", "апр"), 4),
    **dict.fromkeys(("may", "mai", "mag", "maj", "тра", "мая", "май"), 5),
    **dict.fromkeys(("jun", "jui", "giu", "cze", "чер", "июн"), 6),
    **dict.fromkeys(("jul", "lug", "lip", "лип", "июл"), 7),
    **dict.fromkeys(("aug", "aoû", "ago", "sie", "сер", "авг"), 8),
    **dict.fromkeys(("sep", "set", "wrz", "вер", "сен"), 9),
    **dict.fromkeys(("oct", "okt", "ott", "out", "paź", "paz", "жов", "окт"), 10),
    **dict.fromkeys(("nov", "lis", "лис", "ноя"), 11),
    **dict.fromkeys(("dec", "dez", "déc", "dic", "gru", "гру", "дек"), 12),
}
_ISO = re.compile(r"(\d{4})[-/](\d{2})[-/](\d{2})")
_NUMERIC = re.compile(r"(\d{1,2})[./](\d{1,2})[./](\d{2,4})")
_WRITTEN = re.compile(rf"({_DAY})?\s*(?:of\s+)?([^\W\d_]+)\.?\s*({_DAY})?", re.IGNORECASE)


@memoize(16_384)
def date_key(value: str) -> str | None:
    """A date's month and day as ``"MM-DD"`` whatever its format ("2024-05-20", "May
    20th", "20 maja", "05/20/2024"), so a date the user wrote links to the same date in
    a tool result; ``None`` when ``value`` is no date or its month is unknown. For
    ``a/b/y`` the day is taken as the number above 12 when there is one, else
    month first (US)."""
    m = _ISO.match(value)
    if m:
        return f"{m.group(2)}-{m.group(3)}"
    m = _NUMERIC.fullmatch(value)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        mm, dd = (b, a) if a > 12 >= b else (a, b)
        return f"{mm:02d}-{dd:02d}" if 1 <= mm <= 12 and 1 <= dd <= 31 else None
    m = _WRITTEN.match(value.strip())
    if not m:
        return None
    word = m.group(2).lower()
    month: int | None = 7 if word.startswith("juil") else _MONTH_NUMBER.get(word[:3])
    day_text = m.group(1) or m.group(3)
    if month is None or not day_text:
        return None
    day = int(re.match(r"\d+", day_text).group(0))  # type: ignore[union-attr]
    return f"{month:02d}-{day:02d}" if 1 <= day <= 31 else None
