"""Entity extraction and the entity ledger, on unit samples and on the tau-bench airline data."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.formats import messages_from_openai
from ctxwarden.memory.entities import (
    Entity,
    extract_entities,
    extract_from_json,
    extract_from_text,
)
from ctxwarden.memory.entity_ledger import EntityLedger, rank
from ctxwarden_bench.traces import json_leaves

count = TokenCounter.for_model("gpt-4o").count_text


def found(text: str) -> dict[str, str]:
    """value -> category of a text's entities."""
    return {e.value: e.category for e in extract_from_text(text)}


# -- categories, English -------------------------------------------------------------------------


def test_ids_and_codes() -> None:
    got = found(
        "User mia_li_3668 paid with credit_card_7815826 for HAT123; booking ZFA04Y, order #W1234, "
        "trace 123e4567-e89b-12d3-a456-426614174000 from the LAX desk. It was my 2nd try."
    )
    for value in ("mia_li_3668", "credit_card_7815826", "HAT123", "ZFA04Y", "#W1234"):
        assert got[value] == "id"
    assert got["123e4567-e89b-12d3-a456-426614174000"] == "id"
    assert got["LAX"] == "code"
    assert "2nd" not in got and "User" not in got  # ordinals and sentence starts are not values


def test_emails_urls_and_paths() -> None:
    got = found(
        "Write to yara_garcia_1905@example.com, see https://example.com/docs?page=2. "
        "The log is /var/log/app.log, the config C:\\app\\conf.ini and src/ctxwarden/policy.py, "
        "and/or nothing else."
    )
    assert got["yara_garcia_1905@example.com"] == "email"
    assert got["yara_garcia_1905"] == "id"  # a user name in an email is often the account id
    assert got["https://example.com/docs?page=2"] == "url"
    for path in ("/var/log/app.log", "C:\\app\\conf.ini", "src/ctxwarden/policy.py"):
        assert got[path] == "path"
    assert "and/or" not in got


def test_a_relative_path_keeps_the_dots_it_starts_from() -> None:
    """``./runtests.py`` is not ``/runtests.py``: stripping a value's punctuation must not
    turn a relative path into an absolute one, in text, in a long JSON string (a shell
    command) or as a short JSON value; a sentence's full stop after it still goes."""
    got = found("Run ./runtests.py first, then ../tools/lint.sh. See (./docs/index.md).")
    assert got["./runtests.py"] == got["../tools/lint.sh"] == got["./docs/index.md"] == "path"
    assert not {"/runtests.py", "/tools/lint.sh", "/docs/index.md"} & got.keys()
    command = {"command": "cd tests && ./runtests.py staticfiles_tests.test_storage --verbosity 2"}
    assert "./runtests.py" in {e.value for e in extract_from_json(command)}
    assert [e.value for e in extract_from_json({"script": "../bin/run.py"})] == ["../bin/run.py"]
    assert "x.py" in found("It is in x.py.")  # not a relative path: the full stop goes


def test_dates_times_amounts_quantities_numbers() -> None:
    got = found(
        "Fly on May 20th or 2024-05-21T10:30:00, back 20 May 2024 / 05/27/2024 at 3:45 PM. "
        "It costs $1,234.56, or 20 EUR, plus 150 dollars; 2 bags of 23 kg, 15% off, seat 42."
    )
    for date in ("May 20th", "2024-05-21T10:30:00", "20 May 2024", "05/27/2024"):
        assert got[date] == "date"
    assert got["3:45 PM"] == "time"
    for amount in ("$1,234.56", "20 EUR", "150 dollars"):
        assert got[amount] == "amount"
    for quantity in ("2 bags", "23 kg", "15%"):
        assert got[quantity] == "quantity"
    assert got["42"] == "number"


def test_proper_names_not_at_sentence_start() -> None:
    got = found(
        "Thank you. Please book it for Mia Li and her father. Also add Noah. "
        "**Total Cost:** $300. Mr. John Smith flies from Denver. Houston is next."
    )
    assert got["Mia Li"] == "name" and got["Noah"] == "name" and got["Denver"] == "name"
    assert got["John Smith"] == "name"
    for not_a_name in ("Thank", "Please", "Also", "Houston", "Total Cost"):
        assert not_a_name not in got


