"""Pins and message caps (issue 35): pinned, critical and ``pin_first`` messages live
outside ``window.max_messages``; a build with budget to spare evicts, cuts and masks
nothing the policy did not ask for by count or age; every drop names its real cause."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden import Message, Policy, ToolCall, WindowConfig, build_context
from ctxwarden.core.errors import BudgetError
from ctxwarden.steps.mask import MaskObservations
from ctxwarden_bench.random_histories import check_build, random_history
from ctxwarden_bench.spare_budget import reference_build, spare_budget_problems


def _agent_history(rounds: int = 26, pin_every: int = 5) -> list[Message]:
    msgs = [Message.system("You are an agent.", id="sys")]
    for r in range(rounds):
        msgs.append(
            Message.user(f"step {r}: look up R-{r:03d}", id=f"u{r}", pinned=r % pin_every == 0)
        )
        call = ToolCall(f"c{r}", "lookup", json.dumps({"id": f"R-{r:03d}"}))
        msgs.append(Message.assistant(None, (call,), id=f"a{r}"))
        body = {"id": f"R-{r:03d}", "value": r * 7, "note": "checked " * 8}
        msgs.append(Message.tool(json.dumps(body), f"c{r}", id=f"t{r}"))
        msgs.append(Message.assistant(f"R-{r:03d} has value {r * 7}.", id=f"r{r}"))
    return msgs


def test_pins_do_not_count_against_max_messages() -> None:
    history = _agent_history()
    policy = Policy(window=WindowConfig(max_messages=5, pin_first=2))
    built = build_context(history, "gpt-4o", 4_000, policy=policy)
    ids = [m.id for m in built.messages]
    pins = [m.id for m in history if m.pinned] + ["u0", "a0", "t0"]  # pin_first=2: u0, a0+t0
    assert all(p in ids for p in pins)
    counted = [i for i in ids if i not in pins and built.layers[i] in ("window", "current")]
    # the cap holds the window's own messages, whole blocks (a call with its result: the
    # next one back, a24 + t24, would make six)
    assert counted == ["r24", "a25", "t25", "r25"]
    assert not built.audit.warnings
    assert not built.audit.by_action("evicted")
    (span,) = built.audit.by_action("dropped")  # a cold build: one span, its cause named
    assert span.reason.endswith("older message(s) before the window (window.max_messages=5)")


def test_chained_builds_name_the_cap_and_keep_the_pins() -> None:
    """An agent loop under the cap: the sticky start moves by the cap, each message it
    passes is reported as dropped by the cap, pins stay, nothing is cut or warned."""
    history = _agent_history()
    policy = Policy(window=WindowConfig(max_messages=5, pin_first=2))
    built = build_context(history[:20], "gpt-4o", 8_000, policy=policy)  # cold
    passed = 0
    for n in range(21, len(history) + 1):
        built = build_context(history[:n], "gpt-4o", 8_000, policy=policy, previous=built)
        assert not built.audit.warnings
        dropped = built.audit.by_action("dropped")
        assert {a.reason for a in dropped} <= {"left the window (window.max_messages=5)"}
        passed += len(dropped)
        ids = {m.id for m in built.messages}
        assert {m.id for m in history[:n] if m.pinned} <= ids and "u0" in ids
    assert passed > 50  # the start moved by the cap, each message it passed reported


def test_the_issue_case_evicts_and_cuts_nothing_with_the_budget_free() -> None:
    """``WindowConfig(max_messages=5, pin_first=2)`` and masking, a 105-message history
    over the budget: nothing pinned is evicted, the newest result is not cut."""
    history = _agent_history()
    history.append(Message.user("and R-003 again?", id="u-last", pinned=True))
    history.append(Message.assistant(None, (ToolCall("cl", "lookup", '{"id": "R-003"}'),), id="al"))
    history.append(Message.tool(json.dumps({"id": "R-003", "value": 21}), "cl", id="tl"))
    total = sum(1 for _ in history)
    policy = Policy(window=WindowConfig(max_messages=5, pin_first=2), mask=MaskObservations())
    tokens = build_context(history, "gpt-4o", 1_000_000, policy=Policy()).input_tokens
    budget = tokens - 200  # the history is just over the budget, as in the issue
    built = build_context(history, "gpt-4o", budget, policy=policy)
    assert total > 100 and built.input_tokens < budget // 2
    assert not built.audit.by_action("evicted")
    assert not [a for a in built.audit.actions if a.strategy == "priority"]
    assert next(m for m in built.messages if m.id == "tl").text == history[-1].text
    assert not built.audit.warnings
    assert (
        spare_budget_problems(history, built, budget, reference_build(history, policy), policy)
        == []
    )


POLICIES = st.builds(
    lambda cap, first, keep, batch, masked: Policy(
        window=WindowConfig(max_messages=cap, pin_first=first),
        mask=MaskObservations(keep_last=keep, batch_tokens=batch) if masked else None,
    ),
    st.one_of(st.none(), st.integers(1, 12)),
    st.integers(0, 4),
    st.integers(0, 4),
    st.sampled_from([0, 200, 1000]),
    st.booleans(),
)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.integers(0, 2**31), POLICIES, st.floats(0.3, 1.6))
def test_a_build_with_budget_to_spare_does_only_what_the_policy_asks(
    seed: int, policy: Policy, scale: float
) -> None:
    history = random_history(seed)
    reference = reference_build(history, policy)
    budget = max(int(reference.input_tokens * scale), 150)
    try:
        built = build_context(history, "gpt-4o", budget, policy=policy)
    except BudgetError:
        return
    assert check_build(history, built, budget) == []
    assert spare_budget_problems(history, built, budget, reference, policy) == []
