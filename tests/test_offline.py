"""The offline summariser and rule-based extractor, and facts that survive 60 turns."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.llm.offline import OfflineSummarizer, RuleBasedFactExtractor
from ctxwarden.memory.facts import Facts
from ctxwarden.memory.summaries import SummaryState, SummaryTrigger, summarize_cycle

COUNTER = TokenCounter.for_model("gpt-4o")

FILLER = [
    ("Do you have anything waterproof?", "Yes, the Nord Shell is waterproof to 10,000 mm."),
    ("What colours does it come in?", "Black, olive and navy."),
    ("How long is delivery to Lviv?", "Usually 2-3 business days with Nova Poshta."),
    ("Is there a warranty?", "All jackets carry a 24-month warranty."),
    ("Can I return it if it does not fit?", "Yes, within 14 days, unworn, with the tag."),
    ("Which one is warmer?", "The Arctic Parka is rated to -25 °C, the Nord Shell to -10 °C."),
    ("Any discounts this week?", "Code WINTER10 gives 10% off orders over 1000 USD."),
    ("Does the parka have a hood?", "Yes, a detachable hood with faux fur trim."),
]


def shop_conversation(turns: int = 60) -> list[Message]:
    """A support + shop chat: the critical facts come at turn 3, then ordinary talk."""
    msgs = [Message.system("You are the support and sales agent of a clothing shop.", id="sys")]
    for t in range(1, turns + 1):
        if t == 3:
            user = (
                "About my ticket TCK-48213: the jacket I got is too small. My budget is "
                "1500 USD and I need size L this time."
            )
            reply = "Thanks, I have linked ticket TCK-48213 and noted size L within 1500 USD."
        else:
            user, reply = FILLER[t % len(FILLER)]
            user = f"{user} (turn {t})"
        msgs.append(Message.user(user, id=f"u{t}"))
        msgs.append(Message.assistant(reply, id=f"a{t}"))
    return msgs


async def test_a_turn_3_fact_is_exact_at_turn_60_after_four_summary_cycles() -> None:
    msgs = shop_conversation(60)
    trigger = SummaryTrigger(max_messages=30, keep_recent=15, fill_ratio=None, max_summaries=4)
    summarizer = OfflineSummarizer(max_tokens=300, meta_max_tokens=500)
    state, facts = SummaryState(), Facts()
    texts: list[str] = []
    metas = 0
    for n in range(2, len(msgs) + 1):  # the agent's loop: one cycle check per new message
        result = await summarize_cycle(
            msgs[:n],
            state=state,
            facts=facts,
            trigger=trigger,
            summarizer=summarizer,
            extractor=RuleBasedFactExtractor(),
            count=COUNTER.count_message,
        )
        assert result.error is None
        if result.summarized:
            texts.append(result.state.text)
            metas += result.meta
        state, facts = result.state, result.facts

    assert len(texts) >= 4 and metas >= 1
    assert all(a != b for a, b in itertools.pairwise(texts))  # rewritten each cycle
    assert {"u3", "a3"} <= state.covered_ids  # turn 3 left the window long ago
    assert facts["budget"] == "1500 USD"
    assert facts["size"] == "L"
    assert facts["ticket_id"] == "TCK-48213"
    assert facts.source("size") == "u3"
    assert "size: L" in facts.render().splitlines()
    assert state.text.startswith("Summary (extractive, offline) of messages u1–")
    assert COUNTER.count_text(state.text) <= 500 + 300


def test_the_summary_is_honest_readable_and_bounded() -> None:
    msgs = shop_conversation(20)[1:]
    summary = OfflineSummarizer(max_tokens=150).summarize_sync(msgs).text
    lines = summary.splitlines()
    assert lines[0] == "Summary (extractive, offline) of messages u1–a20:"
    assert all(line.startswith(("User: ", "Assistant: ")) for line in lines[1:])
    assert COUNTER.count_text(summary) <= 150
    assert "TCK-48213" in summary  # the densest sentence is kept
    spoken = {m.text for m in msgs}
    for line in lines[1:]:  # every sentence was said by someone: nothing is invented
        body = line.split(": ", 1)[1]
        assert any(part.strip(" …") in text for text in spoken for part in body.split(". ")), line


def test_novelty_the_merged_summary_does_not_repeat_itself() -> None:
    s = OfflineSummarizer(max_tokens=200)
    first = s.summarize_sync(shop_conversation(4)[1:]).text
    again = s.summarize_sync(shop_conversation(4)[1:], previous=first).text
    assert again.count("TCK-48213 the jacket") <= 1
    assert again.count("My budget is 1500 USD") == 1


def test_speaker_prefixes_tool_results_and_errors() -> None:
    msgs = [
        Message.user("Caroline: I went to the LGBTQ support group on 7 May 2023.", id="m0"),
        Message.assistant(
            tool_calls=(ToolCall("c1", "get_order", '{"order_id": "A-8821"}'),), id="m1"
        ),
        Message.tool(
            json.dumps({"order_id": "A-8821", "status": "shipped", "items": [1]}),
            "c1",
            name="get_order",
            id="m2",
        ),
        Message.tool(
            'Traceback (most recent call last):\n  File "app/orders.py", line 142, in load\n'
            "    cart = repo.find(order_id)\nKeyError: 'A-8821'",
            "c2",
            id="m3",
        ),
    ]
    text = OfflineSummarizer().summarize_sync(msgs).text
    assert "Caroline: I went to the LGBTQ support group on 7 May 2023." in text
    assert 'Assistant: called get_order({"order_id": "A-8821"})' in text
    assert "Tool result (get_order): order_id: A-8821; status: shipped." in text
    assert "KeyError: 'A-8821'" in text


def test_merge_builds_a_bounded_meta_summary() -> None:
    s = OfflineSummarizer(max_tokens=200, meta_max_tokens=120)
    convo = shop_conversation(24)[1:]
    parts = [s.summarize_sync(convo[i : i + 12]).text for i in range(0, 48, 12)]
    meta = s.merge_sync(parts).text
    assert meta.startswith(
        "Summary (extractive, offline) of messages u1–a24, merged from 4 summaries:"
    )
    assert COUNTER.count_text(meta) <= 120
    assert "TCK-48213" in meta


def test_rule_based_extractor_generic_rules() -> None:
    ex = RuleBasedFactExtractor()
    assert ex.facts_in("Hi, my name is Olena Koval. Reservation no. RSV-2231 for 2024-05-03.") == {
        "name": "Olena Koval",
        "reservation_id": "RSV-2231",
        "date": "2024-05-03",
    }
    assert ex.facts_in("Please ship to Kyiv, Khreshchatyk 22 by Friday, olena@example.com") == {
        "delivery_address": "Kyiv, Khreshchatyk 22",
        "deadline": "Friday",
        "email": "olena@example.com",
    }
    assert ex.facts_in("I want a parka under €300") == {
        "need": "a parka under €300",
        "budget": "€300",
    }
    assert ex.facts_in("Thanks, that is all for today!") == {}


def test_rule_based_extractor_follows_a_schema_and_corrections() -> None:
    schema = {
        "properties": {
            "size": {"type": "string"},
            "colour": {"type": "string"},
            "budget": {"type": "number"},
        }
    }
    msgs = [
        Message.user("Colour: olive. Size L please, budget 1500 USD", id="m1"),
        Message.assistant("Your size is M? Noted colour: black.", id="m2"),  # not the user's word
        Message.user("Actually my size is XL.", id="m3"),
    ]
    facts = RuleBasedFactExtractor().extract_sync(msgs, Facts(), schema)
    assert facts.to_dict() == {"colour": "olive", "size": "XL"}  # "1500 USD" is no number
    assert [r.value for r in facts.history["size"]] == ["L", "XL"]


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("I need size L this time.", "L"),
        ("Size: M, please", "M"),
        ("my size is XL.", "XL"),
        ("size xxl if you have it", "xxl"),
        ("A size small would do", "small"),
        ("Shoes in size EU 42", "EU 42"),
        ("size 9.5 for the boots", "9.5"),
    ],
)
def test_size_rule_reads_standalone_sizes(text: str, size: str) -> None:
    ex = RuleBasedFactExtractor()
    assert ex.facts_in(text).get("size") == size
    assert ex.facts_in(text, ["size"]).get("size") == size  # a schema field reads the same


@pytest.mark.parametrize(
    "text",
    [
        "Check how Kestrel sizes run compared with other brands.",  # "size" + "s" is no size
        "Is it true that the sizes sold out?",
        "What size s… sorry, what sizes do you stock?",  # a lone lowercase s is no size
        "The size of the screen is 15 inches.",
    ],
)
def test_size_rule_ignores_words_that_only_look_like_sizes(text: str) -> None:
    assert "size" not in RuleBasedFactExtractor().facts_in(text)


def test_a_later_mention_of_sizes_does_not_overwrite_size_l() -> None:
    msgs = [
        Message.user("I need size L this time.", id="u1"),
        Message.user("Check how Kestrel sizes run compared with other brands.", id="u2"),
    ]
    facts = RuleBasedFactExtractor().extract_sync(msgs)
    assert facts["size"] == "L"
    assert len(facts.history["size"]) == 1


def locomo_transcript(conv: dict[str, object]) -> list[Message]:
    """The issue's transcript: per session a date line, then ``Speaker: text`` per turn."""
    msgs = [Message.system("You are a helpful assistant with a long memory.", id="sys")]
    first = conv["speaker_a"]
    n = 1
    while f"session_{n}" in conv:
        msgs.append(Message.user(f"[{conv[f'session_{n}_date_time']}]", id=f"s{n}"))
        for turn in conv[f"session_{n}"]:  # type: ignore[attr-defined]
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [shares a photo: {turn['blip_caption']}]"
            role = "user" if turn["speaker"] == first else "assistant"
            msgs.append(Message(role=role, content=text, id=turn["dia_id"]))
        n += 1
    return msgs