def test_a_comment_opens_a_sentence() -> None:
    """The first word of a code comment (``# Determine ...``, ``// Sort ...``) or a
    Markdown heading is a sentence's first word, not a name: a tool result's source code
    had filled the ledger's names with them (``Determine Restore Return ... Save``)."""
    got = found(
        "    # Determine the paths first.\n    x = run(paths)  # Sort them by length\n"
        "    // Normalize the name here.\n# Overview\n    # ask the Django docs\n"
    )
    for not_a_name in ("Determine", "Sort", "Normalize", "Overview"):
        assert not_a_name not in got
    assert got["Django"] == "name"  # a name further on in a comment is still one


# -- other languages -----------------------------------------------------------------------------


def test_polish_sample() -> None:
    got = found(
        "Dzień dobry, nazywam się Anna Nowak. Moja rezerwacja to ZFA04Y, lot 20 maja 2024 "
        "o 14:30, kwota 1 250,50 zł, bagaż 23 kg. Pisz na anna.nowak@example.pl."
    )
    assert got["Anna Nowak"] == "name"
    assert got["ZFA04Y"] == "id"
    assert got["20 maja 2024"] == "date"
    assert got["14:30"] == "time"
    assert got["1 250,50 zł"] == "amount"
    assert got["23 kg"] == "quantity"
    assert got["anna.nowak@example.pl"] == "email"


def test_ukrainian_sample() -> None:
    got = found(
        "Добрий день! Мене звати Олена Шевченко, бронювання HAT001, виліт 20 травня о 14:30, "
        "сума 500 грн. Мій ідентифікатор olena_sh_4821, дата народження 1990-04-05."
    )
    assert got["Олена Шевченко"] == "name"
    assert got["HAT001"] == "id" and got["olena_sh_4821"] == "id"
    assert got["20 травня"] == "date" and got["1990-04-05"] == "date"
    assert got["14:30"] == "time"
    assert got["500 грн"] == "amount"
    assert "Добрий" not in got and "Мене" not in got


# -- JSON and messages ---------------------------------------------------------------------------

RESERVATION = {
    "reservation_id": "ZFA04Y",
    "user_id": "mia_li_3668",
    "flights": [{"flight_number": "HAT001", "date": "2024-05-20", "price": 523, "origin": "JFK"}],
    "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
    "payment_methods": {
        "credit_card_7815826": {"source": "credit_card", "id": "credit_card_7815826"}
    },
    "airports": {"SFO": "San Francisco"},
    "membership": "gold",
    "note": "Customer called on May 20th about reservation 3JA7XV and asked for a refund of $120.",
    "insurance": False,
}


def test_json_values_are_labelled_with_their_keys() -> None:
    got = {e.value: (e.label, e.category) for e in extract_from_json(RESERVATION, "t1")}
    assert got["ZFA04Y"] == ("reservation_id", "id")
    assert got["mia_li_3668"] == ("user_id", "id")
    assert got["HAT001"] == ("flight_number", "id")
    assert got["2024-05-20"] == ("flights.date", "date")
    assert got["523"] == ("price", "amount")
    assert got["Mia"][0] == "first_name" and got["Li"][0] == "last_name"
    assert got["credit_card_7815826"] == ("payment_methods", "id")  # an id used as a key
    assert got["SFO"] == ("airports", "code")
    assert got["San Francisco"][0] == "SFO"
    assert got["gold"] == ("membership", "value")
    assert got["3JA7XV"] == ("id", "id")  # long strings are scanned as text
    assert got["$120"] == ("amount", "amount")
    assert "False" not in got and "false" not in got


