"""The eviction's cut of a newest call's own arguments (its last resort before dropping the
block): on random calls and budgets, the context stays within budget and pair-safe, each
call keeps its id and name, arguments that were a JSON object are sent as one, and the
block is either sent whole (call and results) or dropped with its warning."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden import Message, ToolCall, build_context
from ctxwarden.core.errors import BudgetError
from ctxwarden.core.pairing import pairing_problems
from ctxwarden.core.tokens.counter import TokenCounter

WORDS = st.sampled_from(["alpha", "HAT028", "2024-05-21", "src/pkg/io.py", "x = 1\n", "ok"])
LEAVES = st.one_of(
    st.lists(WORDS, min_size=1, max_size=400).map("".join),
    st.integers(),
    st.booleans(),
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=40),
        st.dictionaries(st.text("abcdef_", min_size=1), inner, max_size=8),
    ),
    max_leaves=60,
)
ARGUMENTS = st.dictionaries(
    st.sampled_from(["command", "flights", "user_id", "body", "items"]),
    VALUES,
    min_size=1,
    max_size=5,
)


def history(arguments: list[dict[str, Any]], prose: str) -> list[Message]:
    calls = tuple(ToolCall(f"c{i}", "act", json.dumps(a)) for i, a in enumerate(arguments))
    return [
        Message.system("You are an agent. Follow the rules. " * 10),
        Message.user("Please do the task."),
        Message.assistant(prose or None, tool_calls=calls),
        *(Message.tool(f"done {i}: ok", tool_call_id=f"c{i}") for i in range(len(calls))),
    ]


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    st.lists(ARGUMENTS, min_size=1, max_size=3),
    st.sampled_from(["", "I will act now. " * 30]),
    st.integers(0, 400),
)
def test_a_cut_call_keeps_its_shape_and_the_block_stays_whole_or_goes_loudly(
    arguments: list[dict[str, Any]], prose: str, spare: int
) -> None:
    h = history(arguments, prose)
    count = TokenCounter.for_model("gpt-4o").count_message
    budget = count(h[0]) + count(h[1]) + spare + 3
    try:
        built = build_context(h, "gpt-4o", budget)
    except BudgetError as exc:
        assert exc.minimum is not None and exc.minimum > budget
        return
    sent = list(built.messages)
    assert built.input_tokens <= budget
    assert pairing_problems(sent) == []
    assert [m.id for m in sent[:2]] == [h[0].id, h[1].id]
    call = next((m for m in sent if m.tool_calls), None)
    if call is None:
        assert any(
            w.startswith(f"newest tool call {h[2].id} dropped") for w in built.audit.warnings
        )
        return
    assert [(c.id, c.name) for c in call.tool_calls] == [(c.id, c.name) for c in h[2].tool_calls]
    for c in call.tool_calls:
        assert isinstance(json.loads(c.arguments), dict)
    assert [m.tool_call_id for m in sent if m.role == "tool"] == [c.id for c in h[2].tool_calls]
