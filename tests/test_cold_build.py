"""``ledger.lookback_budgets`` (off by default): a cold build (no ``previous``) that
costs O(budget), not O(history), since the ledger's look-back is bounded by its text;
the bound changes no context an agent loop builds, nor the cold contexts of chat-sized
recorded traces."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import pytest

from ctxwarden import Message, Policy, build_context
from ctxwarden.core.errors import ConfigError
from ctxwarden.memory.entity_ledger import EntityLedger
from ctxwarden.pipeline.policy import LedgerConfig
from ctxwarden.steps.ledger import LOOKBACK_CHARS_PER_TOKEN, MIN_LOOKBACK, ledger_begin
from ctxwarden_bench.traces import load_tau_bench
from ctxwarden_bench.traffic import agent_traffic

UNBOUNDED = Policy()
BOUNDED = Policy(ledger=LedgerConfig(lookback_budgets=3.0))


def _size(m: Message) -> int:
    return len(m.text) + sum(len(c.arguments) for c in m.tool_calls)


@pytest.fixture(scope="module")
def tau(tau_bench_path: Path) -> list[list[Message]]:
    return load_tau_bench(tau_bench_path)


def test_cold_builds_of_recorded_traces_are_those_of_an_unbounded_look_back(
    tau: list[list[Message]],
) -> None:
    """Every turn of some tau-bench dev trajectories, built cold at both bench budgets:
    byte for byte the context the default (unbounded) look-back builds."""
    for history in (tau[3], tau[11], tau[27]):
        for budget in (1600, 2000):
            for n in range(5, len(history) + 1, 3):
                bounded = build_context(history[:n], "gpt-4o", budget, policy=BOUNDED)
                unbounded = build_context(history[:n], "gpt-4o", budget, policy=UNBOUNDED)
                assert bounded.to_openai() == unbounded.to_openai()
                assert bounded.audit.layers == unbounded.audit.layers


def test_a_long_history_of_tool_results_is_read_a_bounded_way_back() -> None:
    """On 3,000 messages of agent traffic (JSON pages of up to 3,000 tokens), a cold
    build reads values from at most the bound's characters before its window (the one
    crossing it whole), and a larger budget reads further back."""
    history = list(islice(agent_traffic(0), 3000))
    reach = {}
    for budget in (2000, 8000):
        cold = build_context(history, "gpt-4o", budget, policy=BOUNDED)
        nothing = Policy(ledger=LedgerConfig(lookback_budgets=0))
        # where a look-back of nothing begins: the window's region
        region = ledger_begin(build_context(history, "gpt-4o", budget, policy=nothing).state)
        read = [_size(m) for m in history[ledger_begin(cold.state) : region]]
        bound = max(3 * budget * LOOKBACK_CHARS_PER_TOKEN, MIN_LOOKBACK)
        assert sum(read[1:]) < bound <= sum(read)
        reach[budget] = region - ledger_begin(cold.state)
        assert cold.input_tokens <= budget
    assert reach[8000] > reach[2000]


def test_the_bound_changes_no_agent_loop() -> None:
    """With ``previous`` the ledger keeps where it began: an agent loop over a long
    history builds the same contexts with the bound as without it."""
    history = list(islice(agent_traffic(1), 700))
    bounded = unbounded = None
    for n in range(20, len(history) + 1, 17):
        bounded = build_context(history[:n], "gpt-4o", 2000, previous=bounded, policy=BOUNDED)
        unbounded = build_context(history[:n], "gpt-4o", 2000, previous=unbounded, policy=UNBOUNDED)
        assert bounded.to_openai() == unbounded.to_openai()
    assert bounded is not None and ledger_begin(bounded.state) <= 1


def test_a_slice_given_its_earlier_ledger_is_read_whole() -> None:
    """A caller that passes the ledger of what lies before its messages (a session's
    slice) gets no bound: values between the slice start and a bound would be in
    neither ledger."""
    history = list(islice(agent_traffic(2), 400))
    earlier = EntityLedger()
    bounded = build_context(history, "gpt-4o", 2000, policy=BOUNDED, earlier_entities=earlier)
    unbounded = build_context(history, "gpt-4o", 2000, earlier_entities=earlier)
    assert ledger_begin(build_context(history, "gpt-4o", 2000, policy=BOUNDED).state) > 1
    assert ledger_begin(bounded.state) == ledger_begin(unbounded.state) == 1
    with pytest.raises(ConfigError, match="lookback_budgets"):
        LedgerConfig(lookback_budgets=-1.0)
    with pytest.raises(ConfigError, match="lookback_budgets"):
        LedgerConfig(lookback_budgets=float("nan"))


def test_the_span_before_a_cold_window_is_counted_only_when_read() -> None:
    """A cold build reports what lies before its window as one dropped span whose tokens
    are counted when first read: then exactly the sum of its messages' counts, and the
    action equals, hashes, pickles and prints as the plain Action of those values."""
    import dataclasses
    import pickle

    from ctxwarden.core.tokens.counter import TokenCounter
    from ctxwarden.steps.base import Action, CountedAction

    history = list(islice(agent_traffic(7), 240))  # (the walk counts answered results cut)
    counter = TokenCounter("gpt-4o")  # a counter of its own: what it has cached is ours
    built = build_context(history, "gpt-4o", 2000)
    span = next(a for a in built.audit.actions if ".." in a.message_id)
    assert isinstance(span, CountedAction)
    assert "_tokens" in span.__dict__ and span.__dict__["_tokens"] is None  # not yet counted
    first, last = span.message_id.split("..")
    ids = [m.id for m in history]
    before = history[ids.index(first) : ids.index(last) + 1]
    expected = sum(counter.count_message(m) for m in before)
    assert span.tokens_before == expected and span.tokens_saved == expected
    plain = Action(span.message_id, "dropped", span.reason, expected, 0, "window")
    assert span == plain and plain == span and hash(span) == hash(plain)
    assert repr(span) == repr(plain) and dataclasses.asdict(span) == dataclasses.asdict(plain)
    copy = pickle.loads(pickle.dumps(span))
    assert type(copy) is Action and copy == plain
    assert dataclasses.replace(span, reason="x") == dataclasses.replace(plain, reason="x")
    assert built.audit.to_dict()["actions"][0]["tokens_before"] == expected