def test_extract_entities_reads_results_arguments_and_text_and_is_cached() -> None:
    call = ToolCall(
        "c1", "update_reservation", json.dumps({"reservation_id": "3JA7XV", "cabin": "economy"})
    )
    assistant = Message.assistant("Updating 3JA7XV for Mia Li now.", tool_calls=(call,), id="m3")
    result = Message.tool(json.dumps(RESERVATION), tool_call_id="c1", id="m4")
    got = {e.value: e for e in extract_entities(assistant)}
    assert got["3JA7XV"] == Entity("3JA7XV", "id", "m3", "id")  # text first, then arguments
    assert got["economy"].label == "cabin"
    assert {e.value for e in extract_entities(result)} >= {"ZFA04Y", "HAT001", "mia_li_3668"}
    assert all(e.source_id == "m4" for e in extract_entities(result))
    assert extract_entities(result) == extract_entities(result)
    same_text = Message.tool(json.dumps(RESERVATION), tool_call_id="c1", id="m9")
    assert {e.source_id for e in extract_entities(same_text)} == {"m9"}


# -- the ledger ----------------------------------------------------------------------------------


def e(value: str, label: str, category: str = "") -> Entity:
    return Entity(value, label, "m", category or label)


def test_ledger_dedupes_keeps_first_seen_order_and_renders_statements() -> None:
    ledger = EntityLedger().add(
        [e("ZFA04Y", "reservation_id", "id"), e("mia_li_3668", "user_id", "id")]
    )
    ledger2 = ledger.add([e("3JA7XV", "reservation_id", "id"), e("ZFA04Y", "reservation_id", "id")])
    assert len(ledger) == 2 and ledger2.values() == ["ZFA04Y", "mia_li_3668", "3JA7XV"]
    assert ledger2.render(1000, count) == (
        "Values from earlier messages:\nreservation_id: ZFA04Y 3JA7XV\nuser_id: mia_li_3668"
    )
    spaced = ledger2.add([e("New York", "city", "name"), e("Paris", "city", "name")])
    assert spaced.render(1000, count).endswith("city: New York, Paris")
    # re-seeing a value refreshes it without moving it: the rendered prefix stays stable
    assert ledger2.add([e("mia_li_3668", "user_id", "id")]).render(1000, count) == ledger2.render(
        1000, count
    )
    assert EntityLedger().render(1000, count) == ""
    assert ledger2.render(5, count) == ""  # not even the header fits


def test_ledger_branches_from_one_ancestor_do_not_mix() -> None:
    base = EntityLedger().add([e("A1", "id")])
    left = base.add([e("B2", "id")])
    right = base.add([e("C3", "id")])
    assert left.values() == ["A1", "B2"] and right.values() == ["A1", "C3"]
    assert right.add([e("B2", "id"), e("C3", "id")]).values() == ["A1", "C3", "B2"]
    assert base.add([e("A1", "id")]).values() == ["A1"]


def test_ledger_trims_low_value_and_old_entries_first() -> None:
    ledger = EntityLedger()
    ledger = ledger.add([e(str(1000 + i), "price", "number") for i in range(60)])
    ledger = ledger.add([e(f"OLD{i:03d}X", "reservation_id", "id") for i in range(30)])
    ledger = ledger.add([e(f"NEW{i:03d}X", "reservation_id", "id") for i in range(30)])
    full = ledger.render(10_000, count)
    assert "1059" in full and count(full) > 250
    text = ledger.render(120, count)
    assert count(text) <= 120
    assert "price" not in text  # plain numbers go first
    assert "NEW029X" in text and "OLD000X" not in text  # then the oldest ids
    assert text.startswith("Values from earlier messages:")


# -- the data test: identifiers used in tool calls are extracted where they were mentioned -------

ID_KEYS = ("user_id", "reservation_id", "flight_number", "payment_id")
SECONDARY_KEYS = ("date", "dob", "origin", "destination", "first_name", "last_name")


