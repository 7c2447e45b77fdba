"""Extraction's faster scans give what the plain scan gives, value for value.

:func:`plain_text_values` is the scan as it was written before the shortcuts: every
pattern of :data:`PATTERNS` tried with ``finditer`` behind its plain prefilter, then
the capitalised-word loop visiting every capital word. The shortcuts (the early return
on prose with nothing to find, the prefilters computed in one pass, the currency and
camelCase tests, codes found from their capital, written dates tried only near a month
name, the name loop visiting title-case words only) must give the same values, the
same categories, in the same order.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.memory import entities as E
from ctxwarden.memory import entity_patterns as P
from ctxwarden.memory import entity_rank
from ctxwarden.memory.entity_patterns import CAPITAL_WORDS, NEEDS, PATTERNS, date_key, has_currency

_CAMEL_PLAIN = re.compile(r"[a-z][A-Z]")
_NEEDS_DIGIT = frozenset({"date", "time", "amount", "quantity", "number"})


def _may_match(
    category: str, pattern: re.Pattern[str], text: str, digits: bool, upper: bool
) -> bool:
    if category in _NEEDS_DIGIT:
        need = NEEDS.get(category)
        return digits and (need is None or need.search(text) is not None)
    if category == "date-written":
        return digits and any(P.is_month(w) for w in P.LETTER_RUN.findall(text))
    if category == "path":
        return "/" in text or "\\" in text
    if category == "url":
        return "://" in text
    if category == "email":
        return "@" in text
    if pattern is PATTERNS[2][1]:
        return "-" in text and NEEDS["uuid"].search(text) is not None
    if category == "id":
        return digits or upper
    if category == "identifier":
        return (
            "_" in text
            or E._DOTTED.search(text) is not None
            or _CAMEL_PLAIN.search(text) is not None
        )
    return True


def plain_text_values(text: str) -> dict[str, str]:
    text = E._bounded(text)
    out: dict[str, str] = {}
    claimed = bytearray(len(text))

    def take(start: int, end: int, value: str, category: str) -> None:
        if claimed.find(1, start, end) >= 0:
            return
        claimed[start:end] = b"\x01" * (end - start)
        value = E._clean(value)
        if value and value not in out:
            out[value] = category

    shouting: bool | None = None
    digits = E._DIGIT.search(text) is not None
    upper = not text.islower()
    for category, pattern in PATTERNS:
        if not _may_match(category, pattern, text, digits, upper):
            continue
        for m in pattern.finditer(text):
            value = m.group(0)
            if category == "date-written":
                category_out = "date"
            elif category == "identifier":
                if len(value) < 4:
                    continue
                category_out = E._identifier_category(value)
            elif category == "id":
                if E._is_id(value.lstrip("#")):
                    category_out = "id"
                elif (
                    not any(map(str.isdigit, value))
                    and len(value) >= 3
                    and value.isupper()
                    and value not in E._CODE_SKIP
                ):
                    if shouting is None:
                        letters = E._LETTERS.findall(text)
                        shouting = (
                            len(letters) > 24 and sum(map(str.isupper, letters)) > len(letters) // 2
                        )
                    if shouting:
                        continue
                    category_out = "code"
                else:
                    continue
            else:
                category_out = category
            if category == "email":
                local = value.split("@", 1)[0]
                if E._is_id(local):
                    out.setdefault(local, "id")
            take(m.start(), m.end(), value, category_out)
    run: list[tuple[int, int]] = []
    words = [*(m.span(1) for m in E._CAPITAL_WORD.finditer(text)), None] if upper else []
    for w in words:
        title = w is not None and E._is_title(text[w[0] : w[1]]) and claimed.find(1, *w) < 0
        joined = not run or (w is not None and text[run[-1][1] : w[0]] in (" ", "\u00a0"))
        if w is not None and title and joined:
            run.append(w)
            continue
        while run:
            at_start = E._SENTENCE_END.search(text[: run[0][0]]) is not None
            if E._skipped_name_word(text[run[0][0] : run[0][1]]) or (at_start and len(run) == 1):
                run = run[1:]
                continue
            break
        after = run[-1][1] if run else 0
        heading = bool(run) and text[after : after + 16].lstrip(" *_0-9").startswith(":")
        if run and not heading:
            take(run[0][0], run[-1][1], text[run[0][0] : run[-1][1]], "name")
        run = [w] if w is not None and title else []
    return out


_PIECES = [
    *"0123456789-/.:,%# \u00a0\n\t_@$€£¥₴°aAzZkKmpéÉßЖж²'’\"()[]*:;!?",
    *(
        "USD",
        "usd",
        "EUR",
        "dollars",
        "euro",
        "zł",
        "zl",
        "грн",
        "гривня",
        "руб",
        "кг",
        "12:30",
        "5 pm",
    ),
    *(
        "May",
        "may",
        "Mayo",
        "maja",
        "травня",
        "stycznia",
        "Sept.",
        "of",
        "3rd",
        "31st",
        "3-го",
        "ſep",
    ),
    *(
        "2024-05-20",
        "05/20/2024",
        "1,000",
        "€5",
        "50%",
        "5 kg",
        "-abcd-",
        "deadbeef-dead-beef-dead-beefdeadbeef",
    ),
    *(
        "Sofia Kim",
        "New York",
        "I",
        "I’m",
        "The",
        "Thanks",
        "iPhone",
        "McDonald",
        "O'Neil",
        "JFK",
        "NASA",
    ),
    *(
        "IDs",
        "OK",
        "HAT123",
        "mia_li_3668",
        "ZFA04Y",
        "np.linalg",
        "snake_case",
        "a.b",
        "setup.cfg",
    ),
    *(
        "https://a.b/c",
        "a@b.co",
        "mia_li_3668@x.com",
        "~/x.py",
        "C:\\x",
        "Total Cost:",
        "**Flight 1:**",
    ),
    *("hello", "world", "order", "the", "ÉTÉ", "Été", "ǅx", "Ⅷ", "a-B", "x-Y-z", "ABC-def"),
]
texts = st.lists(st.sampled_from(_PIECES), max_size=40).map("".join)
_DATE_PIECES = [
    *"0123 .,-x\n",
    "20",
    "3rd",
    "31st",
    "3-го",
    "of",
    "May",
    "maja",
    "Sept",
    "2024",
    "  ",
]
date_texts = st.lists(st.sampled_from(_DATE_PIECES), max_size=24).map("".join)
# a day, spaces, "of" and spaces before a month name: the farthest a written date starts
far_dates = st.from_regex(
    r"(?:x|5|\.| )?(?:[12]\d|3[01]|0?[1-9])(?:st|-го|\.)? {1,3}(?:of {1,3})?(?:May|maja)"
)
# lower-case prose with a few signs: what the early return and the prefilters decide on
_PROSE_PIECES = [
    *"abcxyz .,-_/\\@:;'",
    "the",
    "order",
    "a.b",
    "-abcd-",
    "deadbeef-dead-beef-dead-beefdeadbeef",
]
prose = st.lists(st.sampled_from(_PROSE_PIECES), max_size=30).map("".join)


@settings(max_examples=2000, deadline=None)
@given(texts)
def test_the_scan_gives_the_plain_scans_values_in_its_order(text: str) -> None:
    assert list(E._text_values(text).items()) == list(plain_text_values(text).items())


@settings(max_examples=1000, deadline=None)
@given(st.one_of(prose, date_texts))
def test_the_scan_gives_the_plain_scans_values_on_prose_and_dates(text: str) -> None:
    assert list(E._text_values(text).items()) == list(plain_text_values(text).items())


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_the_scan_equals_the_plain_scan_on_any_characters(text: str) -> None:
    assert list(E._text_values(text).items()) == list(plain_text_values(text).items())


@settings(max_examples=1500, deadline=None)
@given(texts)
def test_the_currency_test_is_the_currency_prefilter(text: str) -> None:
    assert has_currency(text) == (NEEDS["amount"].search(text) is not None)


@settings(max_examples=1500, deadline=None)
@given(texts)
def test_codes_from_their_capital_are_the_id_patterns_matches_without_digits(text: str) -> None:
    text = re.sub(r"[#\d]", "", text)  # CAPITAL_WORDS stands for the id pattern only there
    plain = [m.span() for m in PATTERNS[10][1].finditer(text)]
    assert [m.span() for m in CAPITAL_WORDS.finditer(text)] == plain


@settings(max_examples=1500, deadline=None)
@given(st.one_of(texts, date_texts, far_dates))
def test_written_dates_tried_near_month_names_are_all_written_dates(text: str) -> None:
    plain = [m.span() for m in PATTERNS[4][1].finditer(text)]
    assert [m.span() for m in P.written_dates(text)] == plain


@settings(max_examples=600, deadline=None)
@given(st.one_of(texts, st.text(alphabet="aAbZ _1.\n-", max_size=80)))
def test_shouting_counts_capitals_as_the_plain_count(text: str) -> None:
    letters = E._LETTERS.findall(text)
    plain = len(letters) > 24 and sum(map(str.isupper, letters)) > len(letters) // 2
    assert E._shouting(text) == plain


@settings(max_examples=600, deadline=None)
@given(texts)
def test_the_camel_case_test_finds_what_the_plain_one_finds(text: str) -> None:
    assert (E._CAMEL.search(text) is None) == (_CAMEL_PLAIN.search(text) is None)


@settings(max_examples=600, deadline=None)
@given(texts, st.sampled_from(["date", "name", "id", "value", "code", ""]))
def test_match_keys_are_the_plain_keys(value: str, category: str) -> None:
    keys = [value.casefold()]
    if category == "date" and date_key(value):
        keys.append(f"date:{date_key(value)}")
    elif category == "name" and " " in value:
        keys += [w.casefold() for w in value.split() if len(w) > 1]
    assert entity_rank.match_keys(value, category) == tuple(keys)


@settings(max_examples=600, deadline=None)
@given(st.one_of(texts, st.text(max_size=12)))
def test_short_values_are_categorised_as_by_the_plain_scan(value: str) -> None:
    """What a JSON value's category is read from: the scan of the value alone."""
    found = plain_text_values(value)
    only = list(found.items())
    plain = only[0][1] if len(only) == 1 and only[0][0] == E._clean(value) else "value"
    assert E._category_by_text.__wrapped__(value) == plain


