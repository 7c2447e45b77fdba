"""build_context with a summariser: summary and facts layers, failure never loses a message."""

from __future__ import annotations

import json
from collections.abc import Sequence

from typer.testing import CliRunner

from ctxwarden.cli.main import app
from ctxwarden.core.errors import ProviderError
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.pairing import pairing_problems
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.formats.openai import message_to_openai
from ctxwarden.memory.summaries import SummaryResult, SummaryTrigger
from ctxwarden.pipeline.compaction import CacheConfig
from ctxwarden.pipeline.engine import BuiltContext, build_context
from ctxwarden.pipeline.policy import Policy


def shop_chat(turns: int) -> list[Message]:
    msgs = [Message.system("You are a clothing shop assistant.", id="sys")]
    msgs.append(Message.user("Hi! My budget is 1500 USD and I wear size L.", id="u0"))
    msgs.append(Message.assistant("Noted: budget 1500 USD, size L.", id="a0"))
    for t in range(1, turns):
        msgs.append(Message.user(f"Show me jacket model J-{t:03d} in another colour.", id=f"u{t}"))
        msgs.append(
            Message.assistant(
                f"Jacket J-{t:03d} comes in navy and olive; it costs {100 + t} USD.", id=f"a{t}"
            )
        )
    return msgs


def test_offline_summary_and_facts_layers_appear_and_facts_stay_exact() -> None:
    history = shop_chat(40)
    previous = None
    summaries = set()
    for end in range(10, len(history) + 1, 2):
        built = build_context(
            history[:end], "gpt-4o", 1200, summarizer="offline", previous=previous
        )
        previous = built
        assert built.input_tokens <= 1200
        assert pairing_problems(list(built.messages)) == []
        if built.audit.layers["summary"]:
            summaries.add(next(m.text for m in built.messages if m.id == "ctxwarden:summary"))
    facts = next(m.text for m in built.messages if m.id == "ctxwarden:facts")
    assert "1500" in facts and "L" in facts
    assert built.audit.layers["summary"] > 0 and built.audit.layers["facts"] > 0
    assert len(summaries) >= 2  # the summary was rewritten as the conversation went on
    assert (
        TokenCounter.for_model("gpt-4o").count_messages(built.messages).tokens == built.input_tokens
    )


class FailingSummarizer:
    async def summarize(
        self, messages: Sequence[Message], previous: str | None = None
    ) -> SummaryResult:
        raise ProviderError("upstream 500", status=500)

    async def merge(self, summaries: Sequence[str]) -> SummaryResult:
        raise ProviderError("upstream 500", status=500)


def test_failing_summarizer_keeps_every_message_and_says_so() -> None:
    history = shop_chat(40)
    built = build_context(history, "gpt-4o", 100_000, summarizer=FailingSummarizer())
    sent = [m.id for m in built.messages if not m.id.startswith("ctxwarden:")]
    assert sent == [m.id for m in history]
    assert any("summarisation failed" in w for w in built.audit.warnings)
    assert not built.audit.by_action("summarized")


def test_cli_build_with_offline_summarizer(tmp_path: object) -> None:
    transcript = json.dumps([message_to_openai(m) for m in shop_chat(40)])
    result = CliRunner().invoke(
        app,
        ["build", "-m", "gpt-4o", "-b", "900", "--summarizer", "offline", "-"],
        input=transcript,
    )
    assert result.exit_code == 0, result.output
    sent = json.loads(result.stdout)
    assert sent[0]["role"] == "system"
    assert any("Summary of the earlier conversation" in (m["content"] or "") for m in sent)


# -- the summary as the view for the newest user message (summary_share) ---------------------

TRIPS = [
    ("Lisbon", "tram 28", "pastel de nata"),
    ("Kyoto", "the bamboo grove", "matcha ice cream"),
    ("Reykjavik", "the Blue Lagoon", "fermented shark"),
    ("Lima", "the Larco museum", "ceviche"),
    ("Tbilisi", "the sulphur baths", "khachapuri"),
    ("Hanoi", "Ha Long Bay", "pho bo"),
    ("Oaxaca", "Monte Alban", "mole negro"),
    ("Tallinn", "the old town walls", "black bread"),
    ("Marrakesh", "the Majorelle garden", "tagine"),
    ("Quebec", "the Chateau Frontenac", "poutine"),
]