def tau_recall(path: Path) -> tuple[Counter[str], Counter[str]]:
    """Per key: (value, earlier message mentioning it) pairs, and how many were extracted."""
    mentions: Counter[str] = Counter()
    extracted: Counter[str] = Counter()
    for run in json.loads(path.read_text()):
        messages = messages_from_openai(run["traj"])
        texts = ["\n".join([m.text, *(c.arguments for c in m.tool_calls)]) for m in messages]
        seen: set[tuple[str, int]] = set()
        for j, message in enumerate(messages):
            for call in message.tool_calls:
                for key, value in json_leaves(call.parsed_arguments()):
                    if key not in ID_KEYS + SECONDARY_KEYS or not isinstance(value, str):
                        continue
                    whole = re.compile(rf"(?<!\w){re.escape(value)}(?!\w)")
                    for i in range(j):
                        if (value, i) in seen or not whole.search(texts[i]):
                            continue
                        seen.add((value, i))
                        values = [x.value for x in extract_entities(messages[i])]
                        # a first or last name counts when it is a word of an extracted name
                        hit = value in values or (
                            key.endswith("_name") and any(value in v.split() for v in values)
                        )
                        mentions[key] += 1
                        extracted[key] += hit
    return mentions, extracted


@pytest.mark.slow
def test_tau_bench_identifiers_are_extracted_from_the_messages_that_mention_them(
    tau_bench_path: Path,
) -> None:
    mentions, extracted = tau_recall(tau_bench_path)
    for key in ID_KEYS:
        assert mentions[key] > 50, key
    ids = sum(extracted[k] for k in ID_KEYS) / sum(mentions[k] for k in ID_KEYS)
    secondary = sum(extracted[k] for k in SECONDARY_KEYS) / sum(mentions[k] for k in SECONDARY_KEYS)
    assert ids >= 0.99
    assert secondary >= 0.95


# -- internals that must equal their simple definitions ------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ctxwarden.memory import entities as _entities  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(
                st.sampled_from(["A", "BB", "CCC", "DDDD", "E5E5", "May 20", "20 May", "mo"]),
                st.sampled_from(["id", "number", "date", "name"]),
            ),
            max_size=6,
        ),
        max_size=12,
    )
)
def test_ledger_keep_order_is_rank_then_recency(batches: list[list[tuple[str, str]]]) -> None:
    """The per-rank lists give the order of sorting by (rank, last seen), refreshes and
    user-stated matches included."""
    ledger = EntityLedger()
    origins = ("tool", "user", "assistant", "call")
    for n, batch in enumerate(batches):
        ledger = ledger.add(Entity(v, c, "m", c, origins[n % 4]) for v, c in batch)
    expected = sorted(
        range(len(ledger.entries)),
        key=lambda i: (
            -rank(*ledger.entries[i][2:3], *ledger.entries[i][6:8], len(ledger.entries[i].value)),
            -ledger.entries[i].last_seen,
        ),
    )
    assert list(ledger._keep_order()) == expected
    # (the ranks every add keeps are the entries' ranks, and a branch shares them)
    ranks = tuple(rank(e.category, e.hits, e.marks, len(e.value)) for e in ledger.entries)
    assert ledger._ranks == ranks and ledger.branch()._ranks == ranks
    assert EntityLedger.from_dict(ledger.to_dict()).render(50, count) == ledger.render(50, count)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=' .\n"(abcXY1:', max_size=200), st.integers(0, 200))
def test_sentence_start_window_equals_searching_the_whole_prefix(text: str, at: int) -> None:
    at = min(at, len(text))
    whole = _entities._SENTENCE_END.search(text[:at]) is not None
    assert _entities._at_sentence_start(text, at) == whole


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.from_regex(r"[a-z0-9_.+-]{1,8}@[a-z0-9-]{1,6}(\.[a-z]{1,4}){1,2}\.?", fullmatch=True),
        st.text(alphabet="0123456789.,:/-+$€% ", max_size=14),
    )
)
def test_category_fast_paths_equal_scanning_the_value(value: str) -> None:
    """E-mails and letter-free values skip the scan; the answer must be the scan's."""
    assert _entities._category_of(value) == _entities._category_by_text(value)


# -- general rules: code identifiers, date keys, bounded work, ranking ---------------------------

from ctxwarden.memory.entities import MAX_SCAN_CHARS, date_key  # noqa: E402
from ctxwarden.memory.entity_ledger import USER  # noqa: E402


