"""Counting a block by its lines (``TokenCounter.count_lines``): the same number as
counting it whole, on any text, for every encoding and estimate family.

The entity ledger is counted this way at every render (each try of a fit, every
compaction); a count that differed from ``count_text`` by one token would send a block
over its cap or change which values a build keeps, so the equality is checked here on
texts built to hit the cut points' edge cases (a newline before a space, a ``/`` or
punctuation; a space before a digit; non-ASCII letters and whitespace), not only on
ledger-shaped text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.core.tokens.chunked import line_pieces, word_pieces
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.core.tokens.encodings import get_encoding
from ctxwarden.memory.entities import extract_from_text
from ctxwarden.memory.entity_ledger import EntityLedger

# pieces of text around the cut points: newlines before whitespace, '/', punctuation
# (cl100k and o200k join a newline to the punctuation before it, o200k a '/' after it),
# spaces before digits and letters, contractions, non-ASCII letters and whitespace
_PARTS = st.sampled_from(
    [
        "a", "Zed", "x9", "2024-05-23", "007", " ", "  ", "\n", "\n\n", "\r\n", "\t",
        "/", "//", "src/app.py", ".", ")", "):", "'s", "'ll", ",", ", ", "\u00a0",
        "é", "日本", "Привет", "-", "_id", "#", "http://x.io/a", "\n/", "\n ", " \n",
        "path:", "label: ", "(cw:msg:m7)", "\"q\"", "$1,625",
    ]
)  # fmt: skip
_TEXTS = st.lists(_PARTS, max_size=40).map("".join)


@settings(max_examples=400, deadline=None)
@given(_TEXTS)
def test_the_pieces_of_a_text_count_what_the_text_counts(text: str) -> None:
    lines = line_pieces(text)
    words = [w for line in lines for w in word_pieces(line)]
    assert "".join(lines) == text and "".join(words) == text
    for name in ("o200k_base", "cl100k_base"):
        encode = get_encoding(name).encode_ordinary
        whole = len(encode(text))
        assert sum(len(encode(p)) for p in lines) == whole, (name, lines)
        assert sum(len(encode(p)) for p in words) == whole, (name, words)


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4", "claude-sonnet-4-5", "gemini-2.5-pro"])
@settings(max_examples=150, deadline=None)
@given(texts=st.lists(_TEXTS, min_size=1, max_size=6))
def test_count_lines_equals_count_text(model: str, texts: list[str]) -> None:
    # one counter across the texts, so later ones meet lines the earlier ones cached
    counter = TokenCounter(model)
    for text in texts:
        assert counter.count_lines(text) == TokenCounter(model).count_text(text)
        assert counter.count_lines(text) == counter.count_text(text)  # (cached, both ways)


def test_a_ledger_rendered_again_with_a_value_more_counts_what_its_text_counts() -> None:
    # the case the line counts are for: a long line of values with one more value, and
    # a render's text cached for the message count that follows it
    counter = TokenCounter("gpt-4o")
    text = " ".join(f"src/pkg/mod_{i}.py" for i in range(300)) + " 2024-05-23 The end."
    ledger = EntityLedger().add(extract_from_text(text, "m1", "tool"))
    first = ledger.render(600, counter.count_lines)
    grown = ledger.add(extract_from_text("and src/pkg/extra_module.py too", "m2", "tool"))
    second = grown.render(600, counter.count_lines)
    assert first != second and "\n" in second
    for rendered in (first, second):
        assert counter.count_lines(rendered) == TokenCounter("gpt-4o").count_text(rendered)
        assert counter.count_lines(rendered) <= 600


def test_the_line_counts_kept_are_bounded_in_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    # a proxy counts the blocks of many sessions with one counter: what it keeps of their
    # lines stays within its characters, and an evicted line is counted again the same
    from ctxwarden.core.tokens import counter as counter_module

    monkeypatch.setattr(counter_module, "_LINE_CACHE_CHARS", 20_000)
    counter = TokenCounter("gpt-4o")
    fresh = TokenCounter("gpt-4o")
    for n in range(40):
        text = "\n".join(
            f"label{k}: " + " ".join(f"v{n}x{k}y{j}" for j in range(60)) for k in range(4)
        )
        assert counter.count_lines(text) == fresh.count_text(text)
    assert 0 < counter._lines._weight <= 20_000


def test_the_text_counts_kept_are_bounded_in_characters() -> None:
    # recent texts up to 32 K characters each are kept counted (a draft counted twice);
    # 2,048 of them would be 64 M characters, so what is kept is bounded in characters too
    # (8 M), and a text counted again after it left counts the same
    counter, fresh = TokenCounter("gpt-4o"), TokenCounter("gpt-4o")
    texts = [f"result {n}: " + "token " * 5_000 for n in range(400)]  # ~30 K characters each
    counts = [counter.count_text(t) for t in texts]
    assert counts == [fresh.count_text(t) for t in texts]
    assert 7_000_000 < counter._texts._weight <= 8_000_000
    assert len(counter._texts._data) < len(texts)
    assert counter.count_text(texts[0]) == counts[0]  # evicted: counted again, the same
    lined = "\n".join(texts[1][k : k + 200] for k in range(0, 30_000, 200))
    assert counter.count_lines(lined) == fresh.count_text(lined)


@pytest.mark.parametrize("model", ["gpt-4o", "claude-sonnet-4-5"])
def test_lone_surrogates_count_the_same_by_lines(model: str) -> None:
    # a text from a client may hold a lone surrogate: the whole text and its lines are
    # both encoded with it replaced, so the counts agree
    counter = TokenCounter(model)
    for text in [
        "Values:\nid: a\ud800b c\nname: \ud83d\ude00 x",
        "h\n" + "x " * 300 + "\ud800 y\nq: 1",
    ]:
        assert counter.count_lines(text) == TokenCounter(model).count_text(text)
