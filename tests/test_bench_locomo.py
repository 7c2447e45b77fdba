"""LoCoMo answer recall (summaries issue): the baselines reproduce, window + offline
summary + facts reaches the fidelity issue's 0.56 at 4,000 tokens through the public
``build_context(..., summarizer="offline")`` with the default policy, above the same builds
without a summariser, and its layers read as statements."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ctxwarden.core.errors import ConfigError
from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.llm.offline import OfflineSummarizer
from ctxwarden.pipeline.compaction import RECALL_MOVED
from ctxwarden.pipeline.engine import build_context
from ctxwarden.pipeline.policy import Policy
from ctxwarden.pipeline.summarize import STORE_BUDGETS
from ctxwarden_bench.metrics import EngineStrategy
from ctxwarden_bench.traces import (
    load_locomo,
    locomo_recall,
    locomo_transcript,
    locomo_trigger,
)

BUDGET = 4000


@pytest.fixture(scope="module")
def convs(locomo_path: Path) -> list[dict[str, Any]]:
    return load_locomo(locomo_path)


@pytest.fixture(scope="module")
def recall(convs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return locomo_recall(convs, BUDGET)


def test_baselines_reproduce_the_issue(recall: dict[str, dict[str, Any]]) -> None:
    assert recall["full history"]["answer_recall"] == pytest.approx(0.7823, abs=1e-4)
    assert recall["window only"]["answer_recall"] == pytest.approx(0.3556, abs=1e-4)
    assert recall["ctxwarden"]["questions"] == recall["window only"]["questions"] == 885


def test_window_summary_and_facts_reach_the_target_within_budget_on_defaults(
    recall: dict[str, dict[str, Any]],
) -> None:
    ours = recall["ctxwarden"]
    assert ours["answer_recall"] >= 0.66  # issue 39's target (0.6601 measured)
    # the chat loop at Anthropic's cache prices, below the full history with caching
    # (issue 37): 86.5%, and 57.9% without a summariser
    assert ours["cache_cost_vs_full"] < 0.9
    assert recall["ctxwarden, no summariser"]["cache_cost_vs_full"] < 0.65
    assert ours["answer_recall"] > recall["ctxwarden, no summariser"]["answer_recall"]
    assert sum(ours["input_tokens_per_turn"]) / ours["questions"] >= 0.85 * BUDGET  # fills
    assert max(ours["input_tokens_per_turn"]) <= BUDGET
    assert ours["reduction"] >= recall["window only"]["reduction"] - 0.05
    assert ours["summarizer"].startswith('offline, build_context(summarizer="offline")')
    assert ours["policy"] == "default"


def test_the_tuned_split_is_reported_with_its_knobs(convs: list[dict[str, Any]]) -> None:
    tuned = locomo_recall(convs[:1], BUDGET, summary_share=0.5)["ctxwarden"]
    assert tuned["policy"] == {
        "summary": {
            "max_messages": None,
            "keep_recent": 60,
            "max_tokens": 1850,
            "fill_ratio": None,
            "keep_recent_tokens": 1110,
            "summary_share": 0.5,
        }
    }
    assert max(tuned["input_tokens_per_turn"]) <= BUDGET


def fed(conv: dict[str, Any]) -> tuple[EngineStrategy, list[Message]]:
    transcript = locomo_transcript(conv)
    ours = EngineStrategy("gpt-4o", BUDGET, policy=Policy())
    for i, m in enumerate(transcript):
        if m.id.endswith("-date") and i > 1:
            ours(transcript[:i])
    ours(transcript)
    return ours, transcript


_STAMP = re.compile(r"^\[[^\]]+\]$")
_SAID = re.compile(r"^[A-Z][\w'.-]*(?: [A-Z][\w'.-]*){0,2}: \S")


def test_layers_are_statements_and_the_split_holds(convs: list[dict[str, Any]]) -> None:
    ours, transcript = fed(convs[0])
    question = Message.user("What is Caroline's necklace a gift from?", id="q")
    built = ours.built([*transcript, question])
    by_id = {m.id: m.text for m in built.messages}
    # the summary first (held through compactions), then what compactions renew
    ids = [m.id for m in built.messages]
    assert ids[:4] == ["sys", "ctxwarden:summary", "ctxwarden:facts", "ctxwarden:ledger"]
    summary = by_id["ctxwarden:summary"].splitlines()
    assert summary[0] == "Summary of the earlier conversation:"
    assert summary[1].startswith("Summary (extractive, offline) of messages session_1-date–")
    for line in summary[2:]:  # a date line, or a sentence someone said
        assert _STAMP.match(line) or _SAID.match(line), line
    said = "Caroline: This necklace is super special to me"
    # the summary block is held as the loop sent it (the prefix stays cached); the answer
    # comes to the question's tail in the recall block
    assert built.audit.prefix_break is None or built.audit.prefix_break.cause == RECALL_MOVED
    assert "necklace is super special to me - a gift from my grandma" in by_id["ctxwarden:recall"]
    stored = built.state.layers.summary.text
    counter = TokenCounter.for_model("gpt-4o")
    assert counter.count_text(stored) > BUDGET // 2  # more stored than shown ...
    assert counter.count_text(stored) <= STORE_BUDGETS * BUDGET + 5  # ... a bounded store
    unfocused = OfflineSummarizer().focus(stored, None, BUDGET // 2).text
    assert said not in unfocused
    assert BUDGET // 2 <= built.audit.layers["summary"] <= BUDGET  # the view fills
    facts = by_id["ctxwarden:facts"].splitlines()
    assert all(re.match(r"^[a-z_]+: \S", line) for line in facts[1:])
    assert built.messages[-1] is question
    assert built.input_tokens <= BUDGET


def test_the_bench_row_is_the_public_call(convs: list[dict[str, Any]]) -> None:
    """What the bench's strategy sends is what a user's own loop of build_context gets."""
    ours, transcript = fed(convs[1])
    previous = None
    for i, m in enumerate(transcript):
        if m.id.endswith("-date") and i > 1:
            previous = build_context(
                transcript[:i],
                model="gpt-4o",
                max_input_tokens=BUDGET,
                summarizer="offline",
                policy=Policy(),
                previous=previous,
            )
    previous = build_context(
        transcript,
        model="gpt-4o",
        max_input_tokens=BUDGET,
        summarizer="offline",
        policy=Policy(),
        previous=previous,
    )
    question = Message.user("What did Caroline research?", id="q")
    mine = build_context(
        [*transcript, question],
        model="gpt-4o",
        max_input_tokens=BUDGET,
        summarizer="offline",
        policy=Policy(),
        previous=previous,
    )
    assert [m.fingerprint for m in ours.build([*transcript, question])] == [
        m.fingerprint for m in mine.messages
    ]


def test_locomo_trigger_leaves_room_for_the_window() -> None:
    trigger = locomo_trigger(BUDGET, 0.5)
    assert trigger.summary_share == 0.5
    assert trigger.max_tokens is not None and trigger.keep_recent_tokens is not None
    assert trigger.max_tokens + BUDGET // 2 <= BUDGET
    assert trigger.keep_recent_tokens < trigger.max_tokens
    with pytest.raises(ConfigError, match="summary_share"):
        locomo_trigger(BUDGET, 1.0)