def test_code_identifiers_and_file_names_by_shape() -> None:
    got = found(
        "Edit astropy/nddata/mixins/ndarithmetic.py: _arithmetic_mask(self, handle_mask) "
        "calls np.bitwise_or on NDDataRef; see setup.cfg, the one_way fare and parseArgs. "
        "It was fine."
    )
    assert got["astropy/nddata/mixins/ndarithmetic.py"] == "path"
    for ident in ("_arithmetic_mask", "handle_mask", "np.bitwise_or", "NDDataRef", "setup.cfg"):
        assert got[ident] == "identifier", ident
    assert got["one_way"] == "identifier" and got["parseArgs"] == "identifier"
    assert got["mia_li_3668" if "mia_li_3668" in got else "handle_mask"]  # ids stay ids:
    assert found("user mia_li_3668 here")["mia_li_3668"] == "id"
    assert "fine" not in got and "It" not in got


def test_date_key_links_one_date_in_any_format() -> None:
    same = ["2024-05-20", "May 20th", "20 May 2024", "May 20, 2024", "05/20/2024", "20.05.2024"]
    same += ["20 maja", "20 травня", "2024/05/20", "20 mai"]
    assert {date_key(v) for v in same} == {"05-20"}
    assert date_key("4 juillet") == "07-04" and date_key("June 4") == "06-04"
    assert date_key("Hello") is None and date_key("31/31/2024") is None


def test_extraction_is_bounded_on_any_shape() -> None:
    """Shapes that made the old patterns quadratic, a text past the scan cap, JSON nested
    10,000 deep: each extracts (their speed: python -m ctxwarden_bench.extraction)."""
    for shape in ("100 ", "a.", "a-", "1,000,", "Hello World ", "/a1", "x" * 300 + " "):
        assert isinstance(extract_from_text(shape * (200_000 // len(shape))), list)
    head, tail = "HAT001 " + "word " * 10, " LAST99 end"
    long = head + "filler " * (MAX_SCAN_CHARS // 7 + 10_000) + "MIDDLE7 " + "filler " * 5000 + tail
    values = {x.value for x in extract_from_text(long)}
    assert {"HAT001", "LAST99"} <= values and "MIDDLE7" not in values  # head + tail read
    deep: Any = {"user_id": "deep_user_1"}
    for i in range(10_000):
        deep = [deep] if i % 2 else {"level": deep}
    assert {x.value for x in extract_from_json(deep)} == {"deep_user_1"}
    nested = "[" * 10_000 + '"ABC123"' + "]" * 10_000
    assert "ABC123" in {x.value for x in extract_from_text(nested)}
    call = ToolCall("c", "f", '{"a":' * 5_000 + '"ZZ9X"' + "}" * 5_000)
    message = Message.assistant(None, (call,), id="deep-args")
    assert "ZZ9X" in {x.value for x in extract_entities(message)}  # too deep: read as text


def test_what_the_user_stated_and_the_agent_used_survives_pressure() -> None:
    def ent(value: str, label: str, category: str, origin: str) -> Entity:
        return Entity(value, label, "m", category, origin)

    ledger = EntityLedger().add(
        [ent("2024-05-27", "date", "date", "tool"), ent("Kim", "last_name", "value", "tool")]
        + [ent(f"HAT{i:03d}", "flight_number", "id", "tool") for i in range(60)]
        + [ent("src/app/core.py", "path", "path", "tool")]
    )
    ledger = ledger.add(
        [ent("May 27", "date", "date", "user"), ent("Sofia Kim", "n", "name", "user")]
    )
    ledger = ledger.add([ent("src/app/core.py", "command", "path", "call")])
    assert {"2024-05-27", "Kim", "May 27", "Sofia Kim"} <= set(ledger.stated())
    text = ledger.render(60, count)
    for kept in ("2024-05-27", "Kim", "May 27", "src/app/core.py"):
        assert kept in text, kept
    assert "HAT059" not in text  # ids seen once in a tool result give way first,
    assert "HAT000" in text  # the last ones a message listed first (read in order)
    # repeated values outrank single ones of the same category; plain numbers never do
    many = EntityLedger()
    for _ in range(4):
        many = many.add([ent("LAX", "origin", "code", "tool"), ent("12", "n", "number", "user")])
    many = many.add([ent(f"C{i}DE", "code", "code", "tool") for i in range(40)])
    top = [many.entries[i].value for i in many._keep_order()]
    assert top[0] == "LAX" and top[-1] == "12"
    assert many.entries[1].marks & USER


def test_ledgers_stored_before_ranking_still_load() -> None:
    old = {"entries": [["ZFA04Y", "reservation_id", "id", "m1", 1, 1]], "seq": 1}
    ledger = EntityLedger.from_dict(old)
    assert ledger.entries[0].hits == 1 and ledger.entries[0].marks == 0
    assert EntityLedger.from_dict(ledger.to_dict()) == ledger
    with pytest.raises(ValueError, match="6 or 8 fields"):
        EntityLedger.from_dict({"entries": [["x", "y"]], "seq": 1})


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["2024-05-27", "May 27", "Sofia Kim", "Sofia", "Kim", "JFK", "R0001X"]),
            st.sampled_from(["tool", "user", "assistant", "call"]),
        ),
        max_size=14,
    ),
    st.integers(1, 5),
)
def test_a_ledger_does_not_depend_on_how_its_values_were_batched(
    seen: list[tuple[str, str]], size: int
) -> None:
    """A session adds values message by message, a cold build range by range: the same
    values in the same order must rank and render alike (matches to what the user said
    included, whichever came first). Messages of up to three values, added whole."""
    cats = {"2024-05-27": "date", "May 27": "date", "Sofia Kim": "name", "JFK": "code"}
    ents = [Entity(v, "v", f"m{k // 3}", cats.get(v, "value"), o) for k, (v, o) in enumerate(seen)]
    whole = EntityLedger().add(ents)
    batched = EntityLedger()
    for at in range(0, len(ents), 3 * size):
        batched = batched.add(ents[at : at + 3 * size])
    assert batched.entries == whole.entries
    for cap in (12, 25, 200):
        assert batched.render(cap, count) == whole.render(cap, count)


