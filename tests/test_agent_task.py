"""The agent run's task stays in the context (steps.task, steps.window.agent_task).

A coding agent's run opens with one long task; a later user message (a harness's "provide
exactly one action", a short follow-up) lets the window start after it, and the task leaves
the context (31% of the swebench-mini builds at 8,000 tokens). With ``window.task_share``
(off by default) the task is a pin: whole while it is the newest user message, cut to its
share of the budget (head and tail, with its handle) when a later request's window must
move, in the pinned layer once the window passes it; every path keeps the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cache_aware import order_questions

from ctxwarden import Session, build_context
from ctxwarden.core.errors import ConfigError
from ctxwarden.core.handles import handle_for
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.pipeline.built import BuiltContext
from ctxwarden.pipeline.policy import Policy, WindowConfig
from ctxwarden.steps.window import agent_task

BUDGET = 4000
TASK = Policy(window=WindowConfig(task_share=1 / 16))
CORRECTION = "Please always provide EXACTLY ONE action in triple backticks, found 2 actions."
TASK_HEAD = "Fix issue PRJ-4471: the CSV exporter drops the trailing comma of empty fields."
TASK_TAIL = "Reply with exactly one bash command per message, in triple backticks."


def task_text() -> str:
    """A task of ~1,700 tokens: the issue first, the harness's rules last."""
    body = "\n".join(
        f"Step {i}: the exporter in module export_{i}.py writes row {i} without its "
        f"last separator when field_{i} is empty, see ticket note {i}."
        for i in range(60)
    )
    return f"{TASK_HEAD}\n{body}\n{TASK_TAIL}"


def coding_run(rounds: int = 40, corrections: tuple[int, ...] = (12, 24, 30)) -> list[Message]:
    """system, the task, then bash calls with ~250-token results; after the rounds in
    ``corrections`` the model answers with text and the harness repeats one message word
    for word (as swebench's harness does)."""
    out = [Message.system("You are a coding agent with a bash tool.", id="m0")]
    out.append(Message.user(task_text(), id="m1"))
    for r in range(rounds):
        if r in corrections:
            out.append(Message.assistant(f"I will run two commands now ({r}).", id=f"x{r}"))
            out.append(Message.user(CORRECTION, id=f"u{r}"))
        call = ToolCall(f"c{r}", "bash", json.dumps({"command": f"cat src/export_{r}.py"}))
        out.append(Message.assistant("", (call,), id=f"a{r}"))
        lines = "\n".join(f"def write_{r}_{j}(row): return sep_{r}_{j}(row)" for j in range(25))
        out.append(Message.tool(lines, f"c{r}", id=f"t{r}"))
    out.append(Message.assistant("Done.", id="end"))
    return out


def loop(history: list[Message], budget: int, policy: Policy | None = None) -> list[BuiltContext]:
    """A build before every assistant message, each given the one before."""
    builds: list[BuiltContext] = []
    previous = None
    for k, m in enumerate(history):
        if m.role == "assistant" and k:
            previous = build_context(
                history[:k], "gpt-4o", budget, policy=policy, previous=previous
            )
            builds.append(previous)
    return builds


def task_in(built: BuiltContext) -> Message | None:
    return next((m for m in built.messages if m.id == "m1"), None)


# -- which message is the task --------------------------------------------------------------


def test_the_task_is_the_first_user_message_the_model_answered_with_a_tool_call() -> None:
    run = coding_run(3, ())
    assert agent_task(run, 1) == 1
    call = Message.assistant("", (ToolCall("c", "f", "{}"),))
    chat = [Message.system("s"), Message.user("hi"), Message.assistant("hello"),
            Message.user("book a flight"), call]  # fmt: skip
    assert agent_task(chat, 1) is None  # the first answer was text: a conversation
    greeted = [Message.assistant("How can I help?"), Message.user("fix it"),
               Message.assistant("", (ToolCall("c", "bash", "{}"),))]  # fmt: skip
    assert agent_task(greeted, 0) == 1
    assert agent_task([Message.system("s"), Message.user("fix it")], 1) is None  # no answer yet


# -- kept, then cut ---------------------------------------------------------------------------


def test_the_task_stays_after_a_later_user_message_and_is_cut_once_the_window_moves() -> None:
    run = coding_run()
    counter = TokenCounter.for_model("gpt-4o")
    whole = counter.count_message(run[1])
    share = int(BUDGET * TASK.window.task_share)
    assert whole > 4 * share
    builds = loop(run, BUDGET, TASK)
    cut_at = next(i for i, b in enumerate(builds) if (t := task_in(b)) and t.text != run[1].text)
    for i, built in enumerate(builds):
        task = task_in(built)
        assert task is not None, f"build {i}: the task left the context"
        assert built.input_tokens <= BUDGET
        if i < cut_at:
            assert task.text == run[1].text
            continue
        assert task.text.startswith(TASK_HEAD) and task.text.endswith(
            f"[the whole task: {handle_for('m1')}]"
        )
        assert TASK_TAIL in task.text  # head and tail: the issue and the harness's rules
        assert counter.count_message(task) <= share + 10
    first = builds[cut_at]
    assert first.audit.prefix_break is not None  # the cut came with a move of the window
    (action,) = [a for a in first.audit.actions if a.strategy == "task"]
    assert (action.message_id, action.action, action.tokens_before) == ("m1", "truncated", whole)
    assert handle_for("m1") in action.reason and "window.task_share" in action.reason
    # once cut, the same bytes in every later build: the prefix stays cached
    assert len({task_in(b).fingerprint for b in builds[cut_at:]}) == 1  # type: ignore[union-attr]