def travel_chat(rounds: int) -> list[Message]:
    """A long chat where each trip is told once: a question names one of them."""
    msgs = [Message.system("You are a travel diary assistant.", id="sys")]
    for r in range(rounds):
        city, sight, food = TRIPS[r % len(TRIPS)]
        year = 2010 + r
        msgs.append(
            Message.user(
                f"In {year} I went to {city}, visited {sight} with my cousin Dana and tried "
                f"{food} for the first time; trip number {r} cost {700 + 13 * r} USD.",
                id=f"u{r}",
            )
        )
        msgs.append(Message.assistant(f"Noted your {year} trip to {city}.", id=f"a{r}"))
    return msgs


SHARED = Policy(summary=SummaryTrigger(max_messages=16, keep_recent=6, summary_share=0.25))
RENEWED = Policy(
    summary=SummaryTrigger(max_messages=16, keep_recent=6, summary_share=0.25),
    cache=CacheConfig(hold_layers=False),
)
"""The layers renewed at every build: the summary view follows each request."""


def summary_of(built: BuiltContext) -> str:
    return next(m.text for m in built.messages if m.id == "ctxwarden:summary")


def grown(rounds: int, policy: Policy = SHARED, budget: int = 1200) -> BuiltContext:
    """The agent loop: one build per new message, each given the previous one."""
    history = travel_chat(rounds)
    built = None
    for end in range(2, len(history) + 1):
        built = build_context(
            history[:end], "gpt-4o", budget, summarizer="offline", policy=policy, previous=built
        )
    assert built is not None
    return built


def ask(after: BuiltContext, question: str, policy: Policy = SHARED) -> BuiltContext:
    history = [*travel_chat(40), Message.user(question, id="q")]
    return build_context(
        history, "gpt-4o", 1200, summarizer="offline", policy=policy, previous=after
    )


def test_the_summary_shown_is_the_view_for_the_newest_user_message_when_renewed() -> None:
    base = grown(40, RENEWED)
    stored = base.state.layers.summary.text
    counter = TokenCounter.for_model("gpt-4o")
    assert counter.count_text(stored) > 300  # the store holds more than the share shows
    lima = ask(base, "What did I eat in Lima?", RENEWED)
    kyoto = ask(base, "Who came with me to Kyoto?", RENEWED)
    for built in (lima, kyoto):
        assert built.audit.layers["summary"] <= 1200 // 4  # heading and framing included
        assert built.input_tokens <= 1200
        lines = summary_of(built).splitlines()
        assert lines[0] == "Summary of the earlier conversation:"
        assert lines[1].startswith("Summary (extractive, offline) of messages u0–")
        for line in lines[2:]:  # the stored sentences, none rewritten
            assert line.split(": ", 1)[-1] in stored, line
    assert "ceviche" in summary_of(lima) and "bamboo grove" in summary_of(kyoto)
    assert summary_of(lima) != summary_of(kyoto)
    again = ask(base, "What did I eat in Lima?", RENEWED)  # deterministic
    assert [m.fingerprint for m in again.messages] == [m.fingerprint for m in lima.messages]


def test_by_default_the_summary_is_held_and_each_question_finds_its_answer() -> None:
    """The summary block is sent again as it was (the prefix stays cached) and each
    question's answer is in the context, from the held view or the window. (At 1,200
    tokens the Kyoto answer is only in the view renewed for it: the held view's price.)"""
    base = grown(40, budget=1600)
    for question, answer in (
        ("What did I eat in Lima?", "ceviche"),
        ("Who came with me to Kyoto?", "bamboo grove"),
    ):
        history = [*travel_chat(40), Message.user(question, id="q")]
        built = build_context(
            history, "gpt-4o", 1600, summarizer="offline", policy=SHARED, previous=base
        )
        assert summary_of(built) == summary_of(base)  # the summary block as sent
        assert built.audit.prefix_break is None  # appended: the whole prefix cached
        assert any(answer in m.text for m in built.messages), question
        assert built.input_tokens <= 1600


