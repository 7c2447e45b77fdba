"""The shortcuts extraction and the ledger take for speed give what the plain way gives.

Each shortcut (a prefilter that skips a pattern, capitalised words found without a
look-behind scan, a ledger that checks only the entries a new statement can match, a
pruned ledger that keeps its ranking, the look-back ledger memo of cold builds, a side
branch kept on its ledger, a whole-token test by ``str.find``) is checked against the
plain computation it replaces.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.memory import entities, entity_ledger
from ctxwarden.memory.entities import Entity
from ctxwarden.memory.entity_ledger import EntityLedger
from ctxwarden.memory.entity_patterns import NEEDS, PATTERNS
from ctxwarden.pipeline.engine import build_context
from ctxwarden.steps.ledger import Shown, ledger_of, shows_whole

count = TokenCounter.for_model("gpt-4o").count_text

_PIECES = [
    *"0123456789-/.:,% \u00a0\u202f\n\t_#@$€£¥₴₽₹°aApPmMkKgBhdxF'’ÉßΣЖ²",
    *("USD", "usd", "dollars", "euro", "zł", "грн", "гривня", "кг", "May", "12:30", "5 pm"),
    *("3 p.m.", "1,000", "1 000", "€5", "50%", "5 kg", "20°C", "2024-05-20", "05/20/2024"),
    *("-abcd-", "123e4567-e89b-12d3-a456-426614174000", "Sofia Kim", "iPhone", "O'Neil", "12Ab"),
]
texts = st.lists(st.sampled_from(_PIECES), max_size=30).map("".join)
_SURNAMES = [f"{a}{b}son" for a in "BCDFGHKLMNPRST" for b in "aeiou"][:120]
_BY_NAME = {"amount": 7, "date": 3, "time": 6, "quantity": 8, "uuid": 2}


@settings(max_examples=600, deadline=None)
@given(texts)
def test_a_pattern_matches_only_where_its_prefilter_finds_something(text: str) -> None:
    for name, at in _BY_NAME.items():
        if PATTERNS[at][1].search(text) is not None:
            assert NEEDS[name].search(text) is not None, (name, text)


@settings(max_examples=600, deadline=None)
@given(texts)
def test_capitalised_words_are_those_of_the_look_behind_pattern(text: str) -> None:
    plain = [m.span(1) for m in entities._CAPITAL_WORD.finditer(text)]
    assert entities._capital_words(text) == plain
    longer = [(a, b) for a, b in plain if b - a > 1]
    assert entities._capital_words(text, entities._CAPITAL_RUN_2) == longer


_VALUES = ["2024-05-27", "May 27", "Sofia Kim", "Sofia", "Kim", "JFK", "R0001X", "12", "ab"]
_CATS = {"2024-05-27": "date", "May 27": "date", "Sofia Kim": "name", "JFK": "code", "12": "number"}
batches = st.lists(
    st.lists(
        st.tuples(st.sampled_from(_VALUES), st.sampled_from(["tool", "user", "assistant", "call"])),
        max_size=8,
    ),
    max_size=10,
)


def _entities(batch: list[tuple[str, str]], i: int) -> list[Entity]:
    return [Entity(v, "v", f"m{i}", _CATS.get(v, "value"), o) for v, o in batch]


def _alike(a: EntityLedger, b: EntityLedger) -> None:
    assert a.to_dict() == b.to_dict()
    assert list(a._keep_order()) == list(b._keep_order())
    for cap in (10, 30, 300):
        assert a.render(cap, count) == b.render(cap, count)


@settings(max_examples=150, deadline=None)
@given(batches, st.lists(st.integers(0, 9), max_size=10))
def test_a_ledger_grown_from_shared_indexes_equals_one_grown_from_a_copy(
    seen: list[list[tuple[str, str]]], forks: list[int]
) -> None:
    """Ledgers share their value and match-key indexes with those grown from them; a
    side branch grown from an older ledger must equal a fresh copy grown alike, and the
    ledger of all its values in one add (matches to what the user stated included)."""
    kept: list[tuple[EntityLedger, list[Entity]]] = [(EntityLedger(), [])]
    for i, batch in enumerate(seen):
        base, values = kept[forks[i] % len(kept)] if i < len(forks) else kept[-1]
        grown = base.add(_entities(batch, i))
        _alike(grown, EntityLedger.from_dict(base.to_dict()).add(_entities(batch, i)))
        values = values + _entities(batch, i)
        _alike(grown, EntityLedger().add(values))
        kept.append((grown, values))


@settings(max_examples=100, deadline=None)
@given(batches)
def test_a_pruned_ledger_ranks_as_one_built_from_its_entries(
    seen: list[list[tuple[str, str]]],
) -> None:
    saved = entity_ledger.MAX_ENTRIES
    entity_ledger.MAX_ENTRIES = 4
    try:
        ledger = EntityLedger()
        for i, batch in enumerate(seen):
            ledger = ledger.add(_entities(batch, i))
            _alike(ledger, EntityLedger(ledger.entries, ledger.seq))
            assert ledger._ranks == EntityLedger(ledger.entries, ledger.seq)._ranks  # kept
            if sum(map(len, ledger._tiers)) == len(ledger):  # no stale pairs: as if ranked anew
                assert ledger._tiers == EntityLedger(ledger.entries, ledger.seq)._tiers
    finally:
        entity_ledger.MAX_ENTRIES = saved


def _chat(n: int) -> list[Message]:
    out = [Message.system("You book flights.")]
    for i in range(n):
        out.append(Message.user(f"Change reservation R{i:04d}X to May {i % 28 + 1}, 2024."))
        out.append(Message.assistant(f"Done: R{i:04d}X now flies on 2024-05-{i % 28 + 1:02d}."))
    return out


def test_the_look_back_ledger_memo_changes_no_output_and_shares_no_index() -> None:
    history = _chat(80)
    first = build_context(history, "gpt-4o", 400)
    again = build_context(history, "gpt-4o", 400)  # the memo's ledger this time
    assert again.to_openai() == first.to_openai()
    assert again.state.to_dict() == first.state.to_dict()
    a, b = ledger_of(history[1:60]), ledger_of(history[1:60])
    assert a is not b and a.to_dict() == b.to_dict()
    grown = a.add([Entity("ZZ9999", "id", "x", "id", "user")])
    other = b.add([Entity("QQ1234", "id", "y", "id", "tool")])
    assert grown.values()[-1] == "ZZ9999" and "ZZ9999" not in other.values()
    assert other.values()[-1] == "QQ1234" and "QQ1234" not in grown.values()
    plain = EntityLedger().add([e for m in history[1:60] for e in entities.extract_entities(m)])
    _alike(ledger_of(history[1:60]), plain)


def _binary_search(
    ledger: EntityLedger,
    order: list[int],
    steps: object,
    tokens: int,
    max_tokens: int,
    counter: object,
) -> tuple[list[int], str, int]:
    """The plain search the ledger's render used: the longest prefix that fits, by halves."""
    lo, hi, best, text, tokens = 1, len(order) - 1, 0, "", 0
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = ledger._render(order[:mid])
        n = count(candidate)
        if n <= max_tokens:
            best, lo, text, tokens = mid, mid + 1, candidate, n
        else:
            hi = mid - 1
    return order[:best], text, tokens


