"""The bench's scenario machinery: tables add up, Basic is the exact full history, the
scripted agent is deterministic, the baselines reproduce on real data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.pairing import pairing_problems
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden_bench.metrics import common_prefix_tokens, plain_window, reduction_table
from ctxwarden_bench.scenarios_agent_chat import run_agent_chat
from ctxwarden_bench.scenarios_laptop import (
    BUDGET_USD,
    QUESTIONS,
    SYSTEM_PROMPT,
    TOOLS,
    USE,
    catalogue,
    run_laptop,
    scripted_turns,
)
from ctxwarden_bench.traces import (
    answer_recall,
    load_tau_bench,
    plain_builder,
    tau_retention,
)


@pytest.fixture(scope="module")
def laptop() -> dict[str, object]:
    return run_laptop()


def test_scripted_agent_is_deterministic_and_calls_real_tools() -> None:
    first, second = scripted_turns(), scripted_turns()
    assert [m.fingerprint for t in first for m in (t.question, *t.tool_steps, t.answer)] == [
        m.fingerprint for t in second for m in (t.question, *t.tool_steps, t.answer)
    ]
    assert len(first) == len(QUESTIONS) == 21
    names = {p["name"] for p in catalogue()}
    for turn in first:
        for step in turn.tool_steps:
            for call in step.tool_calls:
                if call.name == "get_product_details":
                    assert call.parsed_arguments()["product_name"] in names
    # the user states budget and use early, in their own words
    assert f"${BUDGET_USD:,}" in first[1].question.text and USE in first[1].question.text


def test_basic_is_the_exact_full_history_each_turn(laptop: dict[str, object]) -> None:
    counter = TokenCounter.for_model("gpt-4o")
    history = [Message.system(SYSTEM_PROMPT, id="system")]
    expected = []
    for turn in scripted_turns():
        history += [turn.question, *turn.tool_steps]
        assert not pairing_problems(history)
        expected.append(counter.count_messages(history, TOOLS).tokens)
        history.append(turn.answer)
    runs = laptop["runs"]
    assert runs["Basic"].input_tokens_per_turn == expected  # type: ignore[index]


def test_tables_add_up(laptop: dict[str, object]) -> None:
    runs = laptop["runs"]
    for run in runs.values():  # type: ignore[attr-defined]
        assert run.total_input_tokens == sum(run.input_tokens_per_turn)
        assert run.effective_cost_usd <= run.cost_usd
        assert all(
            0 <= c <= t
            for c, t in zip(run.cached_tokens_per_turn, run.input_tokens_per_turn, strict=True)
        )
    table = laptop["table"]
    basic = runs["Basic"].input_tokens_per_turn  # type: ignore[index]
    for name, row in table.items():  # type: ignore[attr-defined]
        series = runs[name].input_tokens_per_turn  # type: ignore[index]
        for turn, cell in row.items():
            assert cell["tokens"] == series[turn - 1]
            assert cell["pct_of_baseline"] == pytest.approx(
                100 * series[turn - 1] / basic[turn - 1]
            )
            assert cell["reduction"] == pytest.approx(100 - cell["pct_of_baseline"])
    assert sorted(table["Basic"]) == [1, 10, 11, 20, 21]  # type: ignore[index]


def test_laptop_targets(laptop: dict[str, object]) -> None:
    table = laptop["table"]
    # Seed 003's target is 91%. The request right after a tool call keeps that call's
    # results (issue 11: turn 20 has three fresh product pages); since the summary view fills
    # what the rest leaves (issue 12), turn 20 sends 1,752 tokens: 92.0%.
    assert table["ctxwarden"][20]["reduction"] >= 91.0  # type: ignore[index]
    assert laptop["facts_held_each_turn_from_2"] is True
    # masking alone never touches the current turn, and summarising resets after turn 10
    assert table["Summarization"][11]["reduction"] > 80  # type: ignore[index]


def test_reduction_table_small_case() -> None:
    table = reduction_table({"Basic": [100, 200], "x": [50, 20]}, (1, 2), "Basic")
    assert table["x"][2] == {"tokens": 20, "pct_of_baseline": 10.0, "reduction": 90.0}


def test_common_prefix_counts_whole_identical_messages() -> None:
    counter = TokenCounter.for_model("gpt-4o")
    sys, u1, a1, u2 = (
        Message.system("rules", id="s"),
        Message.user("hi", id="u1"),
        Message.assistant("hello", id="a1"),
        Message.user("more", id="u2"),
    )
    same = common_prefix_tokens([sys, u1, a1], [sys, u1, a1, u2], counter, 7)
    assert same == 7 + sum(counter.count_message(m) for m in (sys, u1, a1))
    changed = common_prefix_tokens([sys, u1.with_content("HI")], [sys, u1], counter, 0)
    assert changed == counter.count_message(sys)
    assert common_prefix_tokens([u1], [sys], counter, 7) == 0


def test_plain_window_is_pair_safe_and_skips_blocks_that_do_not_fit() -> None:
    call = ToolCall("c1", "lookup", "{}")
    msgs = [
        Message.system("s", id="s"),
        Message.user("old question", id="u0"),
        Message.assistant(None, (call,), id="a"),
        Message.tool("x" * 50, "c1", id="t"),
        Message.user("new", id="u1"),
    ]
    counts = [10, 5, 8, 60, 5]
    kept, used = plain_window(msgs, counts, 3 + 10 + 5 + 5 + 2)
    assert kept == [0, 1, 4]  # the call block is too big, the older user message fits
    assert used == 3 + 10 + 5 + 5
    kept, _ = plain_window(msgs, counts, 1000)
    assert kept == [0, 1, 2, 3, 4]


def test_answer_recall_gives_no_pair_credit_to_a_bag_of_words() -> None:
    words = {"7", "may", "2023"}
    assert answer_recall("7 May 2023", words, {("7", "may"), ("may", "2023")}) == 1.0
    assert answer_recall("7 May 2023", words, set()) == 0.5
    assert answer_recall("the", words, set()) is None


def test_baseline_window_on_three_tau_bench_runs(tau_bench_path: Path) -> None:
    """Every argument value counts, per value; the id share per call is the old figure."""
    runs = load_tau_bench(tau_bench_path)[:3]
    wide = tau_retention(runs, 2000, plain_builder())
    assert (wide.calls, wide.built_tokens, wide.full_tokens, wide.values) == (10, 28180, 41939, 48)
    assert wide.groups == {"ids": (14, 25), "other": (21, 23)}
    assert wide.retention == pytest.approx(35 / 48)
    assert wide.per_call_retention == pytest.approx(0.66852, abs=1e-4)
    assert (wide.violations, wide.over_budget) == (0, 0)
    narrow = tau_retention(runs, 1600, plain_builder())
    assert (narrow.calls, narrow.built_tokens) == (10, 23308)
    assert narrow.groups == {"ids": (6, 25), "other": (13, 23)}
    assert narrow.per_call_retention == pytest.approx(0.31296, abs=1e-4)


def test_load_tau_bench_rejects_other_json(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"traj": []}))
    with pytest.raises(ValueError, match="expected a list of runs"):
        load_tau_bench(bad)


@pytest.fixture(scope="module")
def chat() -> dict[str, object]:
    return run_agent_chat()


def test_agent_chat_cost_and_planted_facts(chat: dict[str, object]) -> None:
    runs = chat["runs"]
    assert len(runs["none"].input_tokens_per_turn) == 50  # type: ignore[index]
    assert runs["none"].extra["facts_lost"] == []  # type: ignore[index]
    assert runs["window 8"].extra["facts_lost"] == ["budget", "size", "ticket"]  # type: ignore[index]
    assert chat["share_of_none"]["ctxwarden"] <= 0.30  # type: ignore[index]


def test_agent_chat_ours_loses_no_planted_fact(chat: dict[str, object]) -> None:
    assert chat["runs"]["ctxwarden"].extra["facts_lost"] == []  # type: ignore[index]
