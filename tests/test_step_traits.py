"""What a step declares for the engine (issue 38): the engine names no step; it reads
``keeps_pairs``, ``edits_stick`` and ``held`` off the steps, and puts on the StepContext
what the steps let each other foresee (``sent_tokens``, ``reserve``, ``ledger_blocks``)."""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from typing import ClassVar

from ctxwarden import Message, Policy, ToolCall, build_context
from ctxwarden.pipeline import engine
from ctxwarden.pipeline.cascade import DEFAULT_CASCADE, foreseen, steps_for
from ctxwarden.steps.base import (
    Action,
    Draft,
    StepContext,
    StepResult,
    edits_stick,
    held_view,
    keeps_pairs,
)
from ctxwarden.steps.drop_tagged import DropTagged
from ctxwarden.steps.ledger import EntityLedgerBlocks


def test_the_engine_names_no_step() -> None:
    """No string literal of the engine's code is a step's name (the docstrings aside)."""
    tree = ast.parse(inspect.getsource(engine))
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    literals = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    }
    named = literals & {*DEFAULT_CASCADE, "priority"}
    assert not named, f"the engine names step(s) {sorted(named)}"


def test_the_built_in_steps_declare_what_the_engine_needs() -> None:
    steps = {s.name: s for s in steps_for(Policy.from_toml("[tools.lookup]\npin = true\n"))}
    pairs = {name for name, s in steps.items() if keeps_pairs(s)}
    assert pairs == {"layers", "truncate", "mask", "recall", "fit", "priority", "layout"}
    assert [name for name, s in steps.items() if not edits_stick(s)] == ["priority"]
    assert [name for name, s in steps.items() if held_view(s) is not None] == ["layers"]
    # a user's step declares nothing, and gets the safe defaults
    mine = DropTagged("debug")
    assert not keeps_pairs(mine) and edits_stick(mine) and held_view(mine) is None


def test_what_the_steps_foresee_is_gathered_from_them() -> None:
    seen = foreseen(steps_for(Policy()))
    assert seen.sent is not None and seen.reserve is not None
    assert isinstance(seen.ledger, EntityLedgerBlocks)
    off = foreseen(steps_for(Policy.from_toml("truncate = false\nrecall = false\n")))
    assert off.sent is None and off.reserve is None and off.ledger is not None


@dataclass(frozen=True)
class _Reserving:
    """A user's step that adds a block of its own after the editing steps: it declares
    the room it takes, and the newest results leave it that room."""

    tokens: int
    name: str = "reserving"

    def reserve(self, draft: Draft, ctx: StepContext) -> int:
        return self.tokens

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        return StepResult(draft)


def _newest_result_loop() -> list[Message]:
    call = ToolCall("c1", "read_file", '{"path": "src/app.py"}')
    listing = "\n".join(f"def handler_{i}(request):\n    return {i}" for i in range(400))
    return [
        Message.system("You are a coding agent."),
        Message.user("Read src/app.py and tell me what handler_7 returns."),
        Message.assistant(None, tool_calls=(call,)),
        Message.tool(listing, tool_call_id="c1"),
    ]


def test_a_step_s_declared_reserve_is_left_by_the_newest_results() -> None:
    history = _newest_result_loop()
    whole = build_context(history, "gpt-4o", 8000)
    sent = next(m for m in whole.messages if m.role == "tool")
    assert sent.text == history[3].text  # it fits: sent whole
    tokens = whole.audit.input_tokens
    policy = Policy(steps=(_Reserving(8000 - tokens + 200),))
    cut = build_context(history, "gpt-4o", 8000, policy=policy)
    (action,) = [a for a in cut.audit.actions if a.action == "truncated"]
    assert action.reason.startswith("newest code tool result, not answered yet")


@dataclass(frozen=True)
class _Cutting:
    """A user's step that cuts the first tool result it sees to its first line."""

    sticks: bool
    name: str = "cutting"
    keeps_pairs: ClassVar[bool] = True

    @property
    def edits_stick(self) -> bool:
        return self.sticks

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        window = list(draft.window)
        for i, m in enumerate(window):
            if m.role == "tool":
                window[i] = m.with_content(m.text.splitlines()[0])
                before, after = ctx.count(m), ctx.count(window[i])
                action = Action(m.id, "truncated", "first line", before, after, self.name)
                return StepResult(draft.but(window=tuple(window)), (action,))
        return StepResult(draft)


def test_a_step_that_declares_its_edits_do_not_stick_leaves_no_sticky_decision() -> None:
    call = ToolCall("c1", "ls", "{}")
    result = Message.tool("\n".join(f"file_{i}.py" for i in range(20)), tool_call_id="c1")
    history = [
        Message.system("You are a coding agent."),
        Message.user("List the files."),
        Message.assistant(None, tool_calls=(call,)),
        result,
        Message.assistant("Twenty files."),
    ]
    sticky = build_context(history, "gpt-4o", 8000, policy=Policy(steps=(_Cutting(True),)))
    assert sticky.state.sticky == {result.id: "truncated"}
    once = build_context(history, "gpt-4o", 8000, policy=Policy(steps=(_Cutting(False),)))
    assert once.state.sticky == {}
    assert [a.action for a in once.audit.actions] == ["truncated"]
    assert [m.text for m in once.messages] == [m.text for m in sticky.messages]