def test_the_longest_fitting_prefix_is_the_one_a_binary_search_finds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a name with a space makes its line comma-separated: the estimate of every one-word
    # value on that line is a comma short, so renders search for the prefix that fits
    from ctxwarden_bench.traffic import agent_traffic

    found = [e for m in islice(agent_traffic(3), 400) for e in entities.extract_entities(m)]
    spaced = [
        Entity(f"{first} {last}", "name", f"s{i}", "name", "user")
        for i, (first, last) in enumerate(
            zip(["Sofia", "Mia", "Ada"] * 4, _SURNAMES[:12], strict=True)
        )
    ]
    spaced += [Entity(last, "name", f"w{i}", "name", "user") for i, last in enumerate(_SURNAMES)]
    ledger = EntityLedger().add([*found, *spaced])
    searched = 0
    fast = EntityLedger._most_that_fit

    def counted(self: EntityLedger, *args: Any) -> tuple[list[int], str, int]:
        nonlocal searched
        searched += 1
        return fast(self, *args)

    for cap in range(8, 700, 9):
        monkeypatch.setattr(EntityLedger, "_most_that_fit", counted)
        got = ledger._fit(cap, count)
        monkeypatch.setattr(EntityLedger, "_most_that_fit", _binary_search)
        assert got == ledger._fit(cap, count), cap
        assert got[2] <= cap and got[2] == count(got[1])
    assert searched >= 10, searched  # the estimate was short for many caps: the search ran


_WORDY = st.text(alphabet="ab_1 .-/:éß٣Ж\n", max_size=40)


@settings(max_examples=800, deadline=None)
@given(_WORDY, st.text(alphabet="ab_1 .-/:éß٣Ж", min_size=1, max_size=5))
def test_a_whole_token_is_what_the_look_around_pattern_finds(text: str, value: str) -> None:
    """``shows_whole`` and ``Shown`` (its answers kept) answer as the regex they replace,
    letters and digits of any script counting as word characters."""
    import re

    want = re.search(r"(?<!\w)" + re.escape(value) + r"(?!\w)", text) is not None
    assert shows_whole(value, text) is want
    shown = Shown([Message.system(text)])
    assert shown(value) is want and shown(value) is want  # (the second from its memo)


