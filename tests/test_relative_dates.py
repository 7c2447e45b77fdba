"""Relative times in a dated chat get the date they mean (ctxwarden.memory.relative_dates)."""

from __future__ import annotations

from ctxwarden.core.messages import Message
from ctxwarden.llm.offline import OfflineSummarizer
from ctxwarden.memory.relative_dates import dated, stamp_date

STAMP = "[1:56 pm on 8 May, 2023]"  # a Monday


def test_each_relative_time_gets_the_date_it_means() -> None:
    assert dated("I went to a support group yesterday.", STAMP) == (
        "I went to a support group yesterday [7 May, 2023]."
    )
    assert dated("I painted it last year!", STAMP) == "I painted it last year [2022]!"
    assert dated("I first watched it around 3 years ago.", STAMP) == (
        "I first watched it around 3 years ago [2020]."
    )
    assert dated("I joined a group last week.", STAMP) == (
        "I joined a group last week [the week before 8 May, 2023]."
    )
    assert dated("We met last Saturday, see you next Friday", STAMP) == (
        "We met last Saturday [6 May, 2023], see you next Friday [12 May, 2023]"
    )
    assert dated("Lost my job last month.", "[January 5, 2023]") == (
        "Lost my job last month [December 2022]."
    )
    assert dated("It shipped two days ago", "[2024-03-01]") == (
        "It shipped two days ago [28 February, 2024]"
    )


def test_no_date_no_change() -> None:
    assert dated("I went there yesterday.", None) == "I went there yesterday."
    assert dated("I went there yesterday.", "[session 4]") == "I went there yesterday."
    assert dated("I went there a few days ago.", STAMP) == "I went there a few days ago."
    assert dated("Nothing relative here.", STAMP) == "Nothing relative here."
    assert stamp_date("[31 February, 2023]") is None


def test_the_offline_summary_dates_what_it_quotes() -> None:
    msgs = [
        Message.user(STAMP, id="d1"),
        Message.user("Caroline: I went to a support group yesterday.", id="a1"),
        Message.assistant("Melanie: That is great!", id="b1"),
    ]
    text = OfflineSummarizer(max_tokens=500).summarize_sync(msgs).text
    assert "Caroline: I went to a support group yesterday [7 May, 2023]." in text.splitlines()
    assert STAMP in text.splitlines()