def test_the_view_holds_while_the_request_does_not_change() -> None:
    """An agent's tool-call turns answer one user message: the summary layer, and so
    the prefix before the window, stays byte-identical."""
    base = grown(40)
    history = [*travel_chat(40), Message.user("What did I eat in Lima?", id="q")]
    first = build_context(
        history, "gpt-4o", 1200, summarizer="offline", policy=SHARED, previous=base
    )
    call = ToolCall("c1", "search_diary", '{"city": "Lima"}')
    history += [
        Message.assistant(None, tool_calls=(call,), id="t1"),
        Message.tool("Lima, 2013: ceviche at La Mar.", tool_call_id="c1", id="r1"),
    ]
    second = build_context(
        history, "gpt-4o", 1200, summarizer="offline", policy=SHARED, previous=first
    )
    assert summary_of(second) == summary_of(first)
    layers = ("system", "facts", "ledger", "summary")
    assert second.audit.prefix_shared_tokens >= sum(second.audit.layers[k] for k in layers)


def test_without_a_share_the_summary_is_shown_as_written() -> None:
    policy = Policy(summary=SummaryTrigger(max_messages=16, keep_recent=6))
    built = grown(40, policy, budget=4000)
    assert summary_of(built) == (
        "Summary of the earlier conversation:\n" + built.state.layers.summary.text
    )


def test_a_summariser_that_cannot_focus_is_shown_as_written_within_any_share() -> None:
    class Plain:
        async def summarize(
            self, messages: Sequence[Message], previous: str | None = None
        ) -> SummaryResult:
            return SummaryResult(f"The user told of {len(messages)} more messages' trips.")

        async def merge(self, summaries: Sequence[str]) -> SummaryResult:
            return SummaryResult(" ".join(summaries))

    history = [*travel_chat(40), Message.user("What did I eat in Lima?", id="q")]
    built = build_context(history, "gpt-4o", 1200, summarizer=Plain(), policy=SHARED)
    assert summary_of(built) == (
        "Summary of the earlier conversation:\n" + built.state.layers.summary.text
    )


def test_a_share_too_small_for_any_sentence_leaves_the_summary_out_and_says_so() -> None:
    tiny = Policy(summary=SummaryTrigger(max_messages=16, keep_recent=6, summary_share=0.01))
    built = grown(40, tiny)
    assert built.state.layers.summary.text  # stored, nothing lost
    assert all(m.id != "ctxwarden:summary" for m in built.messages)
    assert any("summary left out" in w for w in built.audit.warnings)


def test_a_cold_build_reports_each_folded_message_once() -> None:
    """What the summary folded is 'summarized', not also 'dropped' before the window."""
    history = shop_chat(60)
    built = build_context(history, "gpt-4o", 1200, summarizer="offline")
    summarized = built.audit.by_action("summarized")
    dropped = built.audit.by_action("dropped")
    assert summarized
    total = TokenCounter.for_model("gpt-4o").count_messages(history).tokens
    saved = sum(a.tokens_before for a in (*summarized, *dropped))
    assert saved <= total


# -- the facts layer changes only when a standing fact changes (prompt-cache prefix) ---------


def order_chat(turns: int, *, rest_at: int | None = None) -> list[Message]:
    """A support loop: the user names another order at every turn (one tool step each);
    the budget is stated once. At ``rest_at`` the user names no order."""
    msgs = [Message.system("You are the support agent of a web shop.", id="sys")]
    for t in range(turns):
        order = f"ORD-{1000 + t}"
        text = "Any news?" if t == rest_at else f"Where is my parcel? My order is {order}."
        if t == 0:
            text = f"My budget is 300 USD. {text}"
        call = ToolCall(f"c{t}", "get_order", json.dumps({"order_id": order}))
        msgs += [
            Message.user(text, id=f"u{t}"),
            Message.assistant(None, (call,), id=f"t{t}"),
            Message.tool(json.dumps({"order_id": order, "status": "shipped"}), f"c{t}", id=f"r{t}"),
            Message.assistant(f"Order {order} has shipped.", id=f"a{t}"),
        ]
    return msgs


