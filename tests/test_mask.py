"""Observation masking (R5): old tool results become placeholders, in cache-friendly batches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.core.errors import ConfigError
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.steps.base import ActionKind, Strategy, StrategyContext
from ctxwarden.steps.mask import MaskObservations

COUNTER = TokenCounter.for_model("gpt-4o")


def ctx(
    budget: int = 1_000_000,
    sticky: Mapping[str, ActionKind] | None = None,
    protected: frozenset[str] = frozenset(),
) -> StrategyContext:
    return StrategyContext(
        count=COUNTER.count_message,
        budget=budget,
        total=lambda ms: COUNTER.count_messages(ms).tokens,
        protected=protected,
        sticky=dict(sticky or {}),
    )


def agent_session(sizes: Sequence[int], tool: str = "get_reservation_details") -> list[Message]:
    """system, user, then per size: a tool call, its result of about ``size`` tokens, a reply."""
    messages = [Message.system("You are an airline agent.", id="s"), Message.user("Hi", id="u")]
    for i, size in enumerate(sizes):
        call = ToolCall(f"c{i}", tool, f'{{"reservation_id": "R{i:05d}"}}')
        messages.append(Message.assistant(tool_calls=(call,), id=f"a{i}"))
        body = " ok" * max(size - 8, 0)
        messages.append(Message.tool(body, tool_call_id=f"c{i}", id=f"t{i}"))  # no name: looked up
        messages.append(Message.assistant(f"Reservation R{i:05d} checked.", id=f"r{i}"))
    return messages


def masked_ids(messages: Sequence[Message], original: Sequence[Message]) -> list[str]:
    return [m.id for m, o in zip(messages, original, strict=True) if m is not o]


def test_old_results_become_placeholders_and_calls_stay() -> None:
    session = agent_session([400] * 6)
    strategy = MaskObservations(keep_last=3, batch_tokens=0)
    assert isinstance(strategy, Strategy) and strategy.name == "mask"
    result = strategy(session, ctx())
    assert masked_ids(result.messages, session) == ["t0", "t1", "t2"]
    placeholder = result.messages[3]
    tokens = COUNTER.count_message(session[3])
    assert placeholder.text == (
        "[tool result masked to save context: get_reservation_details, "
        f"{tokens:,} tokens; cw:msg:{session[3].id}]"
    )
    assert placeholder.tool_call_id == "c0" and placeholder.role == "tool"
    assert [a.message_id for a in result.actions] == ["t0", "t1", "t2"]
    action = result.actions[0]
    assert (action.action, action.strategy, action.tokens_before) == ("masked", "mask", tokens)
    assert action.tokens_after == COUNTER.count_message(placeholder) < 30


def test_custom_placeholder_and_validation() -> None:
    session = agent_session([200] * 4)
    strategy = MaskObservations(keep_last=1, batch_tokens=0, placeholder="<{call_id}: {name} gone>")
    result = strategy(session, ctx())
    assert result.messages[3].text == "<c0: get_reservation_details gone>"
    with pytest.raises(ConfigError, match="placeholder"):
        MaskObservations(placeholder="{nope}")
    with pytest.raises(ConfigError, match="keep_last"):
        MaskObservations(keep_last=-1)


def test_masking_waits_for_a_full_batch() -> None:
    strategy = MaskObservations(keep_last=1, batch_tokens=1000)
    # three results beyond keep_last of ~400 tokens: 1,200 maskable, one batch of 1,000 reached
    session = agent_session([400, 400, 400, 400])
    assert masked_ids(strategy(session, ctx()).messages, session) == ["t0", "t1"]
    # only ~800 maskable: no batch yet, nothing masked
    session = agent_session([400, 400, 400])
    assert strategy(session, ctx()).actions == []


def test_batches_keep_the_prefix_stable_across_turns() -> None:
    """In a growing session the masked set only grows, and changes in few, large steps."""
    strategy = MaskObservations(keep_last=3, batch_tokens=1000)
    sizes = [150, 600, 90, 300, 450, 220, 800, 120, 350, 500, 260, 700, 180, 400, 330] * 2
    previous: list[str] = []
    changes = 0
    for n in range(1, len(sizes) + 1):
        session = agent_session(sizes[:n])
        sticky: dict[str, ActionKind] = {i: "masked" for i in previous}
        now = masked_ids(strategy(session, ctx(sticky=sticky)).messages, session)
        stateless = masked_ids(strategy(session, ctx()).messages, session)
        assert now == stateless  # the decision does not depend on remembered state
        assert now[: len(previous)] == previous  # never unmasked
        changes += now != previous
        previous = now
    assert previous  # masking happened
    assert changes <= sum(sizes) // 1000 + 1
    assert changes < len(sizes) / 2  # most turns reuse the previous prefix byte for byte


def test_sticky_masks_stay_even_under_a_full_batch() -> None:
    session = agent_session([400] * 5)
    strategy = MaskObservations(keep_last=2, batch_tokens=10_000)
    assert strategy(session, ctx()).actions == []
    result = strategy(session, ctx(sticky={"t1": "masked", "t4": "masked", "u": "masked"}))
    assert masked_ids(result.messages, session) == ["t1"]  # t4 is among the last 2: never masked
    assert "earlier build" in result.actions[0].reason


def test_small_pinned_and_protected_results_are_never_masked() -> None:
    session = agent_session([10, 400, 400, 400, 400])
    session[9] = Message.tool(session[9].text, tool_call_id="c2", id="t2", pinned=True)
    result = MaskObservations(keep_last=1, batch_tokens=0)(
        session, ctx(protected=frozenset({"t3"}))
    )
    assert masked_ids(result.messages, session) == ["t1"]


def test_over_budget_flushes_the_partial_batch() -> None:
    session = agent_session([300, 300, 300, 300])
    total = COUNTER.count_messages(session).tokens
    strategy = MaskObservations(keep_last=1, batch_tokens=1000)
    assert strategy(session, ctx(budget=total * 2)).actions == []
    assert len(strategy(session, ctx(budget=total - 100)).actions) == 3
    lazy = MaskObservations(keep_last=1, batch_tokens=0, only_over_budget=True)
    assert lazy(session, ctx(budget=total * 2)).actions == []
    assert len(lazy(session, ctx(budget=total - 100)).actions) == 3


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 900), max_size=14),
    keep_last=st.integers(0, 5),
    batch=st.sampled_from([0, 300, 1000, 5000]),
    budget=st.integers(50, 20_000),
)
def test_mask_invariants(sizes: list[int], keep_last: int, batch: int, budget: int) -> None:
    session = agent_session(sizes)
    strategy = MaskObservations(keep_last=keep_last, batch_tokens=batch)
    result = strategy(session, ctx(budget=budget))
    results = [i for i, m in enumerate(session) if m.role == "tool"]
    protected = results[len(results) - keep_last :] if keep_last else []
    for i, (new, old) in enumerate(zip(result.messages, session, strict=True)):
        if old.role != "tool" or i in protected:
            assert new is old
        else:
            assert new is old or COUNTER.count_message(new) < COUNTER.count_message(old)
        assert (new.id, new.role, new.tool_call_id) == (old.id, old.role, old.tool_call_id)
    assert strategy(session, ctx(budget=budget)).messages == result.messages  # deterministic
    if sizes:  # one more turn never unmasks anything
        longer = agent_session([*sizes, 500])
        grown = strategy(longer, ctx(budget=10**9))
        before = set(masked_ids(strategy(session, ctx(budget=10**9)).messages, session))
        assert before <= set(masked_ids(grown.messages, longer))


def _fresh(messages: Sequence[Message]) -> list[Message]:
    """The same messages as new objects (nothing kept on them)."""
    names = [f.name for f in fields(Message) if f.init]
    return [Message(**{f: getattr(m, f) for f in names}) for m in messages]


def test_an_outcome_read_back_from_the_last_build_is_what_masking_anew_gives() -> None:
    session = agent_session([400] * 6)
    other = TokenCounter.for_model("claude-sonnet-4-5")  # another counter: other counts
    variants: list[tuple[MaskObservations, StrategyContext]] = [
        (MaskObservations(keep_last=3, batch_tokens=0), ctx()),
        (MaskObservations(keep_last=3, batch_tokens=0), ctx(sticky={"t0": "masked"})),
        (MaskObservations(keep_last=2, batch_tokens=0), ctx()),
        (MaskObservations(keep_last=3, batch_tokens=0, name="mask2"), ctx()),
        (MaskObservations(keep_last=3, batch_tokens=0, placeholder="[gone: {handle}]"), ctx()),
        (
            MaskObservations(keep_last=3, batch_tokens=0),
            StrategyContext(
                count=other.count_message,
                budget=1_000_000,
                total=lambda ms: other.count_messages(ms).tokens,
            ),
        ),
    ]
    for strategy, context in variants * 2:  # the second round reads the kept outcomes
        kept = strategy(session, context)
        anew = strategy(_fresh(session), context)
        assert [m.content for m in kept.messages] == [m.content for m in anew.messages]
        assert [m.meta for m in kept.messages] == [m.meta for m in anew.messages]
        assert kept.actions == anew.actions
    reasons = {a.reason for a in MaskObservations(keep_last=3, batch_tokens=0)(
        session, ctx(sticky={"t0": "masked"})).actions}  # fmt: skip
    assert reasons == {
        "masked in an earlier build (kept masked for a stable prefix)",
        "tool result older than the last 3",
    }