def test_a_match_that_leaves_the_rank_unchanged_lists_the_value_once() -> None:
    """A value too short for a bonus ("Al", rank 0) or already at the top rank that
    matches what the user stated keeps one place in the ranking: it was listed twice."""
    ledger = EntityLedger().add(
        [Entity("Al", "first_name", "m1", "name", "tool"), Entity("R0001X", "id", "m1", "id")]
    )
    top = EntityLedger().add([Entity("Sofia Lee", "name", "m1", "name", o) for o in ("call",) * 5])
    top = top.add([Entity("Sofia Lee", "name", "m1", "name", "assistant")])
    for grown in (
        ledger.add([Entity("Al Smith", "name", "m2", "name", "user")]),
        top.add([Entity("Sofia", "first_name", "m2", "name", "user")]),
    ):
        order = list(grown._keep_order())
        assert sorted(order) == list(range(len(grown.entries)))
        lines = grown.render(200, count).splitlines()[1:]
        values = [v for line in lines for v in line.split(": ", 1)[1].split(", ")]
        assert sorted(values) == sorted(e.value for e in grown.entries)


def test_json_field_names_are_schema_and_name_keys_hold_names() -> None:
    """A key shaped like a field name (``address1``) is schema, not a value; an id used
    as a key still is one; a capitalised word under a ``*name`` key is a name."""
    doc = {
        "name": {"first_name": "Mia", "last_name": "Kim"},
        "address": {"address1": "681 Cedar Street", "line_2": "Suite 847"},
        "payment_methods": {"gift_card_7359776": {"amount": 39}},
        "username": "mia_kim_4397",
    }
    found = {e.value: e for e in extract_from_json(doc)}
    assert "address1" not in found and "line_2" not in found
    assert found["gift_card_7359776"].category == "id"
    assert found["Mia"].category == "name" and found["Kim"].category == "name"
    assert found["mia_kim_4397"].category == "id"
    text = "I’m not sure about the reservation IDs. I’m Sofia Kim, see the URLs."
    assert [e.value for e in extract_from_text(text)] == ["Sofia Kim"]


