"""The summary triggers' sums carried from build to build (memory/summary_scan.py): every
build reports the summary the full plan would make, whatever the previous build left."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ctxwarden import BuildState, build_context
from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import TokenCounter, count_key
from ctxwarden.memory.layer_state import LayerState
from ctxwarden.memory.summaries import SummaryState, SummaryTrigger, plan_summary
from ctxwarden.memory.summary_scan import SummaryScan, scan_key, summary_due_of
from ctxwarden.pipeline.policy import Policy
from ctxwarden.steps.memos import memo_of
from ctxwarden_bench.random_histories import random_history

COUNTER = TokenCounter.for_model("gpt-4o")

TRIGGERS = [
    SummaryTrigger(),
    SummaryTrigger(max_messages=8, keep_recent=3, min_fold=1),
    SummaryTrigger(max_messages=None, keep_recent=0, max_tokens=900, fill_ratio=None),
    SummaryTrigger(max_messages=12, keep_recent=4, keep_recent_tokens=400),
    SummaryTrigger(max_messages=None, keep_recent=2, fill_ratio=0.2, keep_recent_tokens=5000),
    SummaryTrigger(max_messages=None, fill_ratio=0.3, summary_share=0.1),
]


def _plan_due(
    history: list[Message], trigger: SummaryTrigger, window: int, summary: SummaryState
) -> tuple[tuple[str, ...], str, str, int] | None:
    plan = plan_summary(history, trigger, COUNTER.count_message, window, summary)
    if plan is None:
        return None
    return plan.reasons, plan.fold[0].id, plan.fold[-1].id, len(plan.fold)


def _summaries(history: list[Message]) -> list[SummaryState]:
    """No summary; one covering some early messages; one with text only."""
    early = frozenset(m.id for m in history[1:6] if m.role != "system")
    return [
        SummaryState(),
        SummaryState(summaries=("the user asked for a refund",), covered_ids=early, cycles=1),
        SummaryState(summaries=("order ORD-7 was shipped to Lyon " * 30,), cycles=2),
    ]


@pytest.mark.parametrize("seed", [0, 1, 2, 4, 5, 6, 8, 9, 10, 11])
def test_a_carried_scan_gives_what_the_plan_gives_at_every_turn(seed: int) -> None:
    history = random_history(seed, max_turns=25)  # pinned and critical messages among them
    if seed % 2:  # a system message mid-way: never folded, counted as held
        mid = len(history) // 2
        history = [*history[:mid], Message.system("note: prices in EUR", id="note"), *history[mid:]]
    window = 2_500 + 300 * seed
    fired = 0
    for trigger in TRIGGERS:
        for summary in _summaries(history):
            key = scan_key(count_key(COUNTER), summary)
            scan = SummaryScan(key=key)
            for n in range(1, len(history) + 1, 3):
                part = history[:n]
                assert scan.fits(part, key)
                due, scan = summary_due_of(
                    part, trigger, COUNTER.count_message, window, summary, fills=False, scan=scan
                )
                assert due == _plan_due(part, trigger, window, summary), (trigger, n)
                fresh, again = summary_due_of(
                    part,
                    trigger,
                    COUNTER.count_message,
                    window,
                    summary,
                    fills=False,
                    scan=SummaryScan(key=key),
                )
                assert (fresh, again) == (due, scan)
                fired += due is not None
            assert scan.upto == n and scan.last_id == history[n - 1].id
    assert fired  # the tests above saw summaries due, not only None


def test_a_scan_fits_only_its_own_history_summary_and_counter() -> None:
    history = random_history(3)
    summary = SummaryState()
    key = scan_key(count_key(COUNTER), summary)
    _, scan = summary_due_of(
        history[:10], SummaryTrigger(), COUNTER.count_message, 4000, summary,
        fills=False, scan=SummaryScan(key=key),
    )  # fmt: skip
    assert scan.fits(history, key) and scan.fits(history[:10], key)
    assert not scan.fits(history[:9], key)  # shorter than what it summed
    other = [*history[:9], replace(history[9], id="another"), *history[10:]]
    assert not scan.fits(other, key)  # not the history it summed
    covering = SummaryState(covered_ids=frozenset({history[2].id}))
    assert not scan.fits(history, scan_key(count_key(COUNTER), covering))
    claude = TokenCounter.for_model("claude-sonnet-4")
    assert count_key(claude) != count_key(COUNTER)
    assert not scan.fits(history, scan_key(count_key(claude), summary))
    assert covering.covered_key == SummaryState(covered_ids=covering.covered_ids).covered_key
    assert SummaryState().covered_key == ""


def test_the_scan_round_trips_in_the_build_state() -> None:
    history = random_history(5, max_turns=20)
    built = build_context(history, "gpt-4o", 1500, layers=LayerState())  # a summary may be due
    state = built.state
    scan = memo_of(state, "layers", SummaryScan)
    assert scan is not None and scan.upto == len(history)
    back = BuildState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back == state and memo_of(back, "layers", SummaryScan) == scan


def test_an_agent_loop_reports_what_a_cold_build_reports() -> None:
    """Turn by turn with the carried state, and after a summary cycle changed what is
    covered (a scan of the old coverage is not used): the audit's summary_due is the
    cold build's."""
    history = random_history(7, max_turns=30)
    policy = Policy(summary=SummaryTrigger(max_messages=10, keep_recent=4))
    previous = None
    covered = frozenset(m.id for m in history[1:8])
    for n in range(6, len(history) + 1, 2):
        part = history[:n]
        layers = LayerState(SummaryState(summaries=("s",), covered_ids=covered)) if n > 30 else None
        built = build_context(part, "gpt-4o", 3000, policy=policy, previous=previous, layers=layers)
        cold = build_context(part, "gpt-4o", 3000, policy=policy, layers=layers)
        assert built.audit.summary_due == cold.audit.summary_due, n
        scans = [memo_of(b.state, "layers", SummaryScan) for b in (built, cold)]
        assert scans[0] == scans[1], n
        previous = built