def test_the_task_is_sent_whole_while_it_is_the_newest_request() -> None:
    """The newest user message is sent as the user wrote it, the task too: with no later
    request the window moves (and, past 64 messages, starts after the task, pinned as
    the request), and every build sends the task whole. (The rule used to cut it at the
    window's first move: the request the model was answering, sent cut.)"""
    run = coding_run(40, ())
    builds = loop(run, BUDGET, TASK)
    for i, built in enumerate(builds):
        task = task_in(built)
        assert task is not None and task.text == run[1].text, f"build {i}"
        assert not any(a.strategy == "task" for a in built.audit.actions)
    assert any(b.audit.prefix_break is not None for b in builds)  # the window moved
    assert any(b.state.window_start > 1 for b in builds)  # and passed the task


def test_a_later_request_does_not_cut_a_task_the_budget_holds() -> None:
    """The task is cut when a later request's window must move, not because a later
    request came: under a budget that holds the whole run nothing moves and nothing is
    cut (the fit had remembered the whole task in the window as a cut one, and cut it at
    the first build after the correction: 4 prefix breaks in a run that needed none)."""
    run = coding_run()
    budget = 20_000
    assert TASK.window.task_share * budget < TokenCounter.for_model("gpt-4o").count_message(run[1])
    builds = loop(run, budget, TASK)
    assert all(b.audit.prefix_break is None for b in builds)
    assert all(task_in(b).text == run[1].text for b in builds)  # type: ignore[union-attr]


def test_without_the_rule_the_task_leaves_after_a_later_user_message() -> None:
    builds = loop(coding_run(), BUDGET)  # the default: off
    assert any(task_in(b) is None for b in builds)
    assert not any(a.strategy == "task" for b in builds for a in b.audit.actions)


def test_nothing_is_cut_while_the_budget_holds_the_whole_run() -> None:
    builds = loop(coding_run(), 60_000, TASK)
    assert all(task_in(b) is not None and task_in(b).text == task_text() for b in builds)  # type: ignore[union-attr]
    assert not any(a.strategy == "task" for b in builds for a in b.audit.actions)


def test_a_conversation_whose_first_answer_is_text_has_no_task() -> None:
    """A support chat (tau-bench's shape): the first user message is not pinned, and the
    builds are the ones the rule-less policy makes."""
    history = [Message.system("You are an airline agent. " * 30, id="s")]
    for i in range(30):
        history.append(Message.user(f"Question {i} about reservation R{i:04d}. " * 6, id=f"u{i}"))
        history.append(Message.assistant(f"Answer {i}: flight HAT{i:03d}. " * 6, id=f"a{i}"))
    ours, plain = loop(history, 1500, TASK), loop(history, 1500)
    assert [b.to_openai() for b in ours] == [b.to_openai() for b in plain]
    assert not any(m.id == "u0" for m in ours[-1].messages)


def test_a_repeated_message_dropped_at_a_compaction_does_not_come_back_while_held() -> None:
    """The harness's correction, word for word five times, in a window whose start a pin
    holds (``pin_first``; the task does the same): an older copy the last compaction
    dropped was taken back between compactions, since the newer copy's digest was in the
    previous context; the context then differed at that copy and compacted on 42 of 66
    calls. Each sent copy now vouches for one message."""
    pinned = Policy(window=WindowConfig(pin_first=1))
    builds = loop(coding_run(60, (10, 20, 30, 40, 50)), 8000, pinned)
    causes = [b.audit.prefix_break.cause for b in builds if b.audit.prefix_break is not None]
    assert causes and not [c for c in causes if c == "the current changed"], causes
    assert len(causes) < len(builds) // 5, causes


# -- every path the same -------------------------------------------------------------------------


def test_a_session_keeps_the_task_as_build_context_does(tmp_path: Path) -> None:
    run = coding_run()
    url = f"sqlite:///{tmp_path / 'task.db'}"
    previous = None
    with Session(url, "agent", policy=TASK) as session:
        session.append(run[:2])
        for k in range(2, len(run)):
            if run[k].role == "assistant":
                built = session.build(max_input_tokens=BUDGET)
                previous = build_context(run[:k], "gpt-4o", BUDGET, previous=previous, policy=TASK)
                assert built.to_openai() == previous.to_openai(), f"message {k}"
            session.append([run[k]])
    # a session stored whole and built cold reads the task from its head: the slice
    # holds only the newest messages, where a later user message answered by a tool call
    # would otherwise be taken for the task
    with Session(url, "imported", policy=TASK) as cold:
        cold.append(run[:-1])
        built = cold.build(max_input_tokens=BUDGET)
        assert cold.recall(handle_for("m1")).content == task_text()  # the handle gives it back
    alone = build_context(run[:-1], "gpt-4o", BUDGET, policy=TASK)
    assert built.to_openai() == alone.to_openai()
    assert task_in(built) is not None and handle_for("m1") in task_in(built).text  # type: ignore[union-attr]


def test_task_share_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"window\.task_share must be in \[0, 1\]"):
        WindowConfig(task_share=1.5)
    policy = Policy.from_toml("[window]\ntask_share = 0.125\n")
    assert policy.window.task_share == 0.125


def test_in_a_run_of_questions_the_first_one_stays_first_and_the_layers_follow_it() -> None:
    """Each question answered with lookups, then text: the first question started tool
    work, so it is the task; it stays first, whole (it is within its share), and the
    ledger goes after it, where its changes leave it cached."""
    out = order_questions()
    builds = loop(out, 1500, TASK)
    assert all(b.messages[1].id == "u0" and b.messages[1].text == out[1].text for b in builds)
    layered = [b for b in builds if "ctxwarden:ledger" in b.layers]
    assert layered and all(b.messages[2].id == "ctxwarden:ledger" for b in layered)
