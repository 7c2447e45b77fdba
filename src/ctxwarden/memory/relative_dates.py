"""Relative times in a dated conversation, given the dates they mean (issue 39, R8).

A chat whose messages follow a timestamp line (``[1:56 pm on 8 May, 2023]``) says
"yesterday", "last week" or "three years ago" relative to that line. Quoted alone in a
summary, months later, such a sentence no longer says when: the question "when did she
go?" needs the date the speaker meant. :func:`dated` adds it after the expression, in
brackets, from the timestamp in force (``yesterday [7 May, 2023]``), and leaves the words
said as they were. A timestamp it cannot read as a calendar date leaves the sentence as
it is.
"""

from __future__ import annotations

import re
from datetime import date, timedelta

__all__ = ["dated", "stamp_date"]

_MONTHS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
_MONTH = r"(?:" + "|".join(m[:3] + r"[a-z]*\.?" for m in _MONTHS) + r")"
_DAY_MONTH_YEAR = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)? ({_MONTH}),? (\d{{4}})\b", re.I)
_MONTH_DAY_YEAR = re.compile(rf"\b({_MONTH}) (\d{{1,2}})(?:st|nd|rd|th)?,? (\d{{4}})\b", re.I)
_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_NUMBERS = {
    w: n
    for n, w in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
        ]
    )
}
_COUNT = r"(\d{1,2}|" + "|".join(list(_NUMBERS)[1:]) + r"|a|an|a couple of|a few)"
_RELATIVE = re.compile(
    r"\b(?:(yesterday|tomorrow)"
    r"|(last|next) (week|weekend|month|year|" + "|".join(_WEEKDAYS) + r")"
    rf"|(?:about |around )?{_COUNT} (day|week|month|year)s? ago)\b",
    re.I,
)


def _month(name: str) -> int:
    return next(i for i, m in enumerate(_MONTHS, 1) if m.startswith(name[:3].lower()))


def stamp_date(stamp: str | None) -> date | None:
    """The calendar date a timestamp line names, if it names one."""
    if not stamp:
        return None
    try:
        if hit := _DAY_MONTH_YEAR.search(stamp):
            return date(int(hit.group(3)), _month(hit.group(2)), int(hit.group(1)))
        if hit := _MONTH_DAY_YEAR.search(stamp):
            return date(int(hit.group(3)), _month(hit.group(1)), int(hit.group(2)))
        if hit := _ISO.search(stamp):
            return date(int(hit.group(1)), int(hit.group(2)), int(hit.group(3)))
    except ValueError:  # "31 February": not a date
        return None
    return None


def _day(d: date) -> str:
    return f"{d.day} {_MONTHS[d.month - 1].capitalize()}, {d.year}"


def _month_of(year: int, month: int) -> str:
    year, month = year + (month - 1) // 12, (month - 1) % 12 + 1
    return f"{_MONTHS[month - 1].capitalize()} {year}"


def _count(word: str) -> int | None:
    word = word.lower()
    if word.isdigit():
        return int(word)
    if word in ("a", "an"):
        return 1
    if word in ("a couple of",):
        return 2
    return _NUMBERS.get(word)  # "a few": no number


def _meaning(hit: re.Match[str], on: date) -> str | None:
    one, direction, unit, count, ago = hit.groups()
    if one:
        return _day(on + timedelta(days=-1 if one.lower() == "yesterday" else 1))
    if direction:
        sign, unit = (-1 if direction.lower() == "last" else 1), unit.lower()
        if unit in _WEEKDAYS:
            shift = (on.weekday() - _WEEKDAYS.index(unit)) % 7 or 7
            return _day(
                on - timedelta(days=shift) if sign < 0 else on + timedelta(days=(7 - shift) or 7)
            )
        if unit in ("week", "weekend"):
            return f"the {unit} {'before' if sign < 0 else 'after'} {_day(on)}"
        if unit == "month":
            return _month_of(on.year, on.month + sign)
        return str(on.year + sign)
    n = _count(count)
    if n is None:
        return None
    ago = ago.lower()
    if ago == "year":
        return str(on.year - n)
    if ago == "month":
        return _month_of(on.year, on.month - n)
    if ago == "week":
        return f"the week of {_day(on - timedelta(weeks=n))}"
    return _day(on - timedelta(days=n))


def dated(sentence: str, stamp: str | None) -> str:
    """``sentence`` with the date each relative time in it means after the timestamp
    ``stamp`` added in brackets; ``sentence`` itself when there is none or no date."""
    on = stamp_date(stamp)
    if on is None or _RELATIVE.search(sentence) is None:
        return sentence

    def add(hit: re.Match[str]) -> str:
        meant = _meaning(hit, on)
        return f"{hit.group(0)} [{meant}]" if meant else hit.group(0)

    return _RELATIVE.sub(add, sentence)
