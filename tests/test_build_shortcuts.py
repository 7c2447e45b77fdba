"""The build's shortcuts (the pairing check, the summary cut, the logged audit) give exactly
what the long way gives: they only skip work."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.pairing import all_sendable, group_blocks
from ctxwarden.memory.summaries import block_start_at


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


def _whole_turns(n: int) -> list[Message]:
    """A sendable window of ``n`` turns: a question, a call, its result, an answer."""
    out: list[Message] = [Message.system("s")]
    for k in range(n):
        call = ToolCall(f"c{k % 3}", "f", "{}")
        out += [Message.user(f"q{k}"), Message.assistant(None, [call]),
                Message.tool(f"r{k}", f"c{k % 3}"), Message.assistant(f"a{k}")]  # fmt: skip
    return out


@settings(max_examples=300, deadline=None)
@given(suffix=shuffled_turns(), cut=st.integers(0, 60), swap=st.integers(-1, 60))
def test_all_sendable_after_a_known_window_answers_as_a_full_scan(
    suffix: list[Message], cut: int, swap: int
) -> None:
    """The windows found sendable before shorten the scan of the longer ones that start
    with them; a window that shares their messages only in part is scanned whole."""
    base = _whole_turns(12)  # 49 messages: long enough to be kept
    assert all_sendable(base)  # now known
    window = [*base[: len(base) - cut % 8], *suffix]
    if 0 <= swap < len(window):  # an edited copy in place of a message (another object)
        m = window[swap]
        window[swap] = Message.tool("x", "c9") if m.role == "user" else m.with_content("e")
    want = all(b.sendable for b in group_blocks(window))
    assert all_sendable(window) == want
    assert all_sendable(tuple(window)) == want  # asked again: known, or scanned again


@settings(max_examples=400, deadline=None)
@given(messages=shuffled_turns(), at=st.integers(0, 30))
def test_block_start_at_is_the_last_block_start_up_to_a_position(
    messages: list[Message], at: int
) -> None:
    cut = min(at, len(messages))
    want = max((b.start for b in group_blocks(messages) if b.start <= cut), default=0)
    assert block_start_at(messages, cut) == want


def test_the_logged_audit_is_the_audit_as_json() -> None:
    import json
    from dataclasses import dataclass, replace

    from ctxwarden import build_context
    from ctxwarden.session.build_log import audit_json
    from ctxwarden.steps.base import Action
    from ctxwarden.store.base import json_text
    from ctxwarden.store.logged_build import audit_from_text

    history = [Message.system("Sé breve.")]
    for n in range(12):
        call = ToolCall(f"c{n}", "lookup", "{}")
        result = Message.tool("row " * 700 + f"ORD-{n}", f"c{n}")
        history += [Message.user(f"ask {n} ünïcode"), Message.assistant(None, [call]), result,
                    Message.assistant("ok")]  # fmt: skip
    history.append(Message.user("and now?"))
    audit = build_context(history, "gpt-4o", 3000).audit
    assert audit.actions  # cuts, masks and drops, with their reasons

    @dataclass(frozen=True)
    class Tagged(Action):
        tags: tuple[str, ...] = ("a",)  # not a scalar: written by asdict

    class Reason(str):  # a str subclass: not an exact scalar type, written by asdict
        pass

    odd = (Action("m1", "masked", "x", True, 0), Action("m1", "masked", "x", 1, 0),
           Tagged("m2", "truncated", "ü", 3, 1),
           Action("m3", "dropped", "\ud800", 2, 0),
           Action("m4", "masked", Reason("y"), 2, 0),
           Action("m4", "masked", "y", 2.0, 0))  # fmt: skip
    objects = json.loads(json_text(audit.to_dict()))
    for _ in range(2):  # the second time memoised
        # the actions as rows under their field names, read back as the objects
        logged = json.loads(audit_json(audit))
        assert list(logged["actions"]) == ["fields", "rows"]
        assert {**logged, "actions": None} == {**objects, "actions": None}
        assert len(audit_json(audit)) < len(json_text(audit.to_dict())) * 0.75
        assert audit_from_text(audit_json(audit)) == objects
        assert list(audit_from_text(audit_json(audit))) == list(objects)  # in the same order
    for a in (
        replace(audit, actions=()),
        *(replace(audit, actions=(*audit.actions, o)) for o in odd[2:5]),
    ):
        # no action, or one a row cannot stand for (another field, a value that is no
        # scalar, text the store cannot hold as it is): every action written as an object
        for _ in range(2):
            assert audit_json(a) == json_text(a.to_dict())
            assert audit_from_text(audit_json(a)) == json.loads(json_text(a.to_dict()))
    # rows of values of every scalar type read back as they were
    kinds = replace(audit, actions=odd[:2] + odd[5:])
    assert "rows" in json.loads(audit_json(kinds))["actions"]
    assert audit_from_text(audit_json(kinds)) == json.loads(json_text(kinds.to_dict()))
    assert [type(a["tokens_before"]) for a in audit_from_text(audit_json(kinds))["actions"]] == [
        bool, int, float,
    ]  # fmt: skip