@settings(max_examples=600, deadline=None)
@given(st.one_of(texts, st.text(alphabet="aZ09.-@_ é", max_size=12)))
def test_a_values_category_is_the_category_of_its_scan(value: str) -> None:
    """_category_of's shortcuts (letter-free shapes, e-mails) answer as the scan does."""
    assert E._category_of(value) == E._category_by_text(value)


_NUMBER_PIECES = [
    *"0123456789-.,:/ %\u00a0xaAmMpP",
    "12:30",
    "5 pm",
    "3.11",
    "2024-05-20",
    "1,000",
    "kg",
    "°C",
    "-5",
]
number_texts = st.lists(st.sampled_from(_NUMBER_PIECES), max_size=30).map("".join)


@settings(max_examples=1500, deadline=None)
@given(st.one_of(texts, number_texts))
def test_patterns_tried_where_a_number_starts_find_all_their_matches(text: str) -> None:
    starts = [m.start() for m in P.NUMBER_START.finditer(text)]
    for category, pattern in PATTERNS:
        if category in P.FROM_A_DIGIT:
            plain = [m.span() for m in pattern.finditer(text)]
            assert [m.span() for m in P.matches_from(pattern, text, starts)] == plain, category


def test_an_entity_built_in_its_dict_is_the_dataclasss_instance() -> None:
    import copy
    import dataclasses
    import pickle

    made = E._entity("ZFA04Y", "reservation_id", "m3", "id", "tool")
    plain = E.Entity("ZFA04Y", "reservation_id", "m3", "id", "tool")
    assert made == plain and hash(made) == hash(plain) and repr(made) == repr(plain)
    assert vars(made) == vars(plain) and list(vars(made)) == list(vars(plain))
    assert dataclasses.asdict(made) == dataclasses.asdict(plain)
    assert dataclasses.replace(made, origin="user") == plain
    assert pickle.loads(pickle.dumps(made)) == plain and copy.copy(made) == plain
    try:
        made.value = "other"  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("an entity must stay frozen")