def test_a_side_branch_is_grown_once_and_from_a_kept_branch_of_its_first_messages() -> None:
    base = EntityLedger().add([Entity("R0001X", "id", "m1", "id", "tool")])
    by_message = {
        "m7": [Entity("2024-05-20", "date", "m7", "date", "tool")],
        "m9": [
            Entity("Sofia Kim", "name", "m9", "name", "user"),
            Entity("12", "n", "m9", "number", "tool"),
        ],
    }
    asked: list[tuple[str, ...]] = []

    def values(parts: tuple[str, ...]):  # type: ignore[no-untyped-def]
        def of(done: int) -> list[Entity]:
            asked.append(parts[done:])
            return [e for p in parts[done:] for e in by_message[p]]

        return of

    one = base.grown(("m7",), values(("m7",)))
    assert base.grown(("m7",), values(("m7",))) is one and asked == [("m7",)]
    two = base.grown(("m7", "m9"), values(("m7", "m9")))
    assert asked[-1] == ("m9",)  # grown from the branch kept for m7
    _alike(two, base.branch().add([*by_message["m7"], *by_message["m9"]]))
    _alike(one, base.branch().add(by_message["m7"]))  # (the kept branch is as it was)
    assert [e.value for e in base.entries] == ["R0001X"]  # so is the ledger they grew from
    for k in range(entity_ledger._GROWN_KEPT):  # the oldest branch goes when more are kept
        base.grown((f"other{k}",), lambda done: by_message["m7"])
    assert base.grown(("m7",), values(("m7",))) is not one and asked[-1] == ("m7",)


@settings(max_examples=300, deadline=None)
@given(batches, st.lists(st.integers(1, 4), max_size=10))
def test_a_ledger_over_its_cap_keeps_the_same_values_however_its_messages_are_added(
    seen: list[list[tuple[str, str]]], splits: list[int]
) -> None:
    """Pruning happens after the message whose values took the ledger over its cap, so
    an open session (a few messages per add, as the window moves) and a replica (all of
    them in one add) hold the same ledger: the same values, ranks and renders."""
    values = [Entity(f"{v}-{i}" if o == "tool" else v, "v", f"m{i}", _CATS.get(v, "value"), o)
              for i, batch in enumerate(seen) for v, o in batch]  # fmt: skip
    saved = entity_ledger.MAX_ENTRIES
    entity_ledger.MAX_ENTRIES = 6
    try:
        at, stepwise, messages = 0, EntityLedger(), [b for b in range(len(seen)) if seen[b]]
        for n in splits or [len(messages)]:
            chunk = {f"m{b}" for b in messages[at : at + n]}
            stepwise = stepwise.add([e for e in values if e.source_id in chunk])
            at += n
        rest = {f"m{b}" for b in messages[at:]}
        stepwise = stepwise.add([e for e in values if e.source_id in rest])
        _alike(stepwise, EntityLedger().add(values))
    finally:
        entity_ledger.MAX_ENTRIES = saved


@settings(max_examples=300, deadline=None)
@given(
    batches,
    st.integers(0, 40),
    st.sets(st.sampled_from(_VALUES)),
    st.sets(st.sampled_from([f"m{i}" for i in range(10)])),
)
def test_whether_a_render_gives_a_block_is_known_without_rendering_it(
    seen: list[list[tuple[str, str]]], max_tokens: int, shown: set[str], placed: set[str]
) -> None:
    """``shows_any`` (a compaction asks it before rendering the values a kept ledger block
    does not show) answers as ``render`` does, at caps down to a value or none."""
    ledger = EntityLedger().add([e for i, b in enumerate(seen) for e in _entities(b, i)])
    skip = shown.__contains__ if shown else None
    got = ledger.shows_any(max_tokens, count, frozenset(placed), skip)
    assert got == bool(ledger.render(max_tokens, count, frozenset(placed), skip))


def test_handles_that_would_displace_every_value_leave_the_values_as_they_were() -> None:
    """A handle may take the place of the lowest-ranked values, never of all of them: a
    block of handles without a value is no block (it rendered as nothing, and the values
    that fit were lost with it)."""
    made = [("2024-05-27", "tool"), ("May 27", "assistant"), ("Sofia Kim", "assistant")]
    ledger = EntityLedger().add(_entities(made, 0))
    skip = {"2024-05-27"}.__contains__
    text = ledger.render(15, count, frozenset(), skip)
    assert text.splitlines()[1:] == ["v: May 27, Sofia Kim"]
    assert ledger.shows_any(15, count, frozenset(), skip)
