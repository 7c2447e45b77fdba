"""The editing steps' fast paths give what the plain per-message rules give.

Truncation skips everything but tool results without calling its per-message rule, and
masking's over-budget test builds the masked window without its actions: on random agent
histories both must match the plain computation exactly.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.steps.base import StrategyContext
from ctxwarden.steps.mask import MaskObservations
from ctxwarden.steps.truncate import TruncateToolResults
from ctxwarden_bench.random_histories import random_history

COUNTER = TokenCounter.for_model("gpt-4o")


def _ctx(budget: int = 1_000_000) -> StrategyContext:
    return StrategyContext(
        count=COUNTER.count_message,
        budget=budget,
        total=lambda ms: COUNTER.count_messages(ms).tokens,
        count_text=COUNTER.count_text,
    )


def _requests(history: list[Message]) -> dict[str, Message]:
    return {c.id: m for m in history for c in m.tool_calls}


@pytest.mark.parametrize("seed", range(40))
def test_truncation_equals_the_per_message_rule(seed: int) -> None:
    history = random_history(seed)
    strategy = TruncateToolResults(threshold_tokens=60, target_tokens=40)
    out = strategy(history, _ctx()).messages
    requests = _requests(history)
    assert len(out) == len(history)
    for before, after in zip(history, out, strict=True):
        if before.role != "tool":
            assert after is before
            continue
        request = requests.get(before.tool_call_id or "")
        expected = strategy.truncate(before, COUNTER.count_message, COUNTER.count_text, request)
        assert after.content == expected.content
        assert after.meta == expected.meta


@pytest.mark.parametrize("seed", range(40))
def test_mask_without_actions_masks_alike(seed: int) -> None:
    history = random_history(seed)
    strategy = MaskObservations(keep_last=1, min_tokens=1)
    rng = random.Random(seed)
    results = [i for i, m in enumerate(history) if m.role == "tool"]
    chosen = {i for i in results if rng.random() < 0.6}
    recorded, actions = strategy._apply(history, chosen, _ctx())
    bare, none = strategy._apply(history, chosen, _ctx(), record=False)
    assert [m.content for m in bare] == [m.content for m in recorded]
    assert none == []
    assert {a.message_id for a in actions} <= {history[i].id for i in chosen}


@pytest.mark.parametrize("seed", range(40))
def test_flush_over_budget_masks_every_maskable_result(seed: int) -> None:
    history = random_history(seed)
    strategy = MaskObservations(keep_last=1, min_tokens=1, batch_tokens=10_000)
    total = COUNTER.count_messages(history).tokens
    tight = strategy(history, _ctx(budget=max(total // 4, 1)))
    results = [i for i, m in enumerate(history) if m.role == "tool"][:-1]
    eligible = [i for i in results if not history[i].pinned and history[i].priority != "critical"]
    smaller = {
        history[i].id
        for i in eligible
        if strategy._apply(history, {i}, _ctx(), record=False)[0][i] is not history[i]
    }
    assert {a.message_id for a in tight.actions} == smaller


def test_a_reused_action_is_the_action_and_logs_alike() -> None:
    import json
    from dataclasses import asdict

    from ctxwarden.session.build_log import _action_text
    from ctxwarden.steps.base import Action, same_action

    first = same_action("m1", "masked", "old result", 30, 9, "mask")
    assert first == Action("m1", "masked", "old result", 30, 9, "mask")
    assert same_action("m1", "masked", "old result", 30, 9, "mask") is first
    as_float = same_action("m1", "masked", "old result", 30.0, 9, "mask")  # type: ignore[arg-type]
    assert as_float is not first
    for action in (first, as_float, first, as_float):  # the second time from the action
        assert _action_text(action) == json.dumps(asdict(action), ensure_ascii=False)
    assert '"tokens_before": 30.0' in _action_text(as_float)


def _fresh(history: list[Message]) -> list[Message]:
    """Equal messages that are new objects (nothing kept on them), requests included."""
    from dataclasses import replace

    return [replace(m) for m in history]


@pytest.mark.parametrize("seed", range(20))
def test_truncation_kept_on_the_messages_is_what_computing_it_gives(seed: int) -> None:
    """A build after a build reuses each result's kept outcome; another configuration, a
    request that is another object, or fresh messages give what computing gives."""
    history = random_history(seed)
    strategy = TruncateToolResults(threshold_tokens=60, target_tokens=40)
    first = strategy(history, _ctx())
    again = strategy(history, _ctx())  # the kept outcomes
    fresh = strategy(_fresh(history), _ctx())
    for result in (again, fresh):
        assert [m.content for m in result.messages] == [m.content for m in first.messages]
        assert [m.meta for m in result.messages] == [m.meta for m in first.messages]
        assert result.actions == first.actions
    assert all(a is b for a, b in zip(again.messages, first.messages, strict=True))
    other = TruncateToolResults(threshold_tokens=30, target_tokens=20)
    assert other(history, _ctx()).messages == other(_fresh(history), _ctx()).messages
    moved = [m if m.role != "assistant" else replace_text(m) for m in history]
    assert strategy(moved, _ctx()).messages == strategy(_fresh(moved), _ctx()).messages


def replace_text(message: Message) -> Message:
    """The assistant message as another object with other text (other request terms)."""
    return message.with_content(f"{message.text} lookup ORD-{len(message.text)} src/x.py")


def test_a_result_kept_for_one_request_is_cut_again_for_another() -> None:
    from ctxwarden.core.messages import ToolCall
    from ctxwarden.session.recall import RECALL_TOOL_NAME

    lines = [f"{i:04d} INFO worker heartbeat ok, queue depth {i % 7}" for i in range(400)]
    result = Message.tool("\n".join(lines), "c1", id="r1")

    def asked(tool: str) -> Message:
        return Message.assistant(None, [ToolCall("c1", tool, '{"q": "x"}')])

    strategy = TruncateToolResults(threshold_tokens=200, target_tokens=80)
    cut = strategy([asked("grep_logs"), result], _ctx()).messages[1]
    assert cut is not result  # kept on ``result`` for this request
    again = strategy([asked(RECALL_TOOL_NAME), result], _ctx()).messages[1]
    assert again is result  # a recalled original is never cut again


def _order_one_at_a_time(draft: Any, head: int) -> tuple[list[Message], dict[str, str]]:
    """The layout's order placing one window message at a time, as ``layout._order``
    did before it placed the window in runs (the reference it must equal)."""
    layer_of = {m.id: "system" for m in draft.system}
    ordered = list(draft.system)
    recall = [m for n, m in draft.layers if n == "recall"]
    others = [(n, m) for n, m in draft.layers if n not in ("facts", "recall")]
    ledger = [("ledger", m) for m in (draft.ledger_base, draft.ledger) if m is not None]
    facts = [(n, m) for n, m in draft.layers if n == "facts"]
    after = [*others, *ledger]
    for name, m in facts if head else [*others, *facts, *ledger]:
        ordered.append(m)
        layer_of[m.id] = name
    for m in draft.pinned_messages:
        ordered.append(m)
        layer_of[m.id] = "pinned"
    newest = draft.history[draft.newest].id if draft.newest is not None else None
    current = False
    for i, m in enumerate(draft.window):
        if not current and m.id == newest:
            for r in recall:
                ordered.append(r)
                layer_of[r.id] = "recall"
        current = current or m.id == newest
        ordered.append(m)
        layer_of[m.id] = "current" if current else "window"
        if i + 1 == head:
            for name, layer in after:
                ordered.append(layer)
                layer_of[layer.id] = name
    return ordered, layer_of


def test_the_layout_order_in_runs_equals_one_message_at_a_time() -> None:
    """``layout._order`` (the window placed in runs) gives the order and the layers, in
    the same insertion order, of placing one message at a time: random windows, newest
    user messages in or out of them, repeated ids, layers after the first message."""
    from types import SimpleNamespace

    from ctxwarden.steps.layout import _order

    rng = random.Random(5)
    for _ in range(2000):
        n = rng.randrange(0, 7)
        ids = [f"m{rng.randrange(5)}" if rng.random() < 0.2 else f"m{i}" for i in range(n)]
        history = [Message.user(f"u{i}", id=ids[i]) for i in range(n)]
        names = ("facts", "recall", "summary")
        layers = [(rng.choice(names), Message.user("l", id=f"l{j}")) for j in range(3)]
        draft = SimpleNamespace(
            system=(Message.system("s", id="s"),),
            layers=tuple(layers[: rng.randrange(4)]),
            ledger_base=None,
            ledger=Message.user("ledger", id="led") if rng.random() < 0.5 else None,
            pinned_messages=(),
            pinned=(),
            task=None,
            history=history,
            newest=rng.choice([None, *range(n)]),
            window=tuple(history[rng.randrange(n + 1) :]),
        )
        for head in (0, 1, 2):
            want, got = _order_one_at_a_time(draft, head), _order(draft, head)  # type: ignore[arg-type]
            assert [m.id for m in got[0]] == [m.id for m in want[0]]
            assert list(got[1].items()) == list(want[1].items())


def test_the_ledger_render_key_hashes_the_bytes_of_one_message_at_a_time() -> None:
    """``ledger._render_key`` hashes its parts joined: the digest of hashing each message
    in turn (ids with a lone surrogate too), and a different one for another id."""
    import hashlib

    from ctxwarden.steps.ledger import _render_key

    history = [Message.user(f"text {i}", id=f"m{i}") for i in range(6)]
    edited = [Message.tool("cut", "c1", id="t\ud800x"), history[4]]
    shown = history[2:4]

    h = hashlib.sha1(usedforsecurity=False)
    for m in shown:
        h.update(f"{m.fingerprint}|".encode())
    h.update(f"3|500|gpt-4o|{','.join(map(str, [0, 1]))}|".encode())
    h.update(history[2].fingerprint.encode())
    for m in edited:
        h.update(f"|{m.id}:{m.fingerprint}".encode("utf-8", "surrogatepass"))
    assert _render_key(history, 3, [0, 1], edited, 500, "gpt-4o", shown) == h.hexdigest()
    other = [edited[0], history[5]]
    assert _render_key(history, 3, [0, 1], other, 500, "gpt-4o", shown) != h.hexdigest()
