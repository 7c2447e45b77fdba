"""The build's pairing shortcuts answer exactly what the blocks say (they only skip work)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.build.pairing import all_sendable, group_blocks
from ctxwarden.memory.summaries import block_start_at
from ctxwarden.messages import Message, ToolCall


@st.composite
def shuffled_turns(draw: st.DrawFn) -> list[Message]:
    """Any mix of user, plain assistant, tool-calling assistant and tool messages, with
    call ids that repeat, results missing, extra or out of place."""
    out: list[Message] = []
    for n in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["user", "assistant", "call", "tool"]))
        if kind == "user":
            out.append(Message.user(f"u{n}"))
        elif kind == "assistant":
            out.append(Message.assistant(f"a{n}"))
        elif kind == "call":
            ids = draw(st.lists(st.sampled_from(["c0", "c1", "c2"]), min_size=1, max_size=3))
            out.append(Message.assistant(None, [ToolCall(i, "f", "{}") for i in ids]))
        else:
            out.append(Message.tool(f"r{n}", draw(st.sampled_from(["c0", "c1", "c2", "c9"]))))
    return out


@settings(max_examples=400, deadline=None)
@given(messages=shuffled_turns())
def test_all_sendable_is_every_block_sendable(messages: list[Message]) -> None:
    assert all_sendable(messages) == all(b.sendable for b in group_blocks(messages))


@settings(max_examples=400, deadline=None)
@given(messages=shuffled_turns(), at=st.integers(0, 30))
def test_block_start_at_is_the_last_block_start_up_to_a_position(
    messages: list[Message], at: int
) -> None:
    cut = min(at, len(messages))
    want = max((b.start for b in group_blocks(messages) if b.start <= cut), default=0)
    assert block_start_at(messages, cut) == want