@pytest.fixture
def locomo_first(locomo_path: Path) -> list[Message]:
    return locomo_transcript(json.loads(locomo_path.read_text())[0]["conversation"])


async def test_locomo_conversation_is_summarised_fast(locomo_first: list[Message]) -> None:
    msgs = locomo_first
    assert len(msgs) > 400
    trigger = SummaryTrigger(max_messages=30, keep_recent=15, fill_ratio=None)
    state, facts = SummaryState(), Facts()
    start = time.perf_counter()
    for n in range(30, len(msgs) + 1, 5):
        result = await summarize_cycle(
            msgs[:n],
            state=state,
            facts=facts,
            trigger=trigger,
            summarizer=OfflineSummarizer(),
            extractor=RuleBasedFactExtractor(),
            count=COUNTER.count_message,
        )
        state, facts = result.state, result.facts
    elapsed = time.perf_counter() - start
    assert state.cycles >= 15 and state.meta_summary
    assert elapsed < 5.0, f"{elapsed:.1f}s"
    assert "Caroline: " in state.text or "Melanie: " in state.text


def diary() -> list[Message]:
    """Two dated sessions of chat; one plain sentence about a pottery class."""
    msgs = [Message.user("[1:56 pm on 8 May, 2023]", id="s1-date")]
    for i in range(12):
        msgs.append(
            Message.user(f"Caroline: We visited Museum {i} in Lviv on day {i}.", id=f"a{i}")
        )
        msgs.append(Message.assistant(f"Melanie: Gallery {i} had 30{i} paintings!", id=f"b{i}"))
    msgs.append(Message.user("[10:37 am on 27 June, 2023]", id="s2-date"))
    msgs.append(Message.user("Caroline: I signed up for a pottery class.", id="c1"))
    msgs.append(Message.assistant("Melanie: Ticket TCK-9 costs 45 USD on 3 July.", id="c2"))
    return msgs


