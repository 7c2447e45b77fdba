"""Rolling summarisation: triggers, the cut point, the two-tier state, the cycle."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.core.errors import ConfigError, SummarizationError
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.pairing import group_blocks
from ctxwarden.core.registry.usage import Usage
from ctxwarden.llm.offline import OfflineSummarizer, RuleBasedFactExtractor
from ctxwarden.memory.facts import Facts
from ctxwarden.memory.summaries import (
    QueryAwareSummarizer,
    SummaryResult,
    SummaryState,
    SummaryTrigger,
    plan_summary,
    summarize_cycle,
    summary_view,
)


def chat(n: int, *, system: bool = True) -> list[Message]:
    """``n`` alternating user/assistant messages after a system prompt, ids m0, m1, …"""
    msgs = [Message.system("You are a shop assistant.", id="sys")] if system else []
    for i in range(n):
        if i % 2 == 0:
            msgs.append(Message.user(f"user says {i}", id=f"m{i}"))
        else:
            msgs.append(Message.assistant(f"assistant says {i}", id=f"m{i}"))
    return msgs


def ones(_: Message) -> int:
    return 10


COUNT_ONLY = SummaryTrigger(max_messages=30, keep_recent=15, fill_ratio=None)


def test_count_trigger_30_15_folds_the_oldest_and_keeps_15() -> None:
    assert plan_summary(chat(30), COUNT_ONLY, ones) is None  # "more than 30"
    plan = plan_summary(chat(31), COUNT_ONLY, ones)
    assert plan is not None
    assert [m.id for m in plan.fold] == [f"m{i}" for i in range(16)]
    assert plan.keep[0].id == "sys"  # the system prompt is never folded
    assert [m.id for m in plan.keep[1:]] == [f"m{i}" for i in range(16, 31)]
    assert "31 unsummarised messages > 30" in plan.reasons[0]


def test_covered_messages_do_not_count_again() -> None:
    msgs = chat(31)
    plan = plan_summary(msgs, COUNT_ONLY, ones)
    assert plan is not None
    state = SummaryState().apply(plan, "summary one")
    assert plan_summary(msgs, COUNT_ONLY, ones, previous=state) is None
    more = chat(47)  # 15 kept + 16 new = 31 unsummarised
    again = plan_summary(more, COUNT_ONLY, ones, previous=state)
    assert again is not None
    assert again.fold[0].id == "m16" and len(again.fold) == 16


def test_token_trigger_counts_unsummarised_tokens() -> None:
    trigger = SummaryTrigger(max_messages=None, max_tokens=200, keep_recent=4, fill_ratio=None)
    assert plan_summary(chat(20), trigger, ones) is None  # exactly 200 tokens
    plan = plan_summary(chat(21), trigger, ones)
    assert plan is not None and "210 tokens > 200" in plan.reasons[0]
    assert len([m for m in plan.keep if m.role != "system"]) == 4


def test_keep_recent_tokens_caps_a_heavy_tail() -> None:
    msgs = chat(21)
    heavy = {"m18", "m19"}
    trigger = SummaryTrigger(
        max_messages=20, keep_recent=10, keep_recent_tokens=500, fill_ratio=None
    )
    plan = plan_summary(msgs, trigger, lambda m: 400 if m.id in heavy else 10)
    assert plan is not None
    assert [m.id for m in plan.keep if m.role != "system"] == ["m19", "m20"]


def test_fill_ratio_trigger_at_60_percent_of_the_window() -> None:
    trigger = SummaryTrigger(max_messages=None, fill_ratio=0.6, keep_recent=4)
    msgs = chat(9)  # system + 9 messages = 100 tokens
    assert plan_summary(msgs, trigger, ones, window=170) is None  # 59 %
    plan = plan_summary(msgs, trigger, ones, window=166)  # 60.2 %
    assert plan is not None and "fills 60%" in plan.reasons[0]
    with pytest.raises(ConfigError, match="window"):
        plan_summary(msgs, trigger, ones)


def test_every_10_user_turns_counted_from_the_last_summary() -> None:
    trigger = SummaryTrigger(max_messages=None, fill_ratio=None, every_user_turns=10, keep_recent=2)
    assert plan_summary(chat(18), trigger, ones) is None  # 9 user turns
    msgs = chat(19)  # the 10th user turn
    plan = plan_summary(msgs, trigger, ones)
    assert plan is not None and msgs[-1] in plan.keep  # the newest user message stays
    state = SummaryState().apply(plan, "s")
    assert plan_summary(chat(37), trigger, ones, previous=state) is None  # 9 new turns
    assert plan_summary(chat(39), trigger, ones, previous=state) is not None


def test_triggers_combine_any_fires() -> None:
    trigger = SummaryTrigger(max_messages=100, max_tokens=50, keep_recent=2, fill_ratio=None)
    plan = plan_summary(chat(6), trigger, ones)
    assert plan is not None and len(plan.reasons) == 1 and "tokens" in plan.reasons[0]


def test_the_newest_user_message_is_never_folded() -> None:
    msgs = [*chat(31), *[Message.assistant(f"more {i}", id=f"a{i}") for i in range(5)]]
    trigger = SummaryTrigger(max_messages=30, keep_recent=0, fill_ratio=None)
    plan = plan_summary(msgs, trigger, ones)
    assert plan is not None
    assert plan.keep[1].id == "m30" and plan.keep[1].role == "user"


def test_pinned_messages_are_not_summarised() -> None:
    msgs = chat(32)  # the pinned message does not count: 31 unsummarised
    msgs[1] = Message.user("my goal: buy a jacket", id="m0", pinned=True)
    plan = plan_summary(msgs, COUNT_ONLY, ones)
    assert plan is not None
    assert "m0" not in {m.id for m in plan.fold} and plan.keep[1].id == "m0"


def tool_chat() -> list[Message]:
    """A conversation where a tool call with two results straddles the natural cut."""
    msgs = chat(14)
    call = Message.assistant(
        tool_calls=(ToolCall("c1", "search", "{}"), ToolCall("c2", "stock", "{}")), id="call"
    )
    msgs += [
        call,
        Message.tool("found 3 jackets", "c1", id="r1"),
        Message.tool("in stock", "c2", id="r2"),
    ]
    msgs += [Message.user(f"u{i}", id=f"t{i}") for i in range(3)]
    return msgs


def test_the_cut_never_splits_a_tool_call_from_its_results() -> None:
    msgs = tool_chat()
    ids = [m.id for m in msgs]
    trigger = SummaryTrigger(max_messages=10, keep_recent=5, fill_ratio=None)
    plan = plan_summary(msgs, trigger, ones)
    assert plan is not None
    # keep_recent=5 would cut between r1 and r2; the cut moves back to the call
    assert plan.cut == ids.index("call")
    assert {"call", "r1", "r2"} <= {m.id for m in plan.keep}


@settings(max_examples=60, deadline=None)
@given(keep=st.integers(0, 12), extra=st.integers(0, 6))
def test_no_cut_separates_a_block(keep: int, extra: int) -> None:
    msgs = tool_chat()
    msgs += [Message.assistant(f"x{i}", id=f"x{i}") for i in range(extra)]
    trigger = SummaryTrigger(max_messages=keep + 1, keep_recent=keep, fill_ratio=None)
    plan = plan_summary(msgs, trigger, ones)
    if plan is None:
        return
    folded = {m.id for m in plan.fold}
    for block in group_blocks(msgs):
        inside = {m.id in folded for m in block.messages}
        assert len(inside) == 1, f"block at {block.start} split by cut {plan.cut}"
    assert not any(m.role == "system" for m in plan.fold)


def test_bad_trigger_configuration_is_named() -> None:
    with pytest.raises(ConfigError, match="keep_recent"):
        SummaryTrigger(max_messages=10, keep_recent=10)
    with pytest.raises(ConfigError, match="fill_ratio"):
        SummaryTrigger(fill_ratio=1.5)
    with pytest.raises(ConfigError, match="at least one"):
        SummaryTrigger(max_messages=None, fill_ratio=None)


def test_meta_summary_after_max_summaries_cycles() -> None:
    state = SummaryState()
    plan = plan_summary(chat(31), COUNT_ONLY, ones)
    assert plan is not None
    for i in range(3):
        state = state.apply(plan, f"level one {i}")
    assert not state.needs_meta(4) and state.text == "level one 2"
    state = state.apply(plan, "level one 3")
    assert state.needs_meta(4)
    state = state.with_meta("meta A")
    assert state.summaries == () and state.text == "meta A"
    state = state.apply(plan, "level one 4")
    assert state.text == "meta A\n\nlevel one 4" and state.version == 6


class Scripted:
    """A summariser that answers from a script and records what it was given."""

    def __init__(self, answers: Sequence[str | Exception]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, object]] = []

    def _next(self) -> SummaryResult:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return SummaryResult(answer, Usage(input_tokens=100, output_tokens=20))

    async def summarize(
        self, messages: Sequence[Message], previous: str | None = None
    ) -> SummaryResult:
        self.calls.append(("summarize", previous))
        return self._next()

    async def merge(self, summaries: Sequence[str]) -> SummaryResult:
        self.calls.append(("merge", list(summaries)))
        return self._next()


async def test_cycle_passes_the_previous_summary_and_cascades_to_meta() -> None:
    trigger = SummaryTrigger(max_messages=10, keep_recent=4, max_summaries=2, fill_ratio=None)
    script = Scripted(["S1", "S2", "META", "S3"])
    state, facts = SummaryState(), Facts()
    n = 11
    for _ in range(3):
        result = await summarize_cycle(
            chat(n), state=state, facts=facts, trigger=trigger, summarizer=script, count=ones
        )
        assert result.summarized and result.error is None
        state, facts = result.state, result.facts
        n += 7
    assert script.calls == [
        ("summarize", None),
        ("summarize", "S1"),
        ("merge", ["S2"]),
        ("summarize", None),
    ]
    assert state.text == "META\n\nS3"
    assert state.covered_count == 7 + 7 + 7


async def test_cycle_failure_keeps_everything() -> None:
    trigger = SummaryTrigger(max_messages=10, keep_recent=4, fill_ratio=None)
    state = SummaryState()
    for answer in (SummarizationError("model down"), "   "):
        result = await summarize_cycle(
            chat(11),
            state=state,
            facts=Facts(),
            trigger=trigger,
            summarizer=Scripted([answer]),
            count=ones,
        )
        assert result.error and not result.summarized
        assert result.state is state and result.plan is not None


async def test_cycle_with_offline_parts_extracts_facts_from_what_leaves() -> None:
    msgs = [Message.user("My budget is 1500 USD and I wear size L.", id="m0"), *chat(12)[2:]]
    trigger = SummaryTrigger(max_messages=10, keep_recent=4, fill_ratio=None)
    result = await summarize_cycle(
        msgs,
        state=SummaryState(),
        facts=Facts(),
        trigger=trigger,
        summarizer=OfflineSummarizer(),
        extractor=RuleBasedFactExtractor(),
        count=ones,
    )
    assert result.summarized
    assert result.facts.to_dict() == {"budget": "1500 USD", "size": "L"}
    assert "User: My budget is 1500 USD" in result.state.text


def test_summary_share_is_a_fraction() -> None:
    assert SummaryTrigger(summary_share=0.5).summary_share == 0.5
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ConfigError, match="summary_share"):
            SummaryTrigger(summary_share=bad)


class PlainSummarizer:
    """A summariser with no notion of the request (as a model-backed one may be)."""

    async def summarize(
        self, messages: Sequence[Message], previous: str | None = None
    ) -> SummaryResult:
        return SummaryResult("The user asked about jackets.")

    async def merge(self, summaries: Sequence[str]) -> SummaryResult:
        return SummaryResult(" ".join(summaries))


def test_summary_view_focuses_only_summarisers_that_can() -> None:
    stored = OfflineSummarizer(max_tokens=2000).summarize_sync(chat(40, system=False)).text
    assert not isinstance(PlainSummarizer(), QueryAwareSummarizer)
    assert summary_view(PlainSummarizer(), stored, "m7?", 50) == stored  # shown as written
    assert summary_view(OfflineSummarizer(), stored, "m7?", None) == stored  # no share: as is
    assert isinstance(OfflineSummarizer(), QueryAwareSummarizer)
    view = summary_view(OfflineSummarizer(), stored, "m7?", 50)
    assert view != stored and set(view.splitlines()) <= set(stored.splitlines())


def test_fill_ratio_counts_the_summary_as_shown_within_its_share() -> None:
    """A stored summary longer than its share is shown through a view of the share, so
    the fill trigger counts the share, not the store (or it would fire every build)."""
    stored = SummaryState(summaries=("x " * 2000,), covered_ids=frozenset({"m0", "m1"}))
    msgs = chat(6)

    def count(m: Message) -> int:
        return len(m.text.split())

    plain = SummaryTrigger(max_messages=None, keep_recent=2, fill_ratio=0.6)
    shared = SummaryTrigger(max_messages=None, keep_recent=2, fill_ratio=0.6, summary_share=0.25)
    assert plan_summary(msgs, shared, count, window=1000, previous=stored) is None
    assert plan_summary(msgs, shared, count, window=40, previous=stored) is not None
    # without a share the stored summary alone overfills: folding a few more messages
    # cannot help, so the trigger waits for half its threshold of new material
    assert plan_summary(msgs, plain, count, window=1000, previous=stored) is None
    long_chat = chat(400)
    assert plan_summary(long_chat, plain, count, window=1000, previous=stored) is not None


def test_the_fill_trigger_folds_in_batches_not_on_every_call() -> None:
    """After firing, the tail is folded down to half the threshold, so the next firing
    waits until half the threshold of new messages has come in."""

    def count(m: Message) -> int:
        return len(m.text.split())

    trigger = SummaryTrigger(max_messages=None, keep_recent=2, fill_ratio=0.6)
    # a system prompt that alone fills the threshold: the fill ratio is always reached
    msgs = [Message.system("rules " * 200, id="sys"), *chat(200, system=False)]
    state, fired = SummaryState(), []
    for end in range(10, len(msgs) + 1):
        plan = plan_summary(msgs[:end], trigger, count, window=300, previous=state)
        if plan is None:
            continue
        fired.append(end)
        assert len(plan.keep) <= 3  # the fixed part leaves no room: fold all but the newest
        state = SummaryState(
            summaries=("s",), covered_ids=state.covered_ids | {m.id for m in plan.fold}
        )
    gaps = [b - a for a, b in pairwise(fired)]
    assert fired and min(gaps) > 2  # batches of several messages, never call after call