def agent_loop(history: list[Message], policy: Policy | None = None) -> list[BuiltContext]:
    """One build at each model call (after a user message and after a tool result)."""
    builds: list[BuiltContext] = []
    for end, m in enumerate(history, start=1):
        if m.role in ("user", "tool"):
            previous = builds[-1] if builds else None
            builds.append(
                build_context(
                    history[:end],
                    "gpt-4o",
                    4000,
                    summarizer="offline",
                    previous=previous,
                    policy=policy,
                )
            )
    return builds


def facts_of(built: BuiltContext) -> str:
    return next((m.text for m in built.messages if m.id == "ctxwarden:facts"), "")


def test_a_fact_restated_at_every_user_turn_does_not_churn_the_facts_layer() -> None:
    history = order_chat(12)
    builds = agent_loop(history)
    layers = [facts_of(b) for b in builds]
    assert "budget: 300 USD" in layers[0] and "order_id: ORD-1000" in layers[0]
    # from the second order on the layer holds still: the order is the request's subject
    assert len(set(layers[2:])) == 1 and "order_id" not in layers[2]
    assert all("budget: 300 USD" in text for text in layers)
    for b in builds[3:]:  # the cached prefix reaches past the facts (summary cycles aside)
        assert b.audit.prefix_shared_tokens >= b.audit.layers["system"] + b.audit.layers["facts"]
    for t, b in enumerate(builds):  # the order the user named last is always in the context
        newest = f"ORD-{1000 + t // 2}"
        assert any(newest in m.text for m in b.messages if m.role == "user")
    facts = builds[-1].state.layers.facts
    assert [r.value for r in facts.history["order_id"]] == [f"ORD-{1000 + t}" for t in range(12)]


def test_a_restated_fact_shows_again_once_a_user_turn_leaves_it_alone() -> None:
    history = order_chat(8, rest_at=5)
    builds = agent_loop(history, Policy(cache=CacheConfig(hold_layers=False)))
    rest = facts_of(builds[2 * 5])  # the build for the user message naming no order
    assert "order_id: ORD-1004" in rest
    assert facts_of(builds[2 * 5 + 1]) == rest  # its tool step shares the layer
    assert "order_id" not in facts_of(builds[-1])  # changing at every turn again


def test_held_facts_never_show_a_replaced_value_and_the_newest_stays_in_the_context() -> None:
    """By default the facts block is held between compactions: a fact only added waits
    (its message is in the window), a replaced value is never shown as current."""
    history = order_chat(8, rest_at=5)
    builds = agent_loop(history)
    for t, b in enumerate(builds):
        turn = t // 2
        named = f"ORD-{1004 if turn == 5 else 1000 + turn}"  # turn 5 names no order
        facts = facts_of(b)
        assert "budget: 300 USD" in facts
        shown = [line for line in facts.splitlines() if line.startswith("order_id: ")]
        assert shown in ([], [f"order_id: {named}"]), (t, facts)  # never an older order
        assert any(named in m.text for m in b.messages), t


def test_a_correction_after_a_quiet_turn_shows_at_once() -> None:
    history = shop_chat(6)
    history.append(Message.user("Change of plan: my budget is 2000 USD now.", id="u-late"))
    built = build_context(history, "gpt-4o", 4000, summarizer="offline")
    assert "budget: 2000 USD" in facts_of(built)


def test_one_long_tool_result_does_not_fire_the_fill_trigger() -> None:
    """The fill ratio counts a long result as the cascade sends it (cut), not raw."""
    page = json.dumps({"results": [{"id": f"R{i:04d}", "note": "seat " * 30} for i in range(60)]})
    history = [
        Message.system("You are a booking agent.", id="sys"),
        Message.user("Find rooms in Lisbon", id="u0"),
        Message.assistant(None, (ToolCall("c0", "search", "{}"),), id="a0"),
        Message.tool(page, "c0", name="search", id="t0"),
        Message.assistant("I found 60 rooms.", id="a0r"),  # answered: the threshold applies
        Message.user("Which is cheapest?", id="u1"),
    ]
    counter = TokenCounter.for_model("gpt-4o")
    assert counter.count_messages(history).tokens > 0.6 * 4000  # raw, it would fire
    built = build_context(history, "gpt-4o", 4000, summarizer="offline")
    assert not built.audit.by_action("summarized")
    assert built.audit.by_action("truncated")
