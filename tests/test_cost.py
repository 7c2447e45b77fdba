"""Dollars per call and per session, with cached and cache-write tokens priced apart."""

from __future__ import annotations

import pytest

from ctxwarden.core.errors import UnknownModelError
from ctxwarden.core.registry.catalog import get_model
from ctxwarden.core.registry.cost import SessionCost, estimate_cost
from ctxwarden.core.registry.usage import Usage


def test_seed_004_figure_100k_history_on_gpt_4o_costs_25_cents() -> None:
    # seed 004: "100K tokens of history per step at $2.50/1M is $0.25 per call"
    assert estimate_cost(Usage(input_tokens=100_000), "gpt-4o") == pytest.approx(0.25)


def test_openai_cached_tokens_are_inside_prompt_tokens() -> None:
    # prompt_tokens=10,000 of which 6,000 cached; 500 completion tokens on gpt-4o:
    # 4,000 x $2.50 + 6,000 x $1.25 + 500 x $10 = $0.0225 (not $0.0300 at full price)
    usage = Usage.from_openai(prompt=10_000, completion=500, cached=6_000)
    assert estimate_cost(usage, "gpt-4o-2024-08-06") == pytest.approx(0.0225)


def test_anthropic_cache_reads_and_writes_come_beside_input_tokens() -> None:
    # Anthropic reports input_tokens=1,200 *excluding* 50,000 cache reads and 8,000 writes.
    # claude-sonnet-4-5: 1,200 x $3 + 50,000 x $0.30 + 8,000 x $3.75 + 300 x $15 = $0.0531
    usage = Usage.from_anthropic(1_200, 300, cache_read=50_000, cache_write=8_000)
    assert usage.input_tokens == 59_200
    assert estimate_cost(usage, "claude-sonnet-4-5-20250929") == pytest.approx(0.0531)
    # the two classic bugs give very different numbers
    ignored_cache = (1_200 * 3 + 300 * 15) / 1e6
    all_at_input = (59_200 * 3 + 300 * 15) / 1e6
    assert ignored_cache == pytest.approx(0.0081) and all_at_input == pytest.approx(0.1821)


def test_provider_without_cache_prices_bills_cached_tokens_as_input() -> None:
    # gpt-4 has no cached price: 1,000 input tokens cost $0.03 whatever the cache says
    usage = Usage(input_tokens=1_000, cached_input_tokens=400, cache_write_tokens=100)
    assert estimate_cost(usage, "gpt-4") == pytest.approx(0.03)


def test_deepseek_cache_hits() -> None:
    # 100,000 prompt tokens, 90,000 cache hits, 1,000 output:
    # 10,000 x $0.28 + 90,000 x $0.028 + 1,000 x $0.42 = $0.00574
    usage = Usage.from_openai(prompt=100_000, completion=1_000, cached=90_000)
    assert estimate_cost(usage, "deepseek-chat") == pytest.approx(0.00574)


def test_long_prompt_takes_the_higher_tier() -> None:
    short = Usage(input_tokens=100_000, output_tokens=1_000)
    long = Usage(input_tokens=250_000, output_tokens=1_000)
    assert estimate_cost(short, "gemini-2.5-pro") == pytest.approx(0.125 + 0.010)
    assert estimate_cost(long, "gemini-2.5-pro") == pytest.approx(0.625 + 0.015)


def test_local_models_are_free_and_model_info_is_accepted() -> None:
    usage = Usage(input_tokens=50_000, output_tokens=2_000)
    assert estimate_cost(usage, "ollama:qwen3:8b") == 0.0
    info = get_model("gpt-4o-mini")
    assert estimate_cost(usage, info) == pytest.approx((50_000 * 0.15 + 2_000 * 0.60) / 1e6)


def test_unknown_model_is_an_error() -> None:
    with pytest.raises(UnknownModelError):
        estimate_cost(Usage(input_tokens=1), "gpt-17")


def test_session_cost_adds_calls_per_model() -> None:
    session = SessionCost()
    first = session.add(Usage.from_openai(10_000, 500, cached=6_000), "gpt-4o-2024-08-06")
    second = session.add(Usage.from_openai(12_000, 400, cached=10_000), "gpt-4o")
    summary = session.add(Usage.from_anthropic(3_000, 200), "claude-haiku-4-5")
    assert first == pytest.approx(0.0225)
    assert second == pytest.approx((2_000 * 2.5 + 10_000 * 1.25 + 400 * 10) / 1e6)
    assert summary == pytest.approx((3_000 * 1.0 + 200 * 5.0) / 1e6)
    assert list(session.by_model) == ["gpt-4o", "claude-haiku-4-5"]
    assert session.by_model["gpt-4o"].usage == Usage(22_000, 900, 16_000, 0, calls=2)
    assert session.by_model["gpt-4o"].dollars == pytest.approx(first + second)
    assert session.total == pytest.approx(first + second + summary)
    assert len(session) == 3
    assert session.usage.input_tokens == 25_000


def test_session_cost_prices_tiers_per_call() -> None:
    # two 150k-token calls stay in the base tier even though together they exceed 200k
    session = SessionCost()
    for _ in range(2):
        session.add(Usage(input_tokens=150_000), "gemini-2.5-pro")
    assert session.total == pytest.approx(2 * 150_000 * 1.25 / 1e6)
    summed = session.by_model["gemini-2.5-pro"].usage
    assert estimate_cost(summed, "gemini-2.5-pro") == pytest.approx(session.total)
