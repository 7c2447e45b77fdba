"""Property tests of the build's promises on random histories (issue 11): within budget,
pairs whole, system first, newest user message and newest call block kept, pins kept or
evicted with a warning, no duplicates, deterministic — cold, chained, with the offline
summariser. The long sweep is ``python -m ctxwarden_bench.sweep``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden import BuildState, build_context
from ctxwarden.core.errors import BudgetError
from ctxwarden_bench.random_histories import check_build, random_history
from ctxwarden_bench.sweep import sweep

SEEDS = st.integers(min_value=0, max_value=2**31)
BUDGETS = st.sampled_from([200, 300, 450, 800, 1500, 3000])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(SEEDS, BUDGETS)
def test_cold_builds_hold_every_invariant(seed: int, budget: int) -> None:
    history = random_history(seed)
    try:
        built = build_context(history, "gpt-4o", budget)
    except BudgetError as exc:
        assert exc.minimum is not None and exc.minimum > budget
        return
    assert check_build(history, built, budget) == []
    again = build_context(history, "gpt-4o", budget)
    assert again.to_openai() == built.to_openai()  # deterministic


@settings(max_examples=15, deadline=None, derandomize=True)
@given(SEEDS, BUDGETS)
def test_chained_builds_hold_every_invariant(seed: int, budget: int) -> None:
    history = random_history(seed)
    built = None
    for n in range(2, len(history) + 1):
        try:
            built = build_context(history[:n], "gpt-4o", budget, previous=built)
        except BudgetError:
            built = None
            continue
        assert check_build(history[:n], built, budget) == []
        # what a stored state rebuilds equals what the chain builds next
        if n < len(history):
            stored = BuildState.from_dict(built.state.to_dict())
            try:
                b = build_context(history[: n + 1], "gpt-4o", budget, previous=built)
            except BudgetError:
                continue
            a = build_context(history[: n + 1], "gpt-4o", budget, previous=stored)
            assert a.to_openai() == b.to_openai()


@settings(max_examples=15, deadline=None, derandomize=True)
@given(SEEDS, BUDGETS)
def test_layers_never_make_a_build_fail(seed: int, budget: int) -> None:
    history = random_history(seed, max_turns=60)
    try:
        build_context(history, "gpt-4o", budget)
    except BudgetError:
        return
    built = build_context(history, "gpt-4o", budget, summarizer="offline")
    assert check_build(history, built, budget) == []


def test_the_sweep_reports_no_violation_on_a_small_run() -> None:
    result = sweep(30, (300, 1500))
    assert result["builds"] > 100
    assert result["violations"] == 0, result["examples"]
    # max_messages + pin_first + masking drawn per history (issue 35): nothing evicted
    # or cut with budget to spare, every drop naming its cause
    assert result["policy_builds"] > 60
    assert result["spare_budget_violations"] == 0, result["examples"]