def test_what_only_the_agent_wrote_or_what_recurs_by_chance_ranks_lower() -> None:
    """Once tools are used, values only in the agent's prose (a label it wrote, a sum it
    computed) rank below the same kind of value a tool returned; numbers in its arithmetic mark
    nothing; a time or price seen in many records takes no repeat bonus. Paths and code
    identifiers the agent names are its plan and keep their rank."""

    def ent(value: str, category: str, origin: str) -> Entity:
        return Entity(value, category, "m", category, origin)

    chat = EntityLedger().add([ent("Total Cost", "name", "assistant"), ent("Oslo", "name", "user")])
    chat = chat.add([ent("Sofia Kim", "name", "user")])
    # no tool in the conversation: the assistant's words are first-hand (a chat partner's)
    assert rank("name", 1, chat.entries[0].marks) == rank("name", 1, 0) + 1
    seen = [
        ("Sofia Kim", "name", "tool"),
        ("Total Cost", "name", "assistant"),
        ("$1,625", "amount", "assistant"),
        ("$189", "amount", "tool"),
        ("src/app.py", "path", "assistant"),
        ("src/db.py", "path", "tool"),
        ("1859", "amount", "tool"),
        ("1860", "amount", "tool"),
    ]
    ledger = EntityLedger().add(ent(*x) for x in seen)
    ledger = ledger.add([ent("1859", "number", "call"), ent("1859", "number", "assistant")])
    for _ in range(4):
        ledger = ledger.add([ent("13:00:00", "time", "tool"), ent("$189", "amount", "tool")])
    by = {e.value: e for e in ledger.entries}

    def rank_of(value: str) -> int:
        e = by[value]
        return rank(e.category, e.hits, e.marks, len(e.value))

    assert rank_of("Total Cost") < rank_of("Sofia Kim")
    assert rank_of("$1,625") < rank_of("1860")
    assert rank_of("src/app.py") == rank_of("src/db.py") + 1  # the agent's own: a bonus
    assert rank_of("1859") == rank_of("1860")  # its arithmetic passed no value on
    assert rank_of("13:00:00") == rank(by["13:00:00"].category, 1, by["13:00:00"].marks)
    assert rank_of("$189") == rank_of("1860")


def test_a_ledger_with_room_for_part_of_a_list_keeps_its_first_values() -> None:
    """Within one tool result the values it lists first count as the most recent: a
    record's reservations cut to a few keep the first ones, which an agent works through
    first (tau-bench dev at 1,600 tokens: the next call asked for the first reservation
    of a user record, and the ledger showed the last three). A later message still comes
    before an earlier one; in prose the value stated last stays the most recent (the
    agent's "$1,625 - $1,327 = $298")."""

    def ent(value: str, source: str, origin: str = "tool") -> Entity:
        return Entity(value, "reservations", source, "id", origin)

    first = ["OWZ4XL", "F3IQK1", "8WMF4C", "L2H5FP"]
    ledger = EntityLedger().add([ent(v, "m5") for v in first])
    order = [ledger.entries[i].value for i in ledger._keep_order()]
    assert order == first
    text = ledger.render(count(ledger.render(10_000, count)) - 3, count)
    assert "OWZ4XL" in text and "L2H5FP" not in text  # rendered in first-seen order still
    later = ledger.add([ent("NEW001", "m7"), ent("NEW002", "m7")])
    order = [later.entries[i].value for i in later._keep_order()]
    assert order == ["NEW001", "NEW002", *first]
    assert later.seq == 6 and EntityLedger.from_dict(later.to_dict()).render(
        30, count
    ) == later.render(30, count)
    prose = EntityLedger().add([ent(v, "m9", "assistant") for v in ("$1,625", "$1,327", "$298")])
    order = [prose.entries[i].value for i in prose._keep_order()]
    assert order == ["$298", "$1,327", "$1,625"]


