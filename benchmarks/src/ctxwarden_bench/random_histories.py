"""Random agent histories for invariant sweeps: pins, priorities, parallel calls.

:func:`random_history` draws a conversation from a seed (deterministic): a system prompt,
then user turns, assistant replies and assistant tool calls with one to four parallel
results (JSON records, long search pages, stack traces), some messages pinned or
``critical``, some of high or low priority, and sometimes a pending call at the end.
:func:`check_build` states the invariants every build must hold. The property tests draw
a few hundred seeds; ``python -m ctxwarden_bench.sweep`` draws ten thousand.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.pairing import group_blocks, pairing_problems
from ctxwarden.pipeline.engine import BuiltContext
from ctxwarden.steps.window import newest_call_block, newest_user

__all__ = ["check_build", "random_history"]

_WORDS = tuple(
    [
        "order",
        "refund",
        "flight",
        "seat",
        "baggage",
        "invoice",
        "account",
        "delivery",
        "status",
        "change",
        "cancel",
        "upgrade",
        "payment",
        "card",
        "address",
        "hotel",
        "night",
        "room",
        "price",
        "budget",
        "date",
        "city",
    ]
)


def _sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(n)]
    if rng.random() < 0.5:
        words.append(f"ORD-{rng.randint(100, 99999)}")
    if rng.random() < 0.3:
        words.append(f"{rng.randint(1, 28):02d}.0{rng.randint(1, 9)}.2025")
    return " ".join(words) + "."


def _result(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.6:
        return json.dumps({"id": f"R{rng.randint(1, 9999)}", "status": rng.choice(_WORDS)})
    if kind < 0.85:
        rows = [
            {"id": f"F{i}{rng.randint(10, 99)}", "price": rng.randint(50, 900)}
            for i in range(rng.randint(5, 120))
        ]
        return json.dumps({"results": rows})
    frames = "\n".join(
        f'  File "/usr/lib/python3/lib{i}.py", line {i}, in f{i}' for i in range(rng.randint(3, 60))
    )
    error = f"ValueError: bad order ORD-{rng.randint(1, 999)}"
    return f"Traceback (most recent call last):\n{frames}\n{error}"


def _flags(rng: random.Random) -> dict[str, object]:
    r = rng.random()
    if r < 0.06:
        return {"pinned": True}
    if r < 0.1:
        return {"priority": "critical"}
    if r < 0.2:
        return {"priority": rng.choice(("high", "low"))}
    return {}


def random_history(seed: int, *, max_turns: int = 30) -> list[Message]:
    """A deterministic random history for ``seed``."""
    rng = random.Random(seed)
    out = [Message.system("You are an agent. " + _sentence(rng, rng.randint(5, 200)), id="sys")]
    call = 0
    for t in range(rng.randint(1, max_turns)):
        out.append(Message.user(_sentence(rng, rng.randint(3, 60)), id=f"u{t}", **_flags(rng)))
        for s in range(rng.choice((0, 0, 1, 1, 2, 3))):
            ids = [f"c{call + k}" for k in range(rng.choice((1, 1, 1, 2, 3, 4)))]
            call += len(ids)
            calls = tuple(ToolCall(i, "lookup", json.dumps({"q": i})) for i in ids)
            out.append(Message.assistant(None, tool_calls=calls, id=f"a{t}.{s}", **_flags(rng)))
            for i in ids:
                out.append(Message.tool(_result(rng), tool_call_id=i, id=f"r{i}", **_flags(rng)))  # type: ignore[arg-type]
        out.append(Message.assistant(_sentence(rng, rng.randint(3, 80)), id=f"a{t}", **_flags(rng)))  # type: ignore[arg-type]
    if rng.random() < 0.3:  # the request right after a call
        ids = [f"c{call + k}" for k in range(rng.choice((1, 2)))]
        calls = tuple(ToolCall(i, "lookup", "{}") for i in ids)
        out.append(Message.assistant(None, tool_calls=calls, id="a-last"))
        out.extend(Message.tool(_result(rng), tool_call_id=i, id=f"r{i}") for i in ids)
    return out


def check_build(history: Sequence[Message], built: BuiltContext, budget: int) -> list[str]:
    """Every invariant ``built`` breaks (empty when it holds them all)."""
    problems: list[str] = []
    sent = list(built.messages)
    ids = [m.id for m in sent]
    if built.input_tokens > budget:
        problems.append(f"over budget: {built.input_tokens} > {budget}")
    if pairing_problems(sent):
        problems.append("pairs split: " + pairing_problems(sent)[0].describe())
    if len(set(ids)) != len(ids):
        problems.append("a message appears twice")
    if history and history[0].role == "system" and (not sent or sent[0].id != history[0].id):
        problems.append("the system prompt is not first")
    newest = newest_user(history, 0)
    if newest is not None and history[newest].id not in ids:
        problems.append("the newest user message is missing")
    block = newest_call_block(history, newest if newest is not None else -1)
    complete = block and all(b.sendable for b in group_blocks([history[i] for i in block]))
    dropped_loudly = any(w.startswith("newest tool call") for w in built.audit.warnings)
    if complete and not dropped_loudly and not all(history[i].id in ids for i in block):
        problems.append("the newest call block is missing")
    # removed by the last resort, each with a warning: evicted pins, a newest call too big
    evicted = {
        a.message_id
        for a in built.audit.actions
        if a.action == "evicted" or (a.action == "dropped" and a.strategy == "priority")
    }
    pinned = [
        m.id for m in history if (m.pinned or m.priority == "critical") and m.role != "system"
    ]
    lost = [i for i in pinned if i not in ids and i not in evicted]
    rejected = {a.message_id for a in built.audit.actions if a.action == "rejected"}
    if [i for i in lost if i not in rejected]:
        problems.append(f"pinned message(s) silently dropped: {lost[:3]}")
    if any(a.action == "evicted" for a in built.audit.actions) and not any(
        "evicted" in w for w in built.audit.warnings
    ):
        problems.append("a pinned message was evicted without a warning")
    return problems