def test_focus_shows_what_the_request_asks_about_within_the_budget() -> None:
    stored = OfflineSummarizer(max_tokens=2000).summarize_sync(diary()).text
    assert "pottery class" in stored
    plain = OfflineSummarizer().focus(stored, None, 120).text  # density alone
    focused = OfflineSummarizer().focus(stored, "When did Caroline take up pottery?", 120).text
    assert "pottery class" not in plain  # denser sentences win without a request
    assert "pottery class" in focused
    assert COUNTER.count_text(focused) <= 120
    lines = focused.splitlines()
    assert lines[0] == "Summary (extractive, offline) of messages s1-date–c2:"
    assert lines[lines.index("Caroline: I signed up for a pottery class.") - 1] == (
        "[10:37 am on 27 June, 2023]"  # the sentence stays dated
    )
    assert set(lines) <= set(stored.splitlines())  # a view: nothing rewritten
    assert OfflineSummarizer().focus(stored, "pottery", 5000).text == stored  # fits: as is


async def test_summarize_with_a_query_ranks_by_relevance_too() -> None:
    s = OfflineSummarizer(max_tokens=60)
    assert "pottery" not in (await s.summarize(diary())).text
    assert "pottery" in (await s.summarize(diary(), query="pottery class?")).text


def test_header_spans_ids_with_hyphens_and_colons() -> None:
    msgs = [
        Message.user("[8 May, 2023]", id="session_1-date"),
        Message.user("Caroline: I went to the LGBTQ support group on 7 May.", id="D1:3"),
        Message.assistant("Melanie: I painted a lake sunrise in 2022.", id="D1:12"),
    ]
    s = OfflineSummarizer(max_tokens=200)
    first = s.summarize_sync(msgs[:2]).text
    assert first.startswith("Summary (extractive, offline) of messages session_1-date–D1:3:\n")
    merged = s.summarize_sync(msgs[2:], previous=first).text
    assert merged.startswith("Summary (extractive, offline) of messages session_1-date–D1:12:\n")
    meta = s.merge_sync([first, merged]).text
    assert meta.startswith("Summary (extractive, offline) of messages session_1-date–D1:12, ")
