"""A long turn's window starts after its request, which stays (steps.window.long_turn).

A coding agent's run is one request and then hundreds of tool calls. The window never
left the newest user message, so its region was the whole run: every build walked it,
masked in it and listed its dropped values again (a one-request run of 3,000 messages:
149 ms a build, 10,000: 710 ms; ``python -m ctxwarden_bench.engine_speed --source
one-prompt``). Past :data:`~ctxwarden.steps.window.LONG_TURN` messages the window may
start after the request, which is then pinned and laid where it stood; the contexts are
those of a window that starts at the request (equal here at the budgets where nothing
else differs; at tight budgets the turn's dropped results no longer ask to be masked
again, and the prefix moves less), on every path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_agent_task import TASK, coding_run
from test_cache_aware import agent_run, loop

from ctxwarden import Session, build_context
from ctxwarden.core.messages import Message
from ctxwarden.core.pairing import pairing_problems
from ctxwarden.core.registry.cache_cost import ANTHROPIC, CallPrefix, session_cache_cost
from ctxwarden.pipeline.built import BuiltContext
from ctxwarden.pipeline.policy import Policy
from ctxwarden.steps import window

REQUEST = "Find order 1."


def two_requests() -> list[Message]:
    """A long turn (120 steps of one request), a second request after its 74th step."""
    run = agent_run(120)
    return [*run[:150], Message.user("Now also find order 99.", id="u2"), *run[150:]]


def short_turns() -> list[Message]:
    """A request every ten steps: no turn is long."""
    steps = agent_run(80)
    out = steps[:2]
    for i in range(2, len(steps), 2):
        out += steps[i : i + 2]
        if (i // 2) % 10 == 9:
            out.append(Message.user(f"Next, order {i}.", id=f"u{i}"))
    return out


def at_the_request(
    monkeypatch: pytest.MonkeyPatch, run: list[Message], budget: int, policy: Policy | None
) -> list[BuiltContext]:
    """The same loop with every window kept at or before its request (no turn long)."""
    with monkeypatch.context() as m:
        m.setattr(window, "LONG_TURN", 10**9)
        return loop(run, budget, policy)


def cost(builds: list[BuiltContext]) -> float:
    calls = [CallPrefix(b.audit.input_tokens, b.audit.prefix_shared_tokens, False) for b in builds]
    return session_cache_cost(calls, ANTHROPIC).units


def test_the_window_starts_after_a_long_turns_request_which_every_context_keeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = agent_run(120)
    builds = loop(run, 2000)
    for k, built in enumerate(builds):
        sent = [m for m in built.messages if m.role == "user"]
        assert [m.text for m in sent] == [REQUEST], f"build {k}"
        assert built.messages[0].role == "system" and built.input_tokens <= 2000
        assert not pairing_problems(built.messages)
    starts = [b.state.window_start for b in builds]
    assert starts[0] == 1 and starts[-1] > 150  # past the request, near the end
    assert len(run) - 1 - starts[-1] < 60  # the region a build reads: the window's
    assert [b.to_openai() for b in builds] == [
        b.to_openai() for b in at_the_request(monkeypatch, run, 2000, None)
    ]


def test_at_a_tight_budget_the_prefix_moves_less(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window at its request saw the turn's dropped results and masked them again, one
    more each call (59 prefix breaks in 120 calls at 1,500 tokens); past it, 35."""
    run = agent_run(120)
    past, at = loop(run, 1500), at_the_request(monkeypatch, run, 1500, None)
    assert all(b.input_tokens <= 1500 and not pairing_problems(b.messages) for b in past)
    breaks = [sum(b.audit.prefix_break is not None for b in bs) for bs in (past, at)]
    assert breaks[0] + 10 < breaks[1]
    assert cost(past) < 0.9 * cost(at)


def test_a_short_turn_keeps_the_window_at_its_request() -> None:
    run = short_turns()
    builds = loop(run, 1500)
    ends = [k for k, m in enumerate(run) if m.role == "assistant" and k]
    for k, built in zip(ends, builds, strict=True):
        newest = max(i for i in range(k) if run[i].role == "user")
        assert built.state.window_start <= newest


def test_a_new_request_after_a_long_turn_keeps_the_old_one_until_the_window_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = two_requests()
    builds = loop(run, 2000)
    ends = [k for k, m in enumerate(run) if m.role == "assistant" and k]
    after = next(i for i, k in enumerate(ends) if k > 150)
    assert builds[after - 1].state.window_start > 1  # the window had passed the request
    first = builds[after]
    assert first.audit.prefix_break is None  # appended to, not rewritten
    assert [m.id for m in first.messages if m.role == "user"][-1] == "u2"
    assert any(m.text == REQUEST for m in first.messages)
    assert [b.to_openai() for b in builds] == [
        b.to_openai() for b in at_the_request(monkeypatch, run, 2000, None)
    ]


@pytest.mark.parametrize("budget", [4000, 8000])
def test_the_agents_task_through_a_long_turn(monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
    """With ``window.task_share`` the task is cut once the window moves, pinned as the
    request the window passed, and the contexts are a window's at the request."""
    run = coding_run(120, corrections=(70, 100))
    builds = loop(run, budget, TASK)
    assert any(b.state.window_start > 1 for b in builds[:70])
    assert all(any(m.id == "m1" for m in b.messages) for b in builds)
    assert [b.to_openai() for b in builds] == [
        b.to_openai() for b in at_the_request(monkeypatch, run, budget, TASK)
    ]


@pytest.mark.parametrize("budget", [1500, 2000])
def test_a_session_builds_the_same_contexts_over_a_long_turn(tmp_path: Path, budget: int) -> None:
    run = two_requests()
    url = f"sqlite:///{tmp_path / 's.db'}"
    previous = None
    passed = 0
    with Session(url, "agent") as s:
        s.append(run[:2])
        for k in range(2, len(run)):
            if run[k].role == "assistant":
                built = s.build(max_input_tokens=budget)
                previous = build_context(run[:k], "gpt-4o", budget, previous=previous)
                assert built.to_openai() == previous.to_openai(), f"message {k}"
                passed += previous.state.window_start > 1 and k < 150
            s.append([run[k]])
    assert passed > 20


def test_a_build_looks_for_the_newest_request_only_among_the_new_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The previous build's window memo says where the newest user message was: a build
    after it walks back only through the messages that came since (a one-request run was
    walked back to its request at every call), and finds a new request among them."""
    run = two_requests()
    full = loop(run, 1_500)
    starts: list[int] = []
    real = window.newest_user

    def walked(history: list[Message], start: int, end: int | None = None) -> int | None:
        if end is None:  # (a window reopening at the request before walks to it: not this)
            starts.append(len(history) - start)
        return real(history, start, end)

    monkeypatch.setattr(window, "newest_user", walked)
    kept = loop(run, 1_500)
    assert [b.to_openai() for b in kept] == [b.to_openai() for b in full]
    assert len(run) > 200 and max(starts) <= 3  # a call, its result, a request: not the run
    at = next(i for i, m in enumerate(run) if m.id == "u2")
    built = build_context(run[: at + 1], "gpt-4o", 1_500, previous=kept[74].state)
    assert any(m.id == "u2" for m in built.messages)
    assert built.to_openai() == build_context(run[: at + 1], "gpt-4o", 1_500,
                                              previous=full[74].state).to_openai()  # fmt: skip