def test_the_fields_an_agent_passes_outrank_the_others_of_each_record() -> None:
    """A value whose JSON key labels a value the agent passed in a tool call ranks up (the
    agent working through records passes the same fields of each: tau-bench dev at 1,600
    tokens, the flight numbers and dates of the next reservation to change had given way
    to its passengers' birth dates). Marked whichever came first, the call or the value;
    a value found in free text (labelled by its category, not a key) takes no such mark."""
    from ctxwarden.memory.entity_rank import KIND

    def ent(value: str, label: str, category: str, source: str, origin: str = "tool") -> Entity:
        return Entity(value, label, source, category, origin)

    def record(n: int) -> list[Entity]:
        return [
            ent(f"HAT{n:03d}", "flight_number", "id", f"m{n}"),
            ent(f"2024-05-{n:02d}", "flights.date", "date", f"m{n}"),
            ent(f"19{n:02d}-01-01", "dob", "date", f"m{n}"),
            ent(f"2024-04-{n:02d}T10:00:00", "created_at", "date", f"m{n}"),
        ]

    records = [e for n in range(10, 16) for e in record(n)]
    call = [
        ent("HAT001", "flight_number", "id", "c1", "call"),
        ent("2024-05-01", "flights.date", "date", "c1", "call"),
    ]
    before, after = EntityLedger().add(records + call), EntityLedger().add(call + records)
    assert before.entries != after.entries  # (first-seen order differs)
    for ledger in (before, after):
        by = {e.value: e for e in ledger.entries}
        assert by["2024-05-12"].marks & KIND and by["HAT012"].marks & KIND
        assert not by["1912-01-01"].marks & KIND
        text = ledger.render(60, count)
        assert "2024-05-15" in text and "HAT015" in text and "1915-01-01" not in text
    plain = EntityLedger().add(records)  # no call: the dates rank alike, the newest first
    assert "1915-01-01" in plain.render(60, count)
    coding = EntityLedger().add(
        [ent("src/a.py", "path", "path", "m1"), ent("src/b.py", "path", "path", "c1", "call")]
    )
    assert not any(e.marks & KIND for e in coding.entries)


def test_ledgers_stored_before_kinds_were_marked_load_marked() -> None:
    """A session's ledger stored by an earlier version (calls marked, kinds not) loads
    as the same values grown now would be: ranked alike, rendered alike."""
    from ctxwarden.memory.entity_rank import KIND

    values = [
        Entity("HAT001", "flight_number", "m1", "id", "call"),
        *(Entity(f"HAT{n:03d}", "flight_number", "m2", "id", "tool") for n in range(2, 9)),
        *(Entity(f"19{n:02d}-01-01", "dob", "m2", "date", "tool") for n in range(2, 9)),
    ]
    now = EntityLedger().add(values)
    stored = now.to_dict()
    for row in stored["entries"]:
        row[7] &= ~KIND
    loaded = EntityLedger.from_dict(stored)
    assert loaded.entries == now.entries
    assert loaded.render(25, count) == now.render(25, count)


def test_markup_tags_are_not_values() -> None:
    """A harness wraps a tool's output and a task in tags (``<returncode>0</returncode>``,
    ``<output_head>``, ``<pr_description>``): a closing tag is no path and a tag's name no
    identifier (every coding result had put ``/returncode``, ``/output`` and ``output_head``
    in the ledger, repeated so often that they ranked first). What the tags wrap is read as
    before, and a comparison written without spaces still names its identifier."""
    text = (
        "<returncode>0</returncode>\n<output_head>\nfoo_bar = 1 in django/db/models.py and"
        " /testbed/x.py\n</output_head>\n<pr_description>Fix it</pr_description>\n"
        "if size<max_len: pass"
    )
    found = {e.value: e.category for e in extract_from_text(text)}
    for tag in ("/returncode", "/output_head", "/pr_description", "output_head", "pr_description"):
        assert tag not in found, tag
    assert found["django/db/models.py"] == "path" and found["/testbed/x.py"] == "path"
    assert found["foo_bar"] == "identifier" and found["max_len"] == "identifier"
