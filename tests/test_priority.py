"""Importance scoring and priority eviction (R9): the last step of the cascade."""

from __future__ import annotations

import pytest

from ctxwarden import Message, Policy, ToolCall, WindowConfig, build_context
from ctxwarden.core.pairing import pairing_problems
from ctxwarden.steps.priority import PRIORITY_WEIGHT, eviction_order, importance, is_correction


def test_priority_dominates_importance() -> None:
    msgs = [Message.user("plain words here", priority=p, id=p) for p in PRIORITY_WEIGHT]
    order = [m.id for m in eviction_order(msgs)]
    assert order == ["low", "medium", "high", "critical"]


def test_recency_density_relevance_and_corrections_raise_importance() -> None:
    older = Message.user("we talked about the weather", id="a")
    newer = Message.user("we talked about the weather", id="b")
    assert importance([older, newer], 1) > importance([older, newer], 0)
    dense = Message.user("Order ORD-4471 on 2025-03-02 for $1,500 by Anna", id="d")
    sparse = Message.user("ok sounds good to me then", id="s")
    assert importance([dense, sparse], 0) > importance([sparse, dense], 0)
    on_topic = Message.user("the refund for the blue jacket", id="t")
    off_topic = Message.user("the weather was lovely today", id="o")
    query = "where is my refund for the jacket"
    assert importance([on_topic], 0, current=query) > importance([off_topic], 0, current=query)
    assert importance([sparse], 0, corrected=True) == pytest.approx(importance([sparse], 0) + 4.0)


@pytest.mark.parametrize(
    "text",
    ["No, I said size L", "Actually it was Tuesday", "Ні, не так", "Нет, неправильно", "Nie, źle"],
)
def test_corrections_are_recognised_in_several_languages(text: str) -> None:
    assert is_correction(Message.user(text))


def test_an_agent_reply_the_user_corrected_outlives_an_uncorrected_one() -> None:
    msgs = [
        Message.assistant("Your size is M.", id="wrong"),
        Message.user("No, I said size L.", id="fix"),
        Message.assistant("Here are some jackets.", id="other"),
    ]
    order = [m.id for m in eviction_order(msgs)]
    assert order.index("wrong") > order.index("other")


def _pinned_chat(n_pins: int) -> list[Message]:
    h = [Message.system("You are a support agent.")]
    for i in range(n_pins):
        h.append(
            Message.user(
                f"Pinned note {i}: " + "remember this detail " * 12,
                pinned=True,
                priority="low" if i % 2 else "high",
                id=f"pin{i}",
            )
        )
        h.append(Message.assistant(f"Noted {i}.", id=f"ack{i}"))
    h.append(Message.user("What did I ask you to remember?", id="ask"))
    return h


def test_pins_are_evicted_lowest_priority_first_with_a_warning() -> None:
    h = _pinned_chat(6)
    built = build_context(h, "gpt-4o", 300)
    evicted = [a.message_id for a in built.audit.actions if a.action == "evicted"]
    assert evicted and built.input_tokens <= 300
    kept = {m.id for m in built.messages}
    low = [f"pin{i}" for i in range(1, 6, 2)]
    high = [f"pin{i}" for i in range(0, 6, 2)]
    assert all(p in evicted for p in low if p not in kept)
    assert sum(p in kept for p in high) >= sum(p in kept for p in low)
    assert all(f"pinned message {e} evicted" in " ".join(built.audit.warnings) for e in evicted)
    assert "ask" in kept


def test_a_critical_message_is_kept_over_window_messages() -> None:
    h = [Message.system("sys")]
    h.append(Message.user("The contract number is CN-88120.", priority="critical", id="crit"))
    for i in range(20):
        h.append(Message.user(f"question {i} " + "about the delivery " * 10, id=f"q{i}"))
        h.append(Message.assistant(f"answer {i} " + "it is on its way " * 10, id=f"a{i}"))
    h.append(Message.user("What is the contract number?", id="last"))
    for policy in (Policy(), Policy(window=WindowConfig(pin_first=1))):
        built = build_context(h, "gpt-4o", 400, policy=policy)
        assert "crit" in {m.id for m in built.messages}
        assert built.layers["crit"] == "pinned"


def test_an_evicted_pinned_call_takes_its_results_with_it() -> None:
    h = [
        Message.system("sys"),
        Message.user("look it up"),
        Message.assistant(
            None, tool_calls=(ToolCall("c1", "lookup", "{}"),), pinned=True, id="call"
        ),
        Message.tool("result " * 200, tool_call_id="c1", id="res"),
        Message.assistant("done", id="done"),
        *[Message.user(f"more {i} " * 30, id=f"u{i}") for i in range(5)],
    ]
    for budget in (120, 200, 300, 500):
        built = build_context(h, "gpt-4o", budget)
        ids = {m.id for m in built.messages}
        assert ("call" in ids) == ("res" in ids), budget
        assert pairing_problems(list(built.messages)) == []
